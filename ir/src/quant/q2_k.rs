//! Q2_K: super-blocks of 256 values in 16 sub-blocks of 16. Each sub-block has a 4-bit
//! scale and a 4-bit min (one byte), relative to the super-block's f16 `d` and `dmin`;
//! values are 2-bit. Element = d * scale[s] * q - dmin * min[s].
use super::fit;
use half::f16;

ds4_macros::quant_type! {
    ggml: Q2K,
    block: 256,
    sub_block: 16,
    layout {
        scales: [u8; 16] @ 0,
        qs: [u8; 64] @ 16,
        d: f16 @ 80,
        dmin: f16 @ 82,
    }
    dequant(s, j) {
        let dl = (d as f32) * ((scales[s] & 0xF) as f32);
        let ml = (dmin as f32) * ((scales[s] >> 4) as f32);
        // Each half of the block (8 sub-blocks) lives in 32 bytes, four 2-bit planes deep:
        // sub-blocks 2p and 2p+1 are plane p, in bytes 0..16 and 16..32.
        let q = (qs[(s / 8) * 32 + (s % 2) * 16 + j] >> (2 * ((s % 8) / 2))) & 3;
        dl * (q as f32) - ml
    }
    quantize: quantize_block,
}

/// Fit each sub-block's scale and min, quantize them to 4 bits against the super-block's
/// f16 `d`/`dmin`, then round the values against the scale and min the decoder will use.
fn quantize_block(x: &[f32; 256]) -> Block {
    let mut fits = [(0f32, 0f32); 16];
    for (s, f) in fits.iter_mut().enumerate() {
        *f = fit::fit_affine(&x[s * 16..(s + 1) * 16], 3);
    }
    let max_scale = fits.iter().fold(0f32, |m, f| m.max(f.0));
    let max_min = fits.iter().fold(0f32, |m, f| m.max(f.1));
    let d = f16::from_f32(max_scale / 15.0);
    let dmin = f16::from_f32(max_min / 15.0);
    let code = |v: f32, unit: f16| if unit.to_f32() > 0.0 { fit::round_clamp(v / unit.to_f32(), 0, 15) } else { 0 };

    let mut scales = [0u8; 16];
    let mut qs = [0u8; 64];
    for (s, &(scale, min)) in fits.iter().enumerate() {
        let xs = &x[s * 16..(s + 1) * 16];
        let (sc, m) = fit::refine_affine_codes(xs, d.to_f32(), dmin.to_f32(), code(scale, d), code(min, dmin), 15, 3);
        scales[s] = sc | (m << 4);
        let dl = d.to_f32() * sc as f32;
        let ml = dmin.to_f32() * m as f32;
        for j in 0..16 {
            let q = if dl > 0.0 { fit::round_clamp((x[s * 16 + j] + ml) / dl, 0, 3) as u8 } else { 0 };
            qs[(s / 8) * 32 + (s % 2) * 16 + j] |= q << (2 * ((s % 8) / 2));
        }
    }
    Block { scales, qs, d, dmin }
}
