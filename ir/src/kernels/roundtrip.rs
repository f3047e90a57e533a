//! Activation round trips that DS4 inference applies on purpose (quantization-aware
//! training made the model expect them): FP8 E4M3 on the non-RoPE KV channels, and a
//! 128-point Hadamard transform followed by FP4 E2M1 on the lightning indexer.
use crate::real::Real;

/// Nearest E4M3 value of `v` (|v| ≤ 448), ties to the even code.
#[ds4_macros::kernel_helper]
fn e4m3_round<F: Real>(v: F) -> F {
    let a = v.abs();
    // Normal numbers have 3 mantissa bits; below 2^-6 the spacing is the subnormal 2^-9.
    let mut step = F::from_f64(0.001953125);
    if a >= F::from_f64(0.015625) {
        step = (a.ilogb() - F::from_f64(3.0)).exp2();
    }
    (v / step).round_even() * step
}

/// The power-of-two scale `2^ceil(log2(amax / top))` of a block whose largest magnitude is
/// `amax`, for a format whose largest value is `top` (448 for E4M3, 6 for E2M1).
#[ds4_macros::kernel_helper]
fn pow2_scale<F: Real>(amax: F, top: F) -> F {
    (amax / top).log2().ceil().exp2()
}

/// FP8 round trip of the first `n_nope` channels of one row of `w`, in blocks of 64
/// with a power-of-two scale `2^ceil(log2(amax/448))`, amax floored at 1e-4.
///
/// One parallel loop over the row's channels: each channel finds its block's amax
/// itself (64 loads its neighbours share from the cache). A loop over blocks instead
/// left 7 threads of a row scanning 64 values one after another (12.7 µs a decode step
/// on the H200), and a second loop kept a decode item in one block.
#[ds4_macros::kernel(out = "w")]
pub fn fp8_roundtrip<F: Real>(item: usize, out: &mut [F], x: &[F], w: usize, n_nope: usize) {
    let base = item * w;
    let rounded = n_nope / 64 * 64;
    'par: for i in 0..w {
        let v = x[base + i];
        if i < rounded {
            let b0 = base + i / 64 * 64;
            let mut amax = F::from_f64(1e-4);
            for j in 0..64 {
                amax = amax.max(x[b0 + j].abs());
            }
            let scale = pow2_scale(amax, F::from_f64(448.0));
            let q = (v / scale).max(F::from_f64(-448.0)).min(F::from_f64(448.0));
            out[i] = e4m3_round(q) * scale;
        } else {
            out[i] = v;
        }
    }
}

/// Nearest E2M1 value of `v` (|v| ≤ 6) among ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the
/// even code (so 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4).
#[ds4_macros::kernel_helper]
fn e2m1_round<F: Real>(v: F) -> F {
    let a = v.abs();
    let mut q = F::from_f64(6.0);
    if a <= F::from_f64(0.25) {
        q = F::zero();
    } else if a < F::from_f64(0.75) {
        q = F::from_f64(0.5);
    } else if a <= F::from_f64(1.25) {
        q = F::one();
    } else if a < F::from_f64(1.75) {
        q = F::from_f64(1.5);
    } else if a <= F::from_f64(2.5) {
        q = F::from_f64(2.0);
    } else if a < F::from_f64(3.5) {
        q = F::from_f64(3.0);
    } else if a <= F::from_f64(5.0) {
        q = F::from_f64(4.0);
    }
    if v < F::zero() {
        q = -q;
    }
    q
}

/// Hadamard transform of one row of 128 (butterflies, then ×1/√128), optionally followed
/// by an FP4 round trip in blocks of 32 with scale `2^ceil(log2(amax/6))`.
#[ds4_macros::kernel(out = "128")]
pub fn hadamard_fp4<F: Real>(item: usize, out: &mut [F], x: &[F], fp4: bool) {
    let n = 128;
    let base = item * n;
    'par: for i in 0..n {
        out[i] = x[base + i];
    }
    // Butterfly stages: in stage h, pair t (of n/2) joins j and j + h, where j is the
    // t % h-th element of the (t / h)-th group of 2h. The pairs of a stage are disjoint.
    let mut h = 1;
    while h < n {
        'par: for t in 0..n / 2 {
            let j = (t / h) * 2 * h + t % h;
            let a = out[j];
            let b = out[j + h];
            out[j] = a + b;
            out[j + h] = a - b;
        }
        h *= 2;
    }
    let norm = F::one() / F::from_f64(128.0).sqrt();
    'par: for i in 0..n {
        out[i] = out[i] * norm;
    }
    if fp4 {
        'par: for b in 0..4 {
            let mut amax = F::from_f64(1e-4);
            for i in 0..32 {
                amax = amax.max(out[b * 32 + i].abs());
            }
            let scale = pow2_scale(amax, F::from_f64(6.0));
            for i in 0..32 {
                let v = (out[b * 32 + i] / scale).max(F::from_f64(-6.0)).min(F::from_f64(6.0));
                out[b * 32 + i] = e2m1_round(v) * scale;
            }
        }
    }
}
