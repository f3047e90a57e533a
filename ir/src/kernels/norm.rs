//! RMSNorm over the last dimension: x / sqrt(mean(x²) + eps), times a weight if present.
use crate::real::Real;

/// One row of `n` values, scaled by `w`.
#[ds4_macros::kernel(out = "n")]
pub fn rms_norm<F: Real>(item: usize, out: &mut [F], x: &[F], w: &[F], n: usize, eps: F) {
    let base = item * n;
    let mut ss = F::zero();
    'sum: for i in 0..n {
        let v = x[base + i];
        ss += v * v;
    }
    let inv = rms_inv(ss, n, eps);
    'par: for i in 0..n {
        out[i] = rms_scaled(x[base + i], inv, w[i]);
    }
}

/// One row of `n` values, no weight (the per-head q norm and the HC input norm).
#[ds4_macros::kernel(out = "n")]
pub fn rms_norm_plain<F: Real>(item: usize, out: &mut [F], x: &[F], n: usize, eps: F) {
    let base = item * n;
    let mut ss = F::zero();
    'sum: for i in 0..n {
        let v = x[base + i];
        ss += v * v;
    }
    let inv = rms_inv(ss, n, eps);
    'par: for i in 0..n {
        out[i] = x[base + i] * inv;
    }
}

/// The inverse RMS of `n` values whose squares add to `ss`: what a norm multiplies them by.
/// CUDA's fused norms (`rms_norm_digits`, `norm_rope`, `hc_pre`) render this helper and
/// `rms_scaled` too, so the arithmetic is written once.
#[ds4_macros::kernel_helper]
fn rms_inv<F: Real>(ss: F, n: usize, eps: F) -> F {
    F::one() / (ss / F::from_usize(n) + eps).sqrt()
}

/// A weighted norm's value: `x` times the inverse RMS and its weight (the fused CUDA norms
/// render it as they render `rms_inv`).
#[ds4_macros::kernel_helper]
fn rms_scaled<F: Real>(x: F, inv: F, w: F) -> F {
    x * inv * w
}

/// Elementwise sum of two rows of `n`.
#[ds4_macros::kernel(out = "n")]
pub fn add<F: Real>(item: usize, out: &mut [F], a: &[F], b: &[F], n: usize) {
    let base = item * n;
    'par: for i in 0..n {
        out[i] = a[base + i] + b[base + i];
    }
}
