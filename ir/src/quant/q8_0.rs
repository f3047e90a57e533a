//! Q8_0: blocks of 32 signed bytes sharing one f16 scale. Element = d * q.
use half::f16;

ds4_macros::quant_type! {
    ggml: Q8_0,
    block: 32,
    sub_block: 32,
    layout {
        d: f16 @ 0,
        qs: [i8; 32] @ 2,
    }
    dequant(s, j) {
        let d32 = d as f32;
        (qs[j] as f32) * d32
    }
    quantize: quantize_block,
}

/// gguf's (and ggml's reference) Q8_0 quantizer, reproduced bit for bit: scale from the
/// f32 absolute maximum, reciprocal of the *unrounded* scale, round half away from zero.
pub(super) fn quantize_block(x: &[f32; 32]) -> Block {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    Block { d: f16::from_f32(d), qs: x.map(|v| (v * id).round() as i8) }
}
