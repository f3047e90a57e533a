//! Attention of one query head over its sliding window plus compressed rows, with a
//! per-head sink logit whose probability mass is dropped. K = V (one shared KV head).
use crate::real::Real;

/// Which compressed rows a query sees.
pub const COMP_NONE: usize = 0;
/// Every compressed row `i < (t+1)/ratio` (HCA).
pub const COMP_CAUSAL: usize = 1;
/// The rows the indexer selected (CSA); -1 entries are unused picks.
pub const COMP_SELECTED: usize = 2;

/// Work item = (token, head). `win` holds window keys for positions `win_pos0 ..`,
/// `comp` the compressed rows, `sel` `[T, k_sel]` indexer picks.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "hd")]
pub fn attention<F: Real>(
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
) {
    let t = item / heads;
    let h = item % heads;
    let pos = pos0 + t;
    let qb = item * hd;
    // Window keys at positions (pos - window, pos].
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
    // One pass, online softmax: `mx` is the largest logit so far (the sink's first),
    // `sum` and `out` are scaled to it and rescaled when a larger one comes.
    let mut mx = sinks[h];
    let mut sum = F::one();
    'par: for c in 0..hd {
        out[c] = F::zero();
    }
    for j in lo..hi {
        let mut s = F::zero();
        'sum: for c in 0..hd {
            s += q[qb + c] * win[j * hd + c];
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
        'par: for c in 0..hd {
            out[c] += p * win[j * hd + c];
        }
    }
    for jj in 0..visible_comp {
        let mut r = jj as i32;
        if comp_mode == COMP_SELECTED {
            r = sel[t * k_sel + jj];
        }
        if r >= 0 {
            let rb = (r as usize) * hd;
            let mut s = F::zero();
            'sum: for c in 0..hd {
                s += q[qb + c] * comp[rb + c];
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
            'par: for c in 0..hd {
                out[c] += p * comp[rb + c];
            }
        }
    }
    'par: for c in 0..hd {
        out[c] = out[c] / sum;
    }
}

/// `attention` in two steps, for targets that want more parallelism than one item per
/// (token, head) (the GPU at decode: 64 items). Step 1, item = ((token, head), chunk):
/// chunk `chunk` of `nc` of the row list (window rows, then compressed rows) with its own
/// online softmax, no sink; `out` = the unnormalized weighted sum [hd], then the chunk's
/// max logit (-inf if it saw no row) and its sum of exponentials.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "hd + 2")]
pub fn attention_partial<F: Real>(
    item: usize,
    out: &mut [F],
    q: &[F],
    win: &[F],
    comp: &[F],
    sel: &[i32],
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

/// Step 2 of `attention`, item = (token, head): the chunks and the sink merged.
#[ds4_macros::kernel(out = "hd")]
pub fn attention_merge<F: Real>(item: usize, out: &mut [F], part: &[F], sinks: &[F], heads: usize, hd: usize, nc: usize) {
    let h = item % heads;
    let w = hd + 2;
    let mut mx = sinks[h];
    for c in 0..nc {
        mx = mx.max(part[(item * nc + c) * w + hd]);
    }
    let mut sum = (sinks[h] - mx).exp();
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
