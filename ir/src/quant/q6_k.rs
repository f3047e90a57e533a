//! Q6_K: super-blocks of 256 values in 16 sub-blocks of 16, each with a signed 8-bit scale
//! relative to the super-block's f16 `d`; values are 6-bit, stored as a low nibble (`ql`)
//! and 2 high bits (`qh`), offset by 32. Element = d * scale[s] * (q - 32).
use super::fit;
use half::f16;

ds4_macros::quant_type! {
    ggml: Q6K,
    block: 256,
    sub_block: 16,
    layout {
        ql: [u8; 128] @ 0,
        qh: [u8; 64] @ 128,
        scales: [i8; 16] @ 192,
        d: f16 @ 208,
    }
    dequant(s, j) {
        let dl = (d as f32) * (scales[s] as f32);
        // Each 128-value half uses 64 bytes of ql (low nibbles, then high nibbles) and
        // 32 bytes of qh (four 2-bit planes).
        let h = s / 8;
        let r = s % 8;
        let lo = (ql[h * 64 + (r % 4) * 16 + j] >> (4 * (r / 4))) & 0xF;
        let hi = (qh[h * 32 + (r % 2) * 16 + j] >> (2 * (r / 2))) & 3;
        let q = ((lo | (hi << 4)) as i8) - 32;
        dl * (q as f32)
    }
    quantize: quantize_block,
}

/// Fit each sub-block's scale (levels -32..=31), quantize the scales to i8 against the
/// super-block's f16 `d`, then round the values against the scale the decoder will use.
fn quantize_block(x: &[f32; 256]) -> Block {
    let mut fits = [0f32; 16];
    for (s, f) in fits.iter_mut().enumerate() {
        *f = fit::fit_symmetric(&x[s * 16..(s + 1) * 16], 32, 31);
    }
    let max = fits.iter().fold(0f32, |m, f| m.max(f.abs()));
    let d = f16::from_f32(max / 127.0);
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    let mut scales = [0i8; 16];
    for (s, &scale) in fits.iter().enumerate() {
        let sc = if d.to_f32() > 0.0 { fit::round_clamp(scale / d.to_f32(), -127, 127) as i8 } else { 0 };
        scales[s] = sc;
        let dl = d.to_f32() * sc as f32;
        let (h, r) = (s / 8, s % 8);
        for j in 0..16 {
            let q = if dl != 0.0 { fit::round_clamp(x[s * 16 + j] / dl, -32, 31) } else { 0 };
            let q = (q + 32) as u8;
            ql[h * 64 + (r % 4) * 16 + j] |= (q & 0xF) << (4 * (r / 4));
            qh[h * 32 + (r % 2) * 16 + j] |= (q >> 4) << (2 * (r / 2));
        }
    }
    Block { ql, qh, scales, d }
}
