//! The graph executor: runs a graph's nodes in order on one backend (here: the CPU, in
//! f32, or the float64 reference), binding the symbolic shapes to a batch.
//!
//! Every op's math is a kernel rendered from kernel IR at build time (`cpu_kernels`, from
//! the bodies in `ds4_ir::kernels`), launched over its work items in parallel; the
//! executor only gathers inputs, moves bytes and keeps the state slots. It knows nothing
//! about DS4 beyond the op set.

use crate::all_rows::AllRows;
use crate::slot_ops;
use crate::state::{RowLog, SessionState};
use crate::weights::{Compute, WeightView, Weights};
use crate::cpu_kernels as k;
use ds4_ir::kernels::attention;
use ds4_ir::{Bind, CompMode, Graph, Op, RopePos};
use rayon::prelude::*;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Input(String),
    #[error("internal: {0}")]
    Internal(String),
}

/// A value flowing along an edge.
enum Value<F> {
    F(Vec<F>),
    I(Vec<i32>),
    W(String),
    Freed,
}

/// Run `f(item, out_item)` for every item of `out` (items of `len` elements) in parallel.
fn launch<T: Send, K: Fn(usize, &mut [T]) + Sync>(out: &mut [T], len: usize, k: K) {
    if len == 0 {
        return;
    }
    out.par_chunks_mut(len).enumerate().for_each(|(i, o)| k(i, o));
}

fn zeros<F: Compute>(n: usize) -> Vec<F> {
    vec![F::zero(); n]
}

/// Inputs of one run.
pub struct RunInputs<'a, F> {
    pub ids: &'a [i32],
    pub residual: Option<&'a [F]>,
}

/// The fast path's activation rows: each of the `m` rows of `x` ([m, k]) quantized once
/// (not once per weight row), or None for the exact path.
fn prepare_fast<F: Compute>(fast: bool, x: &[F], m: usize, k: usize) -> Option<Vec<ds4_ir::quant::QuantActs>> {
    if !fast || k == 0 {
        return None;
    }
    (0..m).map(|t| F::prepare_fast(&x[t * k..(t + 1) * k])).collect()
}

/// x [m, k] times the rows of w ([n, k] in w's type) → [m, n]. Parallel over weight rows,
/// so each quantized row is read once for all m tokens.
fn matmul<F: Compute>(x: &[F], m: usize, k: usize, w: &WeightView<'_>, n: usize, fast: bool) -> Vec<F> {
    let mut out_t = zeros::<F>(n * m);
    // About 4096 outputs per task, but at least four tasks per thread: a decode step
    // (m = 1) must not put a whole 4096-row matrix on one thread.
    let per = (4096 / m.max(1)).min(n.div_ceil(4 * rayon::current_num_threads())).max(1);
    let acts = prepare_fast(fast, x, m, k);
    out_t.par_chunks_mut(m * per).enumerate().for_each(|(c, chunk)| {
        for (j, col) in chunk.chunks_mut(m).enumerate() {
            let row = w.row(c * per + j, k);
            for (t, o) in col.iter_mut().enumerate() {
                *o = match &acts {
                    Some(a) => F::dot_weight_row_fast(w.ty, row, &a[t]),
                    None => F::dot_weight_row(w.ty, row, &x[t * k..(t + 1) * k]),
                };
            }
        }
    });
    let mut out = zeros::<F>(m * n);
    for j in 0..n {
        for t in 0..m {
            out[t * n + j] = out_t[j * m + t];
        }
    }
    out
}

pub struct Executor<'a> {
    pub graph: &'a Graph,
    /// `graph`'s selections that a run may skip (`AllRows::of(graph)`, made once).
    pub all_rows: &'a AllRows,
    pub weights: &'a Weights,
    /// Use the quantized-activation fast path in the matmuls (`SessionOptions::fast`).
    pub fast: bool,
}

