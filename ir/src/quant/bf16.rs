//! BF16: the top 16 bits of an f32.
ds4_macros::quant_type! {
    ggml: Bf16,
    block: 1,
    layout {
        b: u16 @ 0,
    }
    dequant(s, j) {
        f32::from_bits((b as u32) << 16)
    }
    quantize: quantize_block,
}

/// Round to nearest even on the dropped 16 bits; NaNs stay NaN (made quiet), as
/// `ggml_compute_fp32_to_bf16` and gguf's BF16 quantizer do.
fn quantize_block(x: &[f32; 1]) -> Block {
    let n = x[0].to_bits();
    let b = if n & 0x7fff_ffff > 0x7f80_0000 {
        ((n >> 16) | 0x40) as u16
    } else {
        // In u64 so that rounding the largest negative values up carries out harmlessly.
        ((n as u64 + 0x7fff + ((n as u64 >> 16) & 1)) >> 16) as u16
    };
    Block { b }
}
