//! The DS4 forward pass as a graph, for a layer range [start, end).
//!
//! Input: token ids (always: hash-routed layers read them) and, when the range does not
//! start at layer 0, the incoming hyper-connection residual. Output: logits when the range
//! ends at the last layer (and logits are asked for), else the outgoing residual. Every
//! weight is checked against the tensor table as it is added: presence, shape, and a type
//! the engine supports; a refusal names the tensor.

use crate::hparams::{HParams, CSA_RATIO};
use ds4_ir::{CompMode, DType, Dim, GgmlType, Graph, IrError, NodeId, Op, RopePos, Shape, TensorType};
use std::ops::Range;

/// Where a tensor's type and GGUF dims (ne order) come from.
pub trait TensorTable {
    fn lookup(&self, name: &str) -> Option<(GgmlType, Vec<u64>)>;
}

#[derive(Clone, Debug, PartialEq)]
pub struct GraphOptions {
    pub layers: Range<usize>,
    /// Produce logits after the last layer (only if `layers.end == n_layer`).
    pub logits: bool,
    /// Drop the two activation round trips (FP8 KV; Hadamard + FP4 on the indexer).
    pub plain: bool,
    /// Also output `residual.L` after each layer (for parity tests).
    pub residuals: bool,
    /// Logits of the batch's last token only (generation needs no more; the output
    /// head is the largest matmul of a step).
    pub last_only: bool,
}

impl GraphOptions {
    pub fn full(hp: &HParams) -> GraphOptions {
        GraphOptions { layers: 0..hp.n_layer, logits: true, plain: false, residuals: false, last_only: false }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("tensor '{0}' is missing from the model file")]
    Missing(String),
    #[error("tensor '{name}': expected ne {expected:?}, found {found:?}")]
    Shape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor '{name}': type {ty} is not supported here (supported: {supported})")]
    Type { name: String, ty: GgmlType, supported: String },
    #[error("graph: {0}")]
    Ir(#[from] IrError),
    #[error("{0}")]
    Options(String),
}

/// Weight types a matrix may have; small vectors must be float.
pub fn supported_weight_types() -> &'static [GgmlType] {
    ds4_ir::quant::supported()
}

/// Number of state slots per layer: window, compressor log, compressed rows,
/// indexer log, indexer rows.
pub const SLOTS_PER_LAYER: usize = 5;

struct Builder<'a> {
    hp: &'a HParams,
    tt: &'a dyn TensorTable,
    g: Graph,
}