impl<'a> Executor<'a> {
    /// Run the graph for a batch at `bind`, updating `state`; returns the named outputs.
    pub fn run<F: Compute>(&self, state: &mut SessionState<RowLog<F>>, bind: Bind, inputs: RunInputs<'_, F>) -> Result<HashMap<String, Vec<F>>, ExecError> {
        let g = self.graph;
        let order = g.order();
        let last_use = g.last_uses();
        let mut vals: HashMap<usize, Value<F>> = HashMap::new();
        state.ensure_slots(g.n_slots);
        // Selections that are every row: not made (`all_rows.rs`).
        let all_rows = self.all_rows;
        let skipped = all_rows.skipped(bind);
        for (k, &id) in order.iter().enumerate() {
            if skipped.contains(&id.index()) {
                continue;
            }
            let node = g.node(id);
            let ins = g.inputs(id);
            let shape = node.ty.shape.eval(bind);
            let n_out: usize = shape.iter().product();
            let f = |i: usize| -> &[F] {
                match vals.get(&ins[i].index()) {
                    Some(Value::F(v)) => v,
                    _ => panic!("{}: input {i} is not a float value", node.label),
                }
            };
            let iv = |i: usize| -> &[i32] {
                match vals.get(&ins[i].index()) {
                    Some(Value::I(v)) => v,
                    _ => panic!("{}: input {i} is not an i32 value", node.label),
                }
            };
            let w = |i: usize| -> WeightView<'_> {
                match vals.get(&ins[i].index()) {
                    Some(Value::W(name)) => self.weights.get(name).expect("weights checked at build"),
                    _ => panic!("{}: input {i} is not a weight", node.label),
                }
            };
            // A small float parameter: an activation or a (de-quantized) weight vector.
            let vecf = |i: usize| -> Vec<F> {
                match vals.get(&ins[i].index()) {
                    Some(Value::F(v)) => v.clone(),
                    Some(Value::W(name)) => self.weights.get(name).expect("weights checked at build").to_vec(),
                    _ => panic!("{}: input {i} has no value", node.label),
                }
            };
            let in_shape = |i: usize| g.node(ins[i]).ty.shape.eval(bind);
            let last = |i: usize| *in_shape(i).last().unwrap_or(&1);
            let rows = |i: usize| {
                let s = in_shape(i);
                s.iter().product::<usize>() / s.last().copied().unwrap_or(1).max(1)
            };
            let value: Value<F> = match &node.op {
                Op::Input { name, .. } => match name.as_str() {
                    "ids" => Value::I(inputs.ids.to_vec()),
                    "residual" => {
                        let r = inputs.residual.ok_or_else(|| ExecError::Input("this graph needs an incoming residual".into()))?;
                        if r.len() != n_out {
                            return Err(ExecError::Input(format!("residual has {} values, the graph needs {n_out}", r.len())));
                        }
                        Value::F(r.to_vec())
                    }
                    other => return Err(ExecError::Input(format!("unknown graph input '{other}'"))),
                },
                Op::Weight { name, .. } => Value::W(name.clone()),
                Op::Embed => {
                    let ids = iv(0);
                    let table = w(1);
                    let (d, vocab) = (shape[1], table.ne[1] as usize);
                    if let Some(bad) = ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                        return Err(ExecError::Input(format!("token id {bad} is outside the vocabulary (size {vocab})")));
                    }
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, d, |t, o| F::dequant_row(table.ty, table.row(ids[t] as usize, d), o));
                    Value::F(out)
                }
                Op::MatMul => {
                    let (k, n) = (last(0), shape[shape.len() - 1]);
                    Value::F(matmul(f(0), rows(0), k, &w(1), n, self.fast))
                }
                Op::GroupedMatMul { groups } => {
                    let (x, wt, m) = (f(0), w(1), rows(0));
                    let kg = last(0) / groups;
                    let ng = shape[shape.len() - 1] / groups;
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, ng * groups, |t, o| {
                        for gi in 0..*groups {
                            let xs = &x[t * groups * kg + gi * kg..][..kg];
                            let acts = prepare_fast(self.fast, xs, 1, kg);
                            for j in 0..ng {
                                let row = wt.row(gi * ng + j, kg);
                                o[gi * ng + j] = match &acts {
                                    Some(a) => F::dot_weight_row_fast(wt.ty, row, &a[0]),
                                    None => F::dot_weight_row(wt.ty, row, xs),
                                };
                            }
                        }
                    });
                    let _ = m;
                    Value::F(out)
                }
                Op::MoeExperts { clamp } => {
                    let (a, sel, wts) = (f(0), iv(1), f(2));
                    let (gate, up, down) = (w(3), w(4), w(5));
                    let d = last(0);
                    let k = last(1);
                    let (ff, n_exp) = (gate.ne[1] as usize, gate.ne[2] as usize);
                    if let Some(bad) = sel.iter().find(|&&e| e < 0 || e as usize >= n_exp) {
                        return Err(ExecError::Input(format!("{}: expert id {bad} outside 0..{n_exp}", node.label)));
                    }
                    let c = F::from_f32(*clamp);
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, d, |t, o| {
                        let x = &a[t * d..(t + 1) * d];
                        let mut g = zeros::<F>(ff);
                        let mut u = zeros::<F>(ff);
                        let mut h = zeros::<F>(ff);
                        // Fast path: the token's row quantized once for all its experts' gate
                        // and up rows, and each expert's h once for its down rows.
                        let xa = prepare_fast(self.fast, x, 1, d);
                        let dot = |w: &WeightView<'_>, row: &[u8], v: &[F], a: &Option<Vec<ds4_ir::quant::QuantActs>>| match a {
                            Some(a) => F::dot_weight_row_fast(w.ty, row, &a[0]),
                            None => F::dot_weight_row(w.ty, row, v),
                        };
                        for j in 0..k {
                            let e = sel[t * k + j] as usize;
                            for i in 0..ff {
                                g[i] = dot(&gate, gate.row(e * ff + i, d), x, &xa);
                                u[i] = dot(&up, up.row(e * ff + i, d), x, &xa);
                            }
                            k::swiglu::swiglu(0, &mut h, &g, &u, ff, c);
                            let ha = prepare_fast(self.fast, &h, 1, ff);
                            let we = wts[t * k + j];
                            for (i, oi) in o.iter_mut().enumerate() {
                                *oi += we * dot(&down, down.row(e * d + i, ff), &h, &ha);
                            }
                        }
                    });
                    Value::F(out)
                }
                Op::LastRow => {
                    let x = f(0);
                    Value::F(x[x.len() - n_out..].to_vec())
                }
                Op::Reshape { .. } => match vals.get(&ins[0].index()) {
                    Some(Value::F(v)) => Value::F(v.clone()),
                    Some(Value::I(v)) => Value::I(v.clone()),
                    _ => return Err(ExecError::Internal(format!("{}: reshape of a non-activation", node.label))),
                },
                Op::RmsNorm { eps } => {
                    let (x, wt, n) = (f(0), vecf(1), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::rms_norm::rms_norm(i, o, x, &wt, n, F::from_f32(*eps)));
                    Value::F(out)
                }
                Op::RmsNormPlain { eps } => {
                    let (x, n) = (f(0), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::rms_norm_plain::rms_norm_plain(i, o, x, n, F::from_f32(*eps)));
                    Value::F(out)
                }
                Op::Add => {
                    let (a, b, n) = (f(0), f(1), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::add::add(i, o, a, b, n));
                    Value::F(out)
                }
                Op::HcBroadcast { nh } => {
                    let (x, d) = (f(0), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, nh * d, |i, o| k::hc_broadcast::hc_broadcast(i, o, x, *nh, d));
                    Value::F(out)
                }
                Op::HcMix { nh, iters, eps } => {
                    let (m, scale, base) = (f(0), vecf(1), vecf(2));
                    let mw = last(0);
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, mw, |i, o| k::hc_mix::hc_mix(i, o, m, &scale, &base, *nh, *iters, F::from_f32(*eps)));
                    Value::F(out)
                }
                Op::HcHeadMix { nh, eps } => {
                    let (m, scale, base) = (f(0), vecf(1), vecf(2));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, *nh, |i, o| k::hc_head_mix::hc_head_mix(i, o, m, &scale, &base, *nh, F::from_f32(*eps)));
                    Value::F(out)
                }
                Op::HcCollapse { nh } => {
                    let (r, mix, d, mw) = (f(0), f(1), last(0), last(1));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, d, |i, o| k::hc_collapse::hc_collapse(i, o, r, mix, *nh, d, mw));
                    Value::F(out)
                }
                Op::HcExpand { nh } => {
                    let (y, r, mix, d) = (f(0), f(1), f(2), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, nh * d, |i, o| k::hc_expand::hc_expand(i, o, y, r, mix, *nh, d));
                    Value::F(out)
                }
                Op::Rope { n_rot, inv_freq, pos, inverse } => {
                    let x = f(0);
                    let (heads, hd) = (shape[1], shape[2]);
                    let freq: Vec<F> = inv_freq.iter().map(|&v| F::from_f64(v)).collect();
                    let (base, mult) = match pos {
                        RopePos::Tokens => (bind.pos0, 1),
                        RopePos::Compressed { ratio } => (bind.pos0 / ratio, *ratio),
                    };
                    let sign = if *inverse { -F::one() } else { F::one() };
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, hd, |i, o| k::rope::rope(i, o, x, &freq, heads, hd, *n_rot, base, mult, sign));
                    Value::F(out)
                }
                Op::Fp8RoundTrip { n_nope } => {
                    let (x, wd) = (f(0), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, wd, |i, o| k::fp8_roundtrip::fp8_roundtrip(i, o, x, wd, *n_nope));
                    Value::F(out)
                }
                Op::HadamardFp4 { fp4 } => {
                    let x = f(0);
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, 128, |i, o| k::hadamard_fp4::hadamard_fp4(i, o, x, *fp4));
                    Value::F(out)
                }
                Op::RouterScores => {
                    let (x, n) = (f(0), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::router_scores::router_scores(i, o, x, n));
                    Value::F(out)
                }
                Op::RouterBiased => {
                    let (x, b, n) = (f(0), vecf(1), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::router_biased::router_biased(i, o, x, &b, n));
                    Value::F(out)
                }
                Op::RouterHash { k } => {
                    let (ids, tbl) = (iv(0), w(1).to_i32());
                    let vocab = tbl.len() / k;
                    if let Some(bad) = ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                        return Err(ExecError::Input(format!("token id {bad} is outside the hash table (size {vocab})")));
                    }
                    let mut out = vec![0i32; n_out];
                    launch(&mut out, *k, |i, o| k::router_hash::router_hash(i, o, ids, &tbl, *k));
                    Value::I(out)
                }
                Op::TopK { k } => {
                    let (x, n) = (f(0), last(0));
                    let mut out = vec![0i32; n_out];
                    launch(&mut out, *k, |i, o| k::top_k::top_k(i, o, x, n, *k));
                    Value::I(out)
                }
                Op::RouterWeights { scale, normalize } => {
                    let (s, sel, n, k) = (f(0), iv(1), last(0), last(1));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, k, |i, o| k::router_weights::router_weights(i, o, s, sel, n, k, F::from_f32(*scale), *normalize));
                    Value::F(out)
                }
                Op::SwiGlu { clamp } => {
                    let (g_, u, n) = (f(0), f(1), last(0));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n, |i, o| k::swiglu::swiglu(i, o, g_, u, n, F::from_f32(*clamp)));
                    Value::F(out)
                }
                Op::WindowKv { slot, window } => Value::F(slot_ops::window_kv(state, *slot, *window, last(0), f(0), bind, &node.label)?.to_vec()),
                Op::CompressPool { slot, ratio, overlap, width } => {
                    let wd = *width;
                    let logs = slot_ops::compress_log(state, *slot, *ratio, *overlap, last(0), f(0), f(1), shape[0], bind, &node.label)?;
                    // The new rows' slots gathered from the logs (kv, then gate + ape), pooled.
                    let (slots, ape) = (slot_ops::pool_slots(*ratio, *overlap), vecf(2));
                    let per_row = slots * wd;
                    let mut gathered = zeros::<F>(2 * logs.n_rows * per_row);
                    launch(&mut gathered, per_row, |i, o| k::compress_gather::compress_gather(i, o, logs.kv, logs.gate, &ape, logs.n_rows, logs.first_row, logs.first, *ratio, slots, wd));
                    let (kv, gate) = gathered.split_at(logs.n_rows * per_row);
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, wd, |i, o| k::compress_pool::compress_pool(i, o, kv, gate, slots, wd));
                    Value::F(out)
                }
                Op::RowCache { slot, ratio } => Value::F(slot_ops::row_cache(state, *slot, *ratio, last(0), f(0), bind, &node.label)?.to_vec()),
                Op::IndexerScores { ratio } => {
                    let (q, wt, rws) = (f(0), f(1), f(2));
                    let (qs, n_rows) = (in_shape(0), shape[1]);
                    let (heads, dk) = (qs[1], qs[2]);
                    // Per (token, head), then per token (`indexer_head_dots`).
                    let mut dots = zeros::<F>(n_out * heads);
                    launch(&mut dots, n_rows, |i, o| k::indexer_head_dots::indexer_head_dots(i, o, q, rws, n_rows, heads, dk, bind.pos0, *ratio));
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, n_rows, |i, o| k::indexer_combine::indexer_combine(i, o, &dots, wt, n_rows, heads, dk, bind.pos0, *ratio));
                    Value::F(out)
                }
                Op::Attention { window, ratio, comp } => {
                    let comp = if all_rows.every_row(id, bind) { &CompMode::Causal } else { comp };
                    let (q, win, sinks) = (f(0), f(1), vecf(2));
                    let (heads, hd) = (shape[1], shape[2]);
                    let n_win = in_shape(1)[0];
                    let win_pos0 = bind.pos0 - bind.window_prior(*window);
                    let empty_f: Vec<F> = Vec::new();
                    let empty_i: Vec<i32> = Vec::new();
                    let (comp_rows, n_comp) = if *comp != CompMode::None { (f(3), in_shape(3)[0]) } else { (&empty_f[..], 0) };
                    let (sel, k_sel) = if *comp == CompMode::Selected { (iv(4), last(4)) } else { (&empty_i[..], 0) };
                    let mode = match comp {
                        CompMode::None => attention::COMP_NONE,
                        CompMode::Causal => attention::COMP_CAUSAL,
                        CompMode::Selected => attention::COMP_SELECTED,
                    };
                    let scale = F::one() / F::from_usize(hd).sqrt();
                    // One chunk per (token, head) here (`attention_partial`), then the merge.
                    let mut part = zeros::<F>(n_out / hd * (hd + 2));
                    launch(&mut part, hd + 2, |i, o| {
                        k::attention_partial::attention_partial(i, o, q, win, comp_rows, sel, &sinks, heads, hd, bind.pos0, win_pos0, n_win, *window, n_comp, mode, *ratio, k_sel, scale, 1)
                    });
                    let mut out = zeros::<F>(n_out);
                    launch(&mut out, hd, |i, o| k::attention_merge::attention_merge(i, o, &part, hd, 1));
                    Value::F(out)
                }
            };
            vals.insert(id.index(), value);
            // Free inputs whose last user this was.
            for i in &ins {
                if last_use[i.index()] == k {
                    vals.insert(i.index(), Value::Freed);
                }
            }
        }
        let end = bind.pos0 + bind.tokens;
        state.trim(end);
        let mut outs = HashMap::new();
        for (name, id) in &g.outputs {
            match vals.remove(&id.index()) {
                Some(Value::F(v)) => {
                    outs.insert(name.clone(), v);
                }
                _ => return Err(ExecError::Internal(format!("output '{name}' has no float value"))),
            }
            // The same node may be marked twice; put a copy back for the next name.
            if let Some(v) = outs.get(name) {
                vals.insert(id.index(), Value::F(v.clone()));
            }
        }
        Ok(outs)
    }
}
