//! MXFP4 (OCP microscaling): blocks of 32 FP4 (E2M1) values sharing one E8M0 exponent.
//! Values are stored doubled in KVALUES and the scale halved, as ggml does, so every
//! product is exact. Element = 2^(e - 128) * KVALUES[nibble].
ds4_macros::quant_type! {
    ggml: Mxfp4,
    block: 32,
    // Sub-block 0: the low nibbles of qs; sub-block 1: the high nibbles.
    sub_block: 16,
    layout {
        e: u8 @ 0,
        qs: [u8; 16] @ 1,
    }
    tables {
        KVALUES: [i8; 16],
    }
    dequant(s, j) {
        // 2^(e - 128) as an f32: a subnormal for e < 2, else exponent field e - 1.
        let d = if e < 2 { f32::from_bits(0x0020_0000u32 << e) } else { f32::from_bits(((e as u32) - 1) << 23) };
        let q = (qs[j] >> (4 * s)) & 0xF;
        // KVALUES[q], computed (a table lookup per value does not vectorize): the code's
        // low 3 bits m give 0, 1, 2, 3, 4, 6, 8, 12; bit 3 is the sign.
        let m = (q & 7) as i8;
        let odd = m & 1;
        let mag = if m < 4 { m } else { if m < 6 { 4 + 2 * odd } else { 8 + 4 * odd } };
        let v = if q >= 8 { -mag } else { mag };
        d * (v as f32)
    }
    quantize: quantize_block,
}

/// The 16 E2M1 values, doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The scale `2^(e - 128)` (half the E8M0 value, matching the doubled KVALUES).
fn half_scale(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000u32 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// gguf's MXFP4 quantizer, reproduced byte for byte: exponent `floor(log2(amax)) - 2`
/// (so amax lands in 4..8 times the E8M0 scale, within FP4's 6), then for each value the
/// nearest of the 16 codes, the first one on ties (which keeps +0 for zero).
fn quantize_block(x: &[f32; 32]) -> Block {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    // numpy computes log2 in f32; log2 in f64 rounded to f32 gives the same (correctly
    // rounded) value, including its rounding up to an integer just below a power of two.
    let e = if amax > 0.0 { (((amax as f64).log2() as f32).floor() - 2.0 + 127.0) as u8 } else { 0 };
    let d = half_scale(e);
    let code = |v: f32| -> u8 {
        let mut best = (0u8, f32::INFINITY);
        for (k, &q) in KVALUES.iter().enumerate() {
            let err = (d * q as f32 - v).abs();
            if err < best.1 {
                best = (k as u8, err);
            }
        }
        best.0
    };
    let qs = std::array::from_fn(|j| code(x[j]) | (code(x[j + 16]) << 4));
    Block { e, qs }
}