impl Builder<'_> {
    /// A weight node; `ne` is the GGUF shape the graph needs.
    fn weight(&mut self, name: &str, ne: &[usize], float_only: bool) -> Result<NodeId, BuildError> {
        let (ty, found) = self.tt.lookup(name).ok_or_else(|| BuildError::Missing(name.to_string()))?;
        let expected: Vec<u64> = ne.iter().map(|&n| n as u64).collect();
        // Trailing 1-dims are equivalent in GGUF; compare without them.
        let trim = |v: &[u64]| {
            let mut v = v.to_vec();
            while v.len() > 1 && *v.last().unwrap() == 1 {
                v.pop();
            }
            v
        };
        if trim(&found) != trim(&expected) {
            return Err(BuildError::Shape { name: name.to_string(), expected, found });
        }
        let supported = supported_weight_types();
        let ok = if ty == GgmlType::I32 { !float_only } else { supported.contains(&ty) && (!float_only || !ty.is_quantized()) };
        if !ok {
            let names: Vec<&str> = supported.iter().filter(|t| !t.is_device_layout()).map(|t| t.name()).collect();
            return Err(BuildError::Type { name: name.to_string(), ty, supported: names.join(", ") });
        }
        let shape: Vec<Dim> = ne.iter().rev().map(|&n| Dim::Const(n)).collect();
        let op = Op::Weight { name: name.to_string(), ty: TensorType { dtype: DType::Weight(ty), shape: Shape(shape) } };
        Ok(self.g.add(name, op, &[])?)
    }

    fn add(&mut self, label: &str, op: Op, ins: &[NodeId]) -> Result<NodeId, BuildError> {
        Ok(self.g.add(label, op, ins)?)
    }

    fn reshape(&mut self, label: &str, x: NodeId, dims: &[Dim]) -> Result<NodeId, BuildError> {
        self.add(label, Op::Reshape { shape: Shape::of(dims) }, &[x])
    }

    fn matmul(&mut self, label: &str, x: NodeId, w: &str, k: usize, n: usize) -> Result<NodeId, BuildError> {
        let w = self.weight(w, &[k, n], false)?;
        self.add(label, Op::MatMul, &[x, w])
    }

    fn norm(&mut self, label: &str, x: NodeId, w: &str, n: usize) -> Result<NodeId, BuildError> {
        let w = self.weight(w, &[n], true)?;
        self.add(label, Op::RmsNorm { eps: self.hp.rms_eps }, &[x, w])
    }

    /// HC mixing weights of one block: flatten the streams, RMSNorm, project, Sinkhorn.
    fn hc_mix(&mut self, p: &str, r: NodeId) -> Result<NodeId, BuildError> {
        let (hc, d) = (self.hp.hc, self.hp.d);
        let mw = ds4_ir::kernels::hc::mix_width(hc);
        let flat = self.reshape(&format!("{p}.flat"), r, &[Dim::Tokens, Dim::Const(hc * d)])?;
        let normed = self.add(&format!("{p}.norm"), Op::RmsNormPlain { eps: self.hp.rms_eps }, &[flat])?;
        let m = self.matmul(&format!("{p}.proj"), normed, &format!("{p}_fn.weight"), hc * d, mw)?;
        let scale = self.weight(&format!("{p}_scale.weight"), &[3], true)?;
        let base = self.weight(&format!("{p}_base.weight"), &[mw], true)?;
        self.add(&format!("{p}.mix"), Op::HcMix { nh: hc, iters: self.hp.hc_iters, eps: self.hp.hc_eps }, &[m, scale, base])
    }

    /// A compressor: project, pool windows, norm, RoPE at the rows' positions, and the
    /// round trip (FP8 for the attention rows, Hadamard + FP4 for the indexer rows).
    #[allow(clippy::too_many_arguments)]
    fn compressor(&mut self, p: &str, a: NodeId, ratio: usize, width: usize, slot: usize, indexer: bool, plain: bool) -> Result<NodeId, BuildError> {
        let hp = self.hp;
        let overlap = ratio == CSA_RATIO;
        let cw = if overlap { 2 * width } else { width };
        let kvc = self.matmul(&format!("{p}.kv"), a, &format!("{p}_kv.weight"), hp.d, cw)?;
        let gc = self.matmul(&format!("{p}.gate"), a, &format!("{p}_gate.weight"), hp.d, cw)?;
        let ape = self.weight(&format!("{p}_ape.weight"), &[cw, ratio], true)?;
        let pooled = self.add(&format!("{p}.pool"), Op::CompressPool { slot, ratio, overlap, width }, &[kvc, gc, ape])?;
        let normed = self.norm(&format!("{p}.norm"), pooled, &format!("{p}_norm.weight"), width)?;
        let heads = self.reshape(&format!("{p}.heads"), normed, &[Dim::NewRows(ratio), Dim::Const(1), Dim::Const(width)])?;
        let rope = Op::Rope { n_rot: hp.n_rot, inv_freq: hp.inv_freq(true), pos: RopePos::Compressed { ratio }, inverse: false };
        let mut x = self.add(&format!("{p}.rope"), rope, &[heads])?;
        x = self.reshape(&format!("{p}.rows"), x, &[Dim::NewRows(ratio), Dim::Const(width)])?;
        if indexer {
            if !plain {
                x = self.add(&format!("{p}.fp4"), Op::HadamardFp4 { fp4: true }, &[x])?;
            }
        } else if !plain {
            x = self.add(&format!("{p}.fp8"), Op::Fp8RoundTrip { n_nope: width - hp.n_rot }, &[x])?;
        }
        self.add(&format!("{p}.cache"), Op::RowCache { slot: slot + 1, ratio }, &[x])
    }

    fn attention(&mut self, l: usize, r: NodeId, plain: bool) -> Result<NodeId, BuildError> {
        let hp = self.hp;
        let (d, h, hd) = (hp.d, hp.n_head, hp.hd);
        let p = format!("blk.{l}");
        let ratio = hp.compress_ratios[l];
        let slot0 = l * SLOTS_PER_LAYER;
        let mix = self.hc_mix(&format!("{p}.hc_attn"), r)?;
        let x = self.add(&format!("{p}.attn.in"), Op::HcCollapse { nh: hp.hc }, &[r, mix])?;
        let a = self.norm(&format!("{p}.attn.norm"), x, &format!("{p}.attn_norm.weight"), d)?;
        // Queries: low rank, normed, per-head RMS, RoPE.
        let qa = self.matmul(&format!("{p}.q_a"), a, &format!("{p}.attn_q_a.weight"), d, hp.q_lora)?;
        let qr = self.norm(&format!("{p}.q_a.norm"), qa, &format!("{p}.attn_q_a_norm.weight"), hp.q_lora)?;
        let q = self.matmul(&format!("{p}.q_b"), qr, &format!("{p}.attn_q_b.weight"), hp.q_lora, h * hd)?;
        let q = self.reshape(&format!("{p}.q.heads"), q, &[Dim::Tokens, Dim::Const(h), Dim::Const(hd)])?;
        let q = self.add(&format!("{p}.q.norm"), Op::RmsNormPlain { eps: hp.rms_eps }, &[q])?;
        let freq = hp.inv_freq(ratio != 0);
        let rope = Op::Rope { n_rot: hp.n_rot, inv_freq: freq.clone(), pos: RopePos::Tokens, inverse: false };
        let q = self.add(&format!("{p}.q.rope"), rope.clone(), &[q])?;
        // The one shared K=V head.
        let kv = self.matmul(&format!("{p}.kv"), a, &format!("{p}.attn_kv.weight"), d, hd)?;
        let kv = self.norm(&format!("{p}.kv.norm"), kv, &format!("{p}.attn_kv_a_norm.weight"), hd)?;
        let kv = self.reshape(&format!("{p}.kv.heads"), kv, &[Dim::Tokens, Dim::Const(1), Dim::Const(hd)])?;
        let kv = self.add(&format!("{p}.kv.rope"), rope, &[kv])?;
        let mut kv = self.reshape(&format!("{p}.kv.rows"), kv, &[Dim::Tokens, Dim::Const(hd)])?;
        if !plain {
            kv = self.add(&format!("{p}.kv.fp8"), Op::Fp8RoundTrip { n_nope: hd - hp.n_rot }, &[kv])?;
        }
        let win = self.add(&format!("{p}.kv.window"), Op::WindowKv { slot: slot0, window: hp.window }, &[kv])?;
        let sinks = self.weight(&format!("{p}.attn_sinks.weight"), &[h], true)?;
        let o = if ratio == 0 {
            self.add(&format!("{p}.attn"), Op::Attention { window: hp.window, ratio: 1, comp: CompMode::None }, &[q, win, sinks])?
        } else {
            let rows = self.compressor(&format!("{p}.attn_compressor"), a, ratio, hd, slot0 + 1, false, plain)?;
            if ratio == CSA_RATIO {
                let (ih, id) = (hp.idx_heads, hp.idx_dim);
                let irows = self.compressor(&format!("{p}.indexer_compressor"), a, ratio, id, slot0 + 3, true, plain)?;
                let iq = self.matmul(&format!("{p}.indexer.q"), qr, &format!("{p}.indexer.attn_q_b.weight"), hp.q_lora, ih * id)?;
                let iq = self.reshape(&format!("{p}.indexer.q.heads"), iq, &[Dim::Tokens, Dim::Const(ih), Dim::Const(id)])?;
                let irope = Op::Rope { n_rot: hp.n_rot, inv_freq: hp.inv_freq(true), pos: RopePos::Tokens, inverse: false };
                let mut iq = self.add(&format!("{p}.indexer.q.rope"), irope, &[iq])?;
                if !plain {
                    iq = self.add(&format!("{p}.indexer.q.fp4"), Op::HadamardFp4 { fp4: true }, &[iq])?;
                }
                let iw = self.matmul(&format!("{p}.indexer.w"), a, &format!("{p}.indexer.proj.weight"), d, ih)?;
                let scores = self.add(&format!("{p}.indexer.scores"), Op::IndexerScores { ratio }, &[iq, iw, irows])?;
                let sel = self.add(&format!("{p}.indexer.top_k"), Op::TopK { k: hp.idx_top_k }, &[scores])?;
                self.add(&format!("{p}.attn"), Op::Attention { window: hp.window, ratio, comp: CompMode::Selected }, &[q, win, sinks, rows, sel])?
            } else {
                self.add(&format!("{p}.attn"), Op::Attention { window: hp.window, ratio, comp: CompMode::Causal }, &[q, win, sinks, rows])?
            }
        };
        // Undo the values' RoPE at the query position, then the grouped output projection.
        let unrope = Op::Rope { n_rot: hp.n_rot, inv_freq: freq, pos: RopePos::Tokens, inverse: true };
        let o = self.add(&format!("{p}.attn.unrope"), unrope, &[o])?;
        let o = self.reshape(&format!("{p}.attn.flat"), o, &[Dim::Tokens, Dim::Const(h * hd)])?;
        let g = hp.o_groups;
        let wa = self.weight(&format!("{p}.attn_output_a.weight"), &[h * hd / g, g * hp.o_lora], false)?;
        let oa = self.add(&format!("{p}.attn.out_a"), Op::GroupedMatMul { groups: g }, &[o, wa])?;
        let y = self.matmul(&format!("{p}.attn.out_b"), oa, &format!("{p}.attn_output_b.weight"), g * hp.o_lora, d)?;
        self.add(&format!("{p}.attn.post"), Op::HcExpand { nh: hp.hc }, &[y, r, mix])
    }

    fn ffn(&mut self, l: usize, r: NodeId, ids: NodeId) -> Result<NodeId, BuildError> {
        let hp = self.hp;
        let (d, e, k, ff) = (hp.d, hp.n_expert, hp.n_expert_used, hp.expert_ff);
        let p = format!("blk.{l}");
        let mix = self.hc_mix(&format!("{p}.hc_ffn"), r)?;
        let x = self.add(&format!("{p}.ffn.in"), Op::HcCollapse { nh: hp.hc }, &[r, mix])?;
        let a = self.norm(&format!("{p}.ffn.norm"), x, &format!("{p}.ffn_norm.weight"), d)?;
        let clamp = hp.swiglu_clamp[l];
        // Shared expert: its width comes from the file (DS4-Flash: the expert width). Built
        // before the routed experts, so that executors have its output when the routed
        // down projection runs (the CUDA decode adds it there: `fusion_plan.rs`).
        let (_, sh_ne) = self.tt.lookup(&format!("{p}.ffn_gate_shexp.weight")).ok_or_else(|| BuildError::Missing(format!("{p}.ffn_gate_shexp.weight")))?;
        let sff = sh_ne.get(1).copied().unwrap_or(0) as usize;
        let sg = self.matmul(&format!("{p}.shexp.gate"), a, &format!("{p}.ffn_gate_shexp.weight"), d, sff)?;
        let su = self.matmul(&format!("{p}.shexp.up"), a, &format!("{p}.ffn_up_shexp.weight"), d, sff)?;
        let sh = self.add(&format!("{p}.shexp.act"), Op::SwiGlu { clamp }, &[sg, su])?;
        let sy = self.matmul(&format!("{p}.shexp.down"), sh, &format!("{p}.ffn_down_shexp.weight"), sff, d)?;
        let logits = self.matmul(&format!("{p}.router"), a, &format!("{p}.ffn_gate_inp.weight"), d, e)?;
        let s = self.add(&format!("{p}.router.scores"), Op::RouterScores, &[logits])?;
        let sel = if hp.is_hash_layer(l) {
            let tbl = self.weight(&format!("{p}.ffn_gate_tid2eid.weight"), &[k, hp.vocab], false)?;
            self.add(&format!("{p}.router.hash"), Op::RouterHash { k }, &[ids, tbl])?
        } else {
            let bias = self.weight(&format!("{p}.exp_probs_b.bias"), &[e], true)?;
            let b = self.add(&format!("{p}.router.biased"), Op::RouterBiased, &[s, bias])?;
            self.add(&format!("{p}.router.top_k"), Op::TopK { k }, &[b])?
        };
        let w = self.add(
            &format!("{p}.router.weights"),
            Op::RouterWeights { scale: hp.expert_weights_scale, normalize: hp.expert_weights_norm },
            &[s, sel],
        )?;
        let gate = self.weight(&format!("{p}.ffn_gate_exps.weight"), &[d, ff, e], false)?;
        let up = self.weight(&format!("{p}.ffn_up_exps.weight"), &[d, ff, e], false)?;
        let down = self.weight(&format!("{p}.ffn_down_exps.weight"), &[ff, d, e], false)?;
        let routed = self.add(&format!("{p}.moe"), Op::MoeExperts { clamp }, &[a, sel, w, gate, up, down])?;
        let y = self.add(&format!("{p}.ffn.out"), Op::Add, &[routed, sy])?;
        self.add(&format!("{p}.ffn.post"), Op::HcExpand { nh: hp.hc }, &[y, r, mix])
    }

    fn head(&mut self, r: NodeId) -> Result<NodeId, BuildError> {
        let hp = self.hp;
        let (hc, d) = (hp.hc, hp.d);
        let rows = self.g.node(r).ty.shape.0[0];
        let flat = self.reshape("head.flat", r, &[rows, Dim::Const(hc * d)])?;
        let normed = self.add("head.hc_norm", Op::RmsNormPlain { eps: hp.rms_eps }, &[flat])?;
        let m = self.matmul("head.hc_proj", normed, "output_hc_fn.weight", hc * d, hc)?;
        let scale = self.weight("output_hc_scale.weight", &[1], true)?;
        let base = self.weight("output_hc_base.weight", &[hc], true)?;
        let pre = self.add("head.hc_pre", Op::HcHeadMix { nh: hc, eps: hp.hc_eps }, &[m, scale, base])?;
        let x = self.add("head.collapse", Op::HcCollapse { nh: hc }, &[r, pre])?;
        let x = self.norm("head.norm", x, "output_norm.weight", d)?;
        self.matmul("logits", x, "output.weight", d, hp.vocab)
    }
}

