//! F16: one IEEE binary16 per element.
use half::f16;

ds4_macros::quant_type! {
    ggml: F16,
    block: 1,
    layout {
        h: f16 @ 0,
    }
    dequant(s, j) {
        h as f32
    }
    quantize: quantize_block,
}

/// Round to nearest even, overflowing to infinity (as numpy's `astype(float16)`).
fn quantize_block(x: &[f32; 1]) -> Block {
    Block { h: f16::from_f32(x[0]) }
}
