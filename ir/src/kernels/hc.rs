//! Manifold-constrained hyper-connections: the mixing weights (with Sinkhorn), collapsing
//! the `nh` residual streams into a block input, and expanding a block output back.
//!
//! The mix row of a token holds `pre` (nh), `post` (nh) and `comb` (nh×nh, row-major
//! `comb[i][j]`), i.e. `2nh + nh²` values, in the order the projection produces them.
use crate::real::Real;

/// Values in a token's mix row of `nh` streams: `pre` and `post` (nh each), `comb` (nh²).
pub fn mix_width(nh: usize) -> usize {
    2 * nh + nh * nh
}

#[ds4_macros::kernel_helper]
fn sigmoid<F: Real>(x: F) -> F {
    F::one() / (F::one() + (-x).exp())
}

/// Mixing weights from the projected logits `m` (one token's `2nh+nh²` values):
/// `pre = σ(m·s0 + b) + eps`, `post = 2σ(m·s1 + b)`, `comb = Sinkhorn(softmax_j(m·s2 + b) + eps)`.
#[ds4_macros::kernel(out = "2 * nh + nh * nh")]
pub fn hc_mix<F: Real>(
    item: usize,
    out: &mut [F],
    m: &[F],
    scale: &[F],
    base: &[F],
    nh: usize,
    iters: usize,
    eps: F,
) {
    let mw = 2 * nh + nh * nh;
    let mo = item * mw;
    // Rows and columns in parallel (each iteration writes only its own row or column of
    // `out`): the same operations in the same order as one thread would do them.
    'par: for i in 0..nh {
        out[i] = sigmoid(m[mo + i] * scale[0] + base[i]) + eps;
        out[nh + i] = F::from_f64(2.0) * sigmoid(m[mo + nh + i] * scale[1] + base[nh + i]);
    }
    let c0 = 2 * nh;
    'par: for i in 0..nh {
        let mut mx = F::neg_infinity();
        for j in 0..nh {
            let k = c0 + i * nh + j;
            mx = mx.max(m[mo + k] * scale[2] + base[k]);
        }
        let mut sum = F::zero();
        for j in 0..nh {
            let k = c0 + i * nh + j;
            let e = (m[mo + k] * scale[2] + base[k] - mx).exp();
            out[k] = e;
            sum += e;
        }
        for j in 0..nh {
            let k = c0 + i * nh + j;
            out[k] = out[k] / sum + eps;
        }
    }
    // Columns first, then `iters - 1` rounds of rows-then-columns.
    'par: for j in 0..nh {
        let mut s = F::zero();
        for i in 0..nh {
            s += out[c0 + i * nh + j];
        }
        for i in 0..nh {
            out[c0 + i * nh + j] = out[c0 + i * nh + j] / (s + eps);
        }
    }
    for _it in 1..iters {
        'par: for i in 0..nh {
            let mut s = F::zero();
            for j in 0..nh {
                s += out[c0 + i * nh + j];
            }
            for j in 0..nh {
                out[c0 + i * nh + j] = out[c0 + i * nh + j] / (s + eps);
            }
        }
        'par: for j in 0..nh {
            let mut s = F::zero();
            for i in 0..nh {
                s += out[c0 + i * nh + j];
            }
            for i in 0..nh {
                out[c0 + i * nh + j] = out[c0 + i * nh + j] / (s + eps);
            }
        }
    }
}

/// Head weights for the final collapse: `pre = σ(m·scale + b) + eps` (nh values).
#[ds4_macros::kernel(out = "nh")]
pub fn hc_head_mix<F: Real>(item: usize, out: &mut [F], m: &[F], scale: &[F], base: &[F], nh: usize, eps: F) {
    'par: for i in 0..nh {
        out[i] = sigmoid(m[item * nh + i] * scale[0] + base[i]) + eps;
    }
}

/// Block input `x = Σ_i pre_i R_i`; `pre` is the first `nh` values of each mix row of width `mw`.
#[ds4_macros::kernel(out = "d")]
pub fn hc_collapse<F: Real>(item: usize, out: &mut [F], r: &[F], mix: &[F], nh: usize, d: usize, mw: usize) {
    'par: for c in 0..d {
        let mut acc = F::zero();
        for i in 0..nh {
            acc += mix[item * mw + i] * r[(item * nh + i) * d + c];
        }
        out[c] = acc;
    }
}

/// Residual update `R'_j = post_j·y + Σ_i comb[i][j]·R_i` for one token (`nh·d` outputs).
#[ds4_macros::kernel(out = "nh * d")]
pub fn hc_expand<F: Real>(item: usize, out: &mut [F], y: &[F], r: &[F], mix: &[F], nh: usize, d: usize) {
    let mw = 2 * nh + nh * nh;
    let mo = item * mw;
    // Channel by channel, all streams at once: a thread reads its channel of y and of the
    // nh streams for every output stream j (one round of loads on a GPU, not nh).
    'par: for c in 0..d {
        for j in 0..nh {
            let mut acc = mix[mo + nh + j] * y[item * d + c];
            for i in 0..nh {
                acc += mix[mo + 2 * nh + i * nh + j] * r[(item * nh + i) * d + c];
            }
            out[j * d + c] = acc;
        }
    }
}

/// The embedding row copied into all `nh` streams.
#[ds4_macros::kernel(out = "nh * d")]
pub fn hc_broadcast<F: Real>(item: usize, out: &mut [F], x: &[F], nh: usize, d: usize) {
    for j in 0..nh {
        'par: for c in 0..d {
            out[j * d + c] = x[item * d + c];
        }
    }
}