/// Build the forward-pass graph for `opts.layers`. Inputs: `ids` (i32 [T]) and, for a
/// range not starting at 0, `residual` (f32 [T, nh, D]). Outputs: `logits` or `residual`,
/// plus `residual.L` per layer with `opts.residuals`.
pub fn build_graph(hp: &HParams, tt: &dyn TensorTable, opts: &GraphOptions) -> Result<Graph, BuildError> {
    let Range { start, end } = opts.layers.clone();
    if start > end || end > hp.n_layer {
        return Err(BuildError::Options(format!("layer range {start}..{end} is outside 0..{}", hp.n_layer)));
    }
    let mut b = Builder { hp, tt, g: Graph::new() };
    let ids = b.add("ids", Op::Input { name: "ids".into(), ty: TensorType::i32(&[Dim::Tokens]) }, &[])?;
    let mut r = if start == 0 {
        let table = b.weight("token_embd.weight", &[hp.d, hp.vocab], false)?;
        let x = b.add("embed", Op::Embed, &[ids, table])?;
        b.add("embed.streams", Op::HcBroadcast { nh: hp.hc }, &[x])?
    } else {
        let ty = TensorType::f32(&[Dim::Tokens, Dim::Const(hp.hc), Dim::Const(hp.d)]);
        b.add("residual.in", Op::Input { name: "residual".into(), ty }, &[])?
    };
    for l in start..end {
        r = b.attention(l, r, opts.plain)?;
        r = b.ffn(l, r, ids)?;
        if opts.residuals {
            b.g.mark_output(format!("residual.{l}"), r);
        }
    }
    if opts.logits && end == hp.n_layer {
        if opts.last_only {
            r = b.add("head.last", Op::LastRow, &[r])?;
        }
        let logits = b.head(r)?;
        b.g.mark_output("logits", logits);
    } else {
        b.g.mark_output("residual", r);
    }
    Ok(b.g)
}
