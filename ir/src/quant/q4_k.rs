//! Q4_K: super-blocks of 256 values in 8 sub-blocks of 32. Each sub-block has a 6-bit
//! scale and a 6-bit min, relative to the super-block's f16 `d` and `dmin`; values are
//! 4-bit. Element = d * scale[s] * q - dmin * min[s].
use super::fit;
use half::f16;

ds4_macros::quant_type! {
    ggml: Q4K,
    block: 256,
    sub_block: 32,
    layout {
        d: f16 @ 0,
        dmin: f16 @ 2,
        scales: [u8; 12] @ 4,
        qs: [u8; 128] @ 16,
    }
    dequant(s, j) {
        // The 6-bit scales and mins are packed in 12 bytes: sub-blocks 0..4 keep theirs in
        // the low 6 bits of bytes 0..4 (scale) and 4..8 (min); sub-blocks 4..8 split theirs
        // into a low nibble in bytes 8..12 and the top 2 bits in bytes 0..8's spare bits.
        let k = s % 4;
        let sc = if s < 4 { scales[s] & 63 } else { (scales[s + 4] & 0xF) | ((scales[k] >> 6) << 4) };
        let m = if s < 4 { scales[s + 4] & 63 } else { (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4) };
        let dl = (d as f32) * (sc as f32);
        let ml = (dmin as f32) * (m as f32);
        // Sub-blocks 2c and 2c+1 share 32 bytes: low nibbles, then high nibbles.
        let q = (qs[(s / 2) * 32 + j] >> (4 * (s % 2))) & 0xF;
        dl * (q as f32) - ml
    }
    quantize: quantize_block,
}

/// Fit each sub-block's scale and min, quantize them to 6 bits against the super-block's
/// f16 `d`/`dmin`, then round the values against the scale and min the decoder will use.
fn quantize_block(x: &[f32; 256]) -> Block {
    let mut fits = [(0f32, 0f32); 8];
    for (s, f) in fits.iter_mut().enumerate() {
        *f = fit::fit_affine(&x[s * 32..(s + 1) * 32], 15);
    }
    let max_scale = fits.iter().fold(0f32, |m, f| m.max(f.0));
    let max_min = fits.iter().fold(0f32, |m, f| m.max(f.1));
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    let code = |v: f32, unit: f16| if unit.to_f32() > 0.0 { fit::round_clamp(v / unit.to_f32(), 0, 63) } else { 0 };

    let mut scales = [0u8; 12];
    let mut qs = [0u8; 128];
    for (s, &(scale, min)) in fits.iter().enumerate() {
        let xs = &x[s * 32..(s + 1) * 32];
        let (sc, m) = fit::refine_affine_codes(xs, d.to_f32(), dmin.to_f32(), code(scale, d), code(min, dmin), 63, 15);
        if s < 4 {
            scales[s] |= sc;
            scales[s + 4] |= m;
        } else {
            scales[s + 4] = (sc & 0xF) | ((m & 0xF) << 4);
            scales[s - 4] |= (sc >> 4) << 6;
            scales[s] |= (m >> 4) << 6;
        }
        // Exactly the decoder's arithmetic for this sub-block's scale and min.
        let dl = d.to_f32() * sc as f32;
        let ml = dmin.to_f32() * m as f32;
        for j in 0..32 {
            let q = if dl > 0.0 { fit::round_clamp((x[s * 32 + j] + ml) / dl, 0, 15) as u8 } else { 0 };
            qs[(s / 2) * 32 + j] |= q << (4 * (s % 2));
        }
    }
    Block { d, dmin, scales, qs }
}
