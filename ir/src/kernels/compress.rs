//! Compressed attention: pooling a window of tokens into one compressed row, and the
//! lightning indexer that picks which compressed rows a query may use.
use crate::real::Real;

/// `compress_pool`'s inputs gathered from a compressor's logs, where the logs stay (on a
/// GPU): item j < n_rows is new row `first_row + j`'s kv values, item n_rows + j its gate
/// values plus the positional bias `ape` ([ratio, cw]); each `[slots, w]`. `kv`, `gate`
/// hold the projections ([.., cw], cw = slots / ratio · w) of tokens `first ..`.
///
/// Slot s of row i is token i·ratio + s; with overlap (CSA, slots = 2·ratio) slots
/// s < ratio are the A halves (channels 0..w) of the previous window's tokens, absent
/// for row 0 (kv 0, gate -inf: weight 0), and slots s ≥ ratio the B halves (channels
/// w..2w) of the row's own.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "slots * w")]
pub fn compress_gather<F: Real>(
    item: usize,
    out: &mut [F],
    kv: &[F],
    gate: &[F],
    ape: &[F],
    n_rows: usize,
    first_row: usize,
    first: usize,
    ratio: usize,
    slots: usize,
    w: usize,
) {
    let is_gate = item >= n_rows;
    let i = first_row + item % n_rows;
    let cw = slots / ratio * w;
    'par: for e in 0..slots * w {
        let s = e / w;
        let c = e % w;
        let mut present = true;
        let mut tok = i * ratio + s;
        let mut half = 0;
        if slots > ratio {
            if s < ratio {
                if i == 0 {
                    present = false;
                } else {
                    tok = (i - 1) * ratio + s;
                }
            } else {
                tok = i * ratio + s - ratio;
                half = w;
            }
        }
        let mut v = F::zero();
        if is_gate {
            v = F::neg_infinity();
        }
        if present {
            let at = (tok - first) * cw + half + c;
            if is_gate {
                v = gate[at] + ape[(tok % ratio) * cw + half + c];
            } else {
                v = kv[at];
            }
        }
        out[e] = v;
    }
}

/// One compressed row: per channel, a softmax over the row's `slots` of the gate values,
/// weighting the kv values. `kv`, `gate` are `[rows, slots, w]`; an absent slot carries
/// gate = -inf (weight 0).
#[ds4_macros::kernel(out = "w")]
pub fn compress_pool<F: Real>(item: usize, out: &mut [F], kv: &[F], gate: &[F], slots: usize, w: usize) {
    let base = item * slots * w;
    'par: for c in 0..w {
        let mut mx = F::neg_infinity();
        for s in 0..slots {
            mx = mx.max(gate[base + s * w + c]);
        }
        let mut sum = F::zero();
        let mut acc = F::zero();
        for s in 0..slots {
            let g = gate[base + s * w + c];
            if g > F::neg_infinity() {
                let e = (g - mx).exp();
                sum += e;
                acc += e * kv[base + s * w + c];
            }
        }
        out[c] = acc / sum;
    }
}

/// Indexer scores of each query token against every compressed indexer row,
/// `Σ_h (w_h / sqrt(heads)) · relu(q_h · k) / sqrt(dk)`, -inf for rows the query may not
/// see yet; in two steps, so that a decode step (one token) still fills a GPU.
///
/// Step 1, item = (token, head): each visible row's `q_h · k` (0 for the others). The
/// relu is step 2's, so that a GPU may compute every row's dot as one matmul of the
/// queries against the rows (the CUDA backend does) and leave the masking to step 2.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "n_rows")]
pub fn indexer_head_dots<F: Real>(item: usize, out: &mut [F], q: &[F], rows: &[F], n_rows: usize, heads: usize, dk: usize, pos0: usize, ratio: usize) {
    let visible = (pos0 + item / heads + 1) / ratio;
    'par: for r in 0..n_rows {
        let mut dot = F::zero();
        if r < visible {
            for c in 0..dk {
                dot += q[item * dk + c] * rows[r * dk + c];
            }
        }
        out[r] = dot;
    }
}

/// Step 2, item = token: the heads' dots, relu'd, weighted and summed.
#[allow(clippy::too_many_arguments)]
#[ds4_macros::kernel(out = "n_rows")]
pub fn indexer_combine<F: Real>(item: usize, out: &mut [F], dots: &[F], w: &[F], n_rows: usize, heads: usize, dk: usize, pos0: usize, ratio: usize) {
    let visible = (pos0 + item + 1) / ratio;
    let scale = F::one() / F::from_usize(dk).sqrt();
    let wscale = F::one() / F::from_usize(heads).sqrt();
    'par: for r in 0..n_rows {
        let mut s = F::neg_infinity();
        if r < visible {
            s = F::zero();
            for h in 0..heads {
                s += dots[(item * heads + h) * n_rows + r].max(F::zero()) * scale * (w[item * heads + h] * wscale);
            }
        }
        out[r] = s;
    }
}

/// Top-k of one row of `n` scores, ties to the lower index, -inf entries never chosen;
/// missing picks are -1. Picks come out in descending (score, -index) order.
///
/// By rank: candidate j's place is the number of candidates ahead of it in that order
/// (stopping once k are found), and the first k places are the picks. A candidate that
/// gets a place has scanned the whole row, so it also knows how many candidates are
/// finite: the last of them marks the places after its own empty (and iteration 0, when
/// no candidate is finite, all of them). Every place is written by one iteration and
/// nothing is read back, so the iterations are independent: one loop that a GPU spreads
/// over a block's threads, and at decode (one item) over several blocks. The scan takes
/// 8 scores a step (their loads independent: a GPU thread has them in flight together;
/// one at a time, a candidate that scans the whole row waited out a load per score).
/// Counting up to 7 scores past the k-th ahead changes nothing: such a candidate gets
/// no place.
#[ds4_macros::kernel(out = "k")]
pub fn top_k<F: Real>(item: usize, out: &mut [i32], scores: &[F], n: usize, k: usize) {
    let base = item * n;
    let mut extent = n;
    if extent < 1 {
        extent = 1;
    }
    'par: for j in 0..extent {
        let mut s = F::neg_infinity();
        if j < n {
            s = scores[base + j];
        }
        if s > F::neg_infinity() {
            let mut rank = 0;
            let mut finite = 0;
            let mut i = 0;
            while i < n && rank < k {
                for q in 0..8 {
                    let iq = i + q;
                    if iq < n {
                        let t = scores[base + iq];
                        if t > s || (t == s && iq < j) {
                            rank += 1;
                        }
                        if t > F::neg_infinity() {
                            finite += 1;
                        }
                    }
                }
                i += 8;
            }
            if rank < k {
                out[rank] = j as i32;
                if rank + 1 == finite {
                    for p in finite..k {
                        out[p] = -1;
                    }
                }
            }
        } else {
            if j == 0 {
                let mut found = 0;
                let mut i = 0;
                while i < n && found == 0 {
                    if scores[base + i] > F::neg_infinity() {
                        found = 1;
                    }
                    i += 1;
                }
                if found == 0 {
                    for p in 0..k {
                        out[p] = -1;
                    }
                }
            }
        }
    }
}
