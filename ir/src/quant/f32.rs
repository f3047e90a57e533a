//! F32: one little-endian f32 per element (a "block" of one).
ds4_macros::quant_type! {
    ggml: F32,
    block: 1,
    layout {
        v: f32 @ 0,
    }
    dequant(s, j) {
        v
    }
    quantize: quantize_block,
}

fn quantize_block(x: &[f32; 1]) -> Block {
    Block { v: x[0] }
}
