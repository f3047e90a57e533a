//! Interleaved RoPE on the last `n_rot` channels of each head.
//!
//! Work item = one head of one row. Row `t` sits at position `(pos_base + t) · pos_mult`
//! (tokens: base = first position, mult = 1; compressed rows: base = first new row index,
//! mult = ratio). `sign = -1` applies the inverse rotation (attention output).
use crate::real::Real;

/// The cosine of the angle of position `pos` at frequency `f`.
#[ds4_macros::kernel_helper]
fn rope_cos<F: Real>(pos: F, f: F) -> F {
    (pos * f).cos()
}

/// The sine of the angle of position `pos` at frequency `f`, times `sign` (-1: the inverse
/// rotation).
#[ds4_macros::kernel_helper]
fn rope_sin<F: Real>(pos: F, f: F, sign: F) -> F {
    (pos * f).sin() * sign
}

/// The first value of the pair (a, b) turned by the angle of cosine `c` and sine `s`.
#[ds4_macros::kernel_helper]
fn rotate_first<F: Real>(a: F, b: F, c: F, s: F) -> F {
    a * c - b * s
}

/// The second value of the pair (a, b) turned by the angle of cosine `c` and sine `s`.
#[ds4_macros::kernel_helper]
fn rotate_second<F: Real>(a: F, b: F, c: F, s: F) -> F {
    b * c + a * s
}

#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "hd")]
pub fn rope<F: Real>(
    item: usize,
    out: &mut [F],
    x: &[F],
    inv_freq: &[F],
    heads: usize,
    hd: usize,
    n_rot: usize,
    pos_base: usize,
    pos_mult: usize,
    sign: F,
) {
    let t = item / heads;
    let base = item * hd;
    let pos = F::from_usize((pos_base + t) * pos_mult);
    let nope = hd - n_rot;
    'par: for i in 0..nope {
        out[i] = x[base + i];
    }
    'par: for p in 0..n_rot / 2 {
        let c = rope_cos(pos, inv_freq[p]);
        let s = rope_sin(pos, inv_freq[p], sign);
        let a = x[base + nope + 2 * p];
        let b = x[base + nope + 2 * p + 1];
        out[nope + 2 * p] = rotate_first(a, b, c, s);
        out[nope + 2 * p + 1] = rotate_second(a, b, c, s);
    }
}
