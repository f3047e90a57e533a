//! The router (sqrtsoftplus scores, biased or hashed selection, normalized weights) and
//! the clamped SwiGLU of the experts.
use crate::real::Real;

/// `sqrt(softplus(x))` for one row of `n` router logits (softplus linear above 20, as torch).
#[ds4_macros::kernel(out = "n")]
pub fn router_scores<F: Real>(item: usize, out: &mut [F], logits: &[F], n: usize) {
    'par: for e in 0..n {
        let x = logits[item * n + e];
        let mut sp = x;
        if x <= F::from_f64(20.0) {
            sp = x.exp().ln_1p();
        }
        out[e] = sp.sqrt();
    }
}

/// Selection scores: router scores plus the selection bias (used for choosing only).
#[ds4_macros::kernel(out = "n")]
pub fn router_biased<F: Real>(item: usize, out: &mut [F], scores: &[F], bias: &[F], n: usize) {
    'par: for e in 0..n {
        out[e] = scores[item * n + e] + bias[e];
    }
}

/// Hash routing: the experts of token `ids[t]` from the `[vocab, k]` table.
#[ds4_macros::kernel(out = "k")]
pub fn router_hash(item: usize, out: &mut [i32], ids: &[i32], table: &[i32], k: usize) {
    let tok = ids[item] as usize;
    'par: for j in 0..k {
        out[j] = table[tok * k + j];
    }
}

/// Expert weights `scale · s_e / Σ_sel s` (or `scale · s_e` without normalization).
#[ds4_macros::kernel(out = "k")]
pub fn router_weights<F: Real>(
    item: usize,
    out: &mut [F],
    scores: &[F],
    sel: &[i32],
    n: usize,
    k: usize,
    scale: F,
    normalize: bool,
) {
    let mut sum = F::zero();
    'sum: for j in 0..k {
        sum += scores[item * n + sel[item * k + j] as usize];
    }
    'par: for j in 0..k {
        let s = scores[item * n + sel[item * k + j] as usize];
        if normalize {
            out[j] = scale * s / (sum + F::from_f64(1e-20));
        } else {
            out[j] = scale * s;
        }
    }
}

/// Clamped SwiGLU of one row: `silu(min(g, c)) · clamp(u, -c, c)`.
#[ds4_macros::kernel(out = "n")]
pub fn swiglu<F: Real>(item: usize, out: &mut [F], g: &[F], u: &[F], n: usize, clamp: F) {
    'par: for i in 0..n {
        out[i] = swiglu_value(g[item * n + i], u[item * n + i], clamp);
    }
}

/// One clamped SwiGLU value (CUDA's `x_digits` renders it too, to take the digits of the
/// routed experts' SwiGLU without making it first).
#[ds4_macros::kernel_helper]
fn swiglu_value<F: Real>(g: F, u: F, clamp: F) -> F {
    let gv = g.min(clamp);
    let uv = u.max(-clamp).min(clamp);
    gv / (F::one() + (-gv).exp()) * uv
}

/// The routed experts' output of one token from per-pick rows: `Σ_jp wts[jp] · y[jp]`
/// (picks in order). Targets that run the experts' down projection per (token, pick)
/// pair, grouped by expert, add the picks up with this.
#[ds4_macros::kernel(out = "d")]
pub fn moe_combine<F: Real>(item: usize, out: &mut [F], y: &[F], wts: &[F], k: usize, d: usize) {
    'par: for c in 0..d {
        let mut acc = F::zero();
        for jp in 0..k {
            acc += wts[item * k + jp] * y[(item * k + jp) * d + c];
        }
        out[c] = acc;
    }
}
