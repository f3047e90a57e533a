//! Scale fitting shared by the quantizers of the K-quants (Q2_K, Q4_K, Q6_K).
//!
//! These choose the *real-valued* scale (and offset) of one sub-block; each type's
//! quantizer then rounds them to its integer scale codes and re-rounds the values against
//! the scale the decoder will actually use. The method: try a few candidate scales around
//! the obvious one (range / levels), round every value for each, re-fit the scale (and
//! offset) by least squares for that rounding, keep the smallest squared error.
//! Unweighted: ds4 measures quantization error as plain RMSE.

/// How many candidate scales either side of the obvious one, and their spacing (in
/// quantization levels added to the range).
const STEPS: i32 = 12;
const STEP: f32 = 0.1;

/// `round(v)` clamped to `lo..=hi`.
pub fn round_clamp(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// Fit `x ≈ scale * q - offset` with integer `q` in `0..=nmax`, `scale >= 0` and
/// `offset >= 0` (the formats store the offset unsigned and subtract it, so the lowest
/// representable value is never above 0). Returns `(scale, offset)`.
pub fn fit_affine(x: &[f32], nmax: i32) -> (f32, f32) {
    let min = x.iter().fold(0f32, |m, &v| m.min(v));
    let max = x.iter().fold(f32::MIN, |m, &v| m.max(v));
    if max <= min {
        return (0.0, -min);
    }
    let n = x.len() as f32;
    let sx: f32 = x.iter().sum();
    let mut best = ((max - min) / nmax as f32, -min);
    let mut best_err = affine_error(x, best.0, best.1, nmax);
    for step in -STEPS..=STEPS {
        let iscale = (nmax as f32 + STEP * step as f32) / (max - min);
        // Least squares for (scale, c) in x ≈ scale * q + c, given this rounding.
        let (mut sq, mut sqq, mut sqx) = (0f32, 0f32, 0f32);
        for &v in x {
            let q = round_clamp(iscale * (v - min), 0, nmax) as f32;
            sq += q;
            sqq += q * q;
            sqx += q * v;
        }
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let mut scale = (n * sqx - sq * sx) / det;
        let mut c = (sqq * sx - sq * sqx) / det;
        if c > 0.0 {
            // The offset must not be positive: refit the scale alone.
            c = 0.0;
            scale = sqx / sqq;
        }
        if scale <= 0.0 {
            continue;
        }
        let err = affine_error(x, scale, -c, nmax);
        if err < best_err {
            best = (scale, -c);
            best_err = err;
        }
    }
    best
}

/// Squared error of `x` quantized as `scale * q - offset`, `q` rounded and clamped.
pub fn affine_error(x: &[f32], scale: f32, offset: f32, nmax: i32) -> f32 {
    if scale <= 0.0 {
        return x.iter().map(|&v| (v + offset) * (v + offset)).sum();
    }
    x.iter()
        .map(|&v| {
            let q = round_clamp((v + offset) / scale, 0, nmax) as f32;
            let e = scale * q - offset - v;
            e * e
        })
        .sum()
}

/// Fit `x ≈ scale * q` with integer `q` in `-nneg..=npos` (e.g. 32 and 31 for 6 bits).
/// Candidates map the value of largest magnitude to about `-nneg` (the scale takes the
/// opposite sign of that value, so the larger negative half of the range is the one used);
/// each is refined by least squares. Returns the signed scale.
pub fn fit_symmetric(x: &[f32], nneg: i32, npos: i32) -> f32 {
    let vmax = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if vmax == 0.0 {
        return 0.0;
    }
    let mut best = (0f32, symmetric_error(x, 0.0, nneg, npos));
    for step in -STEPS..=STEPS {
        // Map vmax to -nneg (scale < 0 when vmax > 0): uses the larger negative range.
        let iscale = -(nneg as f32 + STEP * step as f32) / vmax;
        let (mut sqq, mut sqx) = (0f32, 0f32);
        for &v in x {
            let q = round_clamp(iscale * v, -nneg, npos) as f32;
            sqq += q * q;
            sqx += q * v;
        }
        if sqq == 0.0 {
            continue;
        }
        let scale = sqx / sqq;
        let err = symmetric_error(x, scale, nneg, npos);
        if err < best.1 {
            best = (scale, err);
        }
    }
    best.0
}

/// Squared error of `x` quantized as `scale * q`, `q` rounded and clamped.
pub fn symmetric_error(x: &[f32], scale: f32, nneg: i32, npos: i32) -> f32 {
    if scale == 0.0 {
        return x.iter().map(|v| v * v).sum();
    }
    x.iter()
        .map(|&v| {
            let e = scale * round_clamp(v / scale, -nneg, npos) as f32 - v;
            e * e
        })
        .sum()
}

/// Integer scale and min codes for `x ≈ (d * sc) * q - (dmin * m)`: starting from the
/// rounded codes of a real fit, try each code one step either way and keep the pair with
/// the smallest error under the decoder's own f32 arithmetic. Returns `(sc, m)`.
pub fn refine_affine_codes(
    x: &[f32],
    d: f32,
    dmin: f32,
    sc: i32,
    m: i32,
    max_code: i32,
    nmax: i32,
) -> (u8, u8) {
    let mut best = (sc.clamp(0, max_code), m.clamp(0, max_code), f32::INFINITY);
    for dsc in -1..=1 {
        for dm in -1..=1 {
            let (c, k) = (sc + dsc, m + dm);
            if !(0..=max_code).contains(&c) || !(0..=max_code).contains(&k) {
                continue;
            }
            let err = affine_error(x, d * c as f32, dmin * k as f32, nmax);
            if err < best.2 {
                best = (c, k, err);
            }
        }
    }
    (best.0 as u8, best.1 as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_fits_exact_grids() {
        let x: Vec<f32> = (0..16).map(|i| 0.5 * (i % 4) as f32 - 0.25).collect();
        let (s, m) = fit_affine(&x, 3);
        assert!((s - 0.5).abs() < 1e-6 && (m - 0.25).abs() < 1e-6, "{s} {m}");
        assert_eq!(fit_affine(&[0.0; 8], 3), (0.0, 0.0));
    }

    #[test]
    fn symmetric_fits_exact_grids() {
        let x: Vec<f32> = (-32..32).map(|i| 0.125 * i as f32).collect();
        let s = fit_symmetric(&x, 32, 31);
        assert!(symmetric_error(&x, s, 32, 31) < 1e-9, "{s}");
        assert_eq!(fit_symmetric(&[0.0; 8], 32, 31), 0.0);
    }
}
