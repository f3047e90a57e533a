//! Attention of one query head over its sliding window plus compressed rows, with a
//! per-head sink logit whose probability mass is dropped. K = V (one shared KV head).
use crate::real::Real;

/// Which compressed rows a query sees.
pub const COMP_NONE: usize = 0;
/// Every compressed row `i < (t+1)/ratio` (HCA).
pub const COMP_CAUSAL: usize = 1;
/// The rows the indexer selected (CSA); -1 entries are unused picks.
pub const COMP_SELECTED: usize = 2;

/// Attention of one query head over its window rows and compressed rows, in two steps:
/// the row list (window rows, then compressed rows) in `nc` chunks, then the merge.
/// Chunks let a GPU give a decode step (64 items) many blocks; the CPU uses one.
///
/// Step 1, item = ((token, head), chunk): the chunk's rows with an online softmax, chunk
/// 0 starting from the sink (so that with one chunk the merge changes no bit); `out` =
/// the unnormalized weighted sum [hd], then the chunk's max logit (-inf if it saw
/// nothing) and its sum of exponentials. `win` holds window keys for positions
/// `win_pos0 ..`, `comp` the compressed rows, `sel` `[T, k_sel]` indexer picks.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "hd + 2")]
pub fn attention_partial<F: Real>(
    item: usize,
    out: &mut [F],
    q: &[F],
    win: &[F],
    comp: &[F],
    sel: &[i32],
    sinks: &[F],
    heads: usize,
    hd: usize,
    pos0: usize,
    win_pos0: usize,
    n_win: usize,
    window: usize,
    n_comp: usize,
    comp_mode: usize,
    ratio: usize,
    k_sel: usize,
    scale: F,
    nc: usize,
) {
    let chunk = item % nc;
    let th = item / nc;
    let t = th / heads;
    let pos = pos0 + t;
    let qb = th * hd;
    let mut lo = 0;
    if pos + 1 > window + win_pos0 {
        lo = pos + 1 - window - win_pos0;
    }
    let hi = (pos + 1 - win_pos0).min(n_win);
    let mut visible_comp = 0;
    if comp_mode == COMP_CAUSAL {
        visible_comp = ((pos + 1) / ratio).min(n_comp);
    }
    if comp_mode == COMP_SELECTED {
        visible_comp = k_sel;
    }
    let n_w = hi - lo;
    let n_rows = n_w + visible_comp;
    let a = chunk * n_rows / nc;
    let b = (chunk + 1) * n_rows / nc;
    let mut mx = F::neg_infinity();
    let mut sum = F::zero();
    if chunk == 0 {
        mx = sinks[th % heads];
        sum = F::one();
    }
    'par: for c in 0..hd {
        out[c] = F::zero();
    }
    for i in a..b {
        // Row i of the list: a window row, or a compressed one (-1: an unused pick).
        let mut rb = 0;
        let mut from_window = true;
        let mut present = true;
        if i < n_w {
            rb = (lo + i) * hd;
        } else {
            from_window = false;
            let mut r = (i - n_w) as i32;
            if comp_mode == COMP_SELECTED {
                r = sel[t * k_sel + (i - n_w)];
            }
            if r < 0 {
                present = false;
            } else {
                rb = (r as usize) * hd;
            }
        }
        if present {
            let mut s = F::zero();
            if from_window {
                'sum: for c in 0..hd {
                    s += q[qb + c] * win[rb + c];
                }
            } else {
                'sum: for c in 0..hd {
                    s += q[qb + c] * comp[rb + c];
                }
            }
            s = s * scale;
            if s > mx {
                let corr = (mx - s).exp();
                sum = sum * corr;
                'par: for c in 0..hd {
                    out[c] = out[c] * corr;
                }
                mx = s;
            }
            let p = (s - mx).exp();
            sum += p;
            if from_window {
                'par: for c in 0..hd {
                    out[c] += p * win[rb + c];
                }
            } else {
                'par: for c in 0..hd {
                    out[c] += p * comp[rb + c];
                }
            }
        }
    }
    'par: for c in 0..2 {
        if c == 0 {
            out[hd] = mx;
        } else {
            out[hd + 1] = sum;
        }
    }
}

/// Step 2, item = (token, head): the chunks merged (the sink is in chunk 0), normalized.
#[ds4_macros::kernel(out = "hd")]
pub fn attention_merge<F: Real>(item: usize, out: &mut [F], part: &[F], hd: usize, nc: usize) {
    let w = hd + 2;
    let mut mx = F::neg_infinity();
    for c in 0..nc {
        mx = mx.max(part[(item * nc + c) * w + hd]);
    }
    let mut sum = F::zero();
    for c in 0..nc {
        let m = part[(item * nc + c) * w + hd];
        if m > F::neg_infinity() {
            sum += part[(item * nc + c) * w + hd + 1] * (m - mx).exp();
        }
    }
    'par: for d in 0..hd {
        let mut acc = F::zero();
        for c in 0..nc {
            let m = part[(item * nc + c) * w + hd];
            if m > F::neg_infinity() {
                acc += part[(item * nc + c) * w + d] * (m - mx).exp();
            }
        }
        out[d] = acc / sum;
    }
}
