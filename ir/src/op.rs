//! The op set of the DS4 forward pass, with shape and type inference.
//!
//! Ops are coarse where the math is one concept (attention with sinks, a compressor's
//! pooling) and fine where it is shared (RMSNorm, matmul). Every op's float math lives in
//! a kernel body in `kernels/`, which is also its float64 reference; weights stay in their
//! GGUF type (quantized or not) and are read through the quant declarations.

use crate::dtype::DType;
use crate::shape::{Dim, Shape};
use std::fmt;

/// A tensor's type: element type and symbolic shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn f32(dims: &[Dim]) -> TensorType {
        TensorType { dtype: DType::F32, shape: Shape::of(dims) }
    }
    pub fn i32(dims: &[Dim]) -> TensorType {
        TensorType { dtype: DType::I32, shape: Shape::of(dims) }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Index of a piece of per-session state (a KV window, a compressor's token log, a
/// compressed-row cache). The builder hands them out; the runtime keeps one state per slot.
pub type Slot = usize;

/// Where a RoPE'd row sits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopePos {
    /// Row t of the batch is at position pos0 + t.
    Tokens,
    /// Row j of the batch's new compressed rows is row floor(pos0/r) + j, at position (that)·r.
    Compressed { ratio: usize },
}

/// Which compressed rows attention reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompMode {
    None,
    /// Every row i < (t+1)/r (HCA).
    Causal,
    /// The indexer's picks (CSA).
    Selected,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input (token ids, an incoming residual).
    Input { name: String, ty: TensorType },
    /// A weight from the model's tensor table. Shape is row-major: a GGUF matrix with
    /// ne = [K, N] is [N, K] here (N rows of K).
    Weight { name: String, ty: TensorType },
    /// Rows of a [V, D] table picked by ids [T] → [T, D].
    Embed,
    /// x [.., K] · W[N, K]ᵀ → [.., N], any weight type.
    MatMul,
    /// Block-diagonal matmul: x [T, g·Kg] with W [g·Ng, Kg]; group j of x meets rows
    /// j·Ng..(j+1)·Ng of W → [T, g·Ng].
    GroupedMatMul { groups: usize },
    /// Routed experts with clamped SwiGLU: (a [T,D], sel [T,k], w [T,k], gate [E,F,D],
    /// up [E,F,D], down [E,D,F]) → [T, D]. Only the selected experts' rows are read.
    MoeExperts { clamp: f32 },
    /// Same elements, new shape.
    Reshape { shape: Shape },
    /// The last row of [T, ...] → [1, ...] (logits for the last token only).
    LastRow,
    /// RMSNorm over the last dim, times a weight.
    RmsNorm { eps: f32 },
    /// RMSNorm over the last dim, no weight.
    RmsNormPlain { eps: f32 },
    Add,
    /// [T, D] → [T, nh, D]: the embedding copied into every stream.
    HcBroadcast { nh: usize },
    /// (m [T, 2nh+nh²], scale [3], base [2nh+nh²]) → mix [T, 2nh+nh²] (pre, post, comb).
    HcMix { nh: usize, iters: usize, eps: f32 },
    /// (m [T, nh], scale [1], base [nh]) → pre [T, nh].
    HcHeadMix { nh: usize, eps: f32 },
    /// (R [T, nh, D], mix [T, ≥nh]) → Σ pre_i R_i [T, D].
    HcCollapse { nh: usize },
    /// (y [T, D], R [T, nh, D], mix) → R' [T, nh, D].
    HcExpand { nh: usize },
    /// Interleaved RoPE on the last n_rot channels of x [rows, heads, hd].
    Rope { n_rot: usize, inv_freq: Vec<f64>, pos: RopePos, inverse: bool },
    /// FP8 E4M3 round trip of the first n_nope channels of each row.
    Fp8RoundTrip { n_nope: usize },
    /// Hadamard-128 of each 128-row, then (if fp4) an FP4 E2M1 round trip.
    HadamardFp4 { fp4: bool },
    /// sqrt(softplus(logits)).
    RouterScores,
    /// scores + bias [E] (selection only).
    RouterBiased,
    /// Hash routing: (ids [T], table [V, k] i32) → sel [T, k].
    RouterHash { k: usize },
    /// Top-k of each row, ties to the lower index, -1 for missing picks → [.., k] i32.
    TopK { k: usize },
    /// (scores [T, E], sel [T, k]) → w [T, k].
    RouterWeights { scale: f32, normalize: bool },
    /// Clamped SwiGLU (g, u) → h.
    SwiGlu { clamp: f32 },
    /// Stateful: new kv rows [T, w] → the window keys [WindowKeys, w] (kept rows from
    /// earlier batches, then these).
    WindowKv { slot: Slot, window: usize },
    /// Stateful: (kvc [T, c·w], gc [T, c·w], ape [r, c·w]) → pooled new rows [NewRows(r), w].
    /// With `overlap` (CSA, c = 2) a row pools the A halves of the previous window and
    /// the B halves of its own.
    CompressPool { slot: Slot, ratio: usize, overlap: bool, width: usize },
    /// Stateful: new rows [NewRows(r), w] → every row so far [TotalRows(r), w].
    RowCache { slot: Slot, ratio: usize },
    /// (iq [T, IH, dk], w [T, IH], rows [TotalRows(r), dk]) → scores [T, TotalRows(r)].
    IndexerScores { ratio: usize },
    /// (q [T, H, hd], window keys, sinks [H], compressed rows?, selection?) → [T, H, hd].
    Attention { window: usize, ratio: usize, comp: CompMode },
}

/// A type error found while building a graph.
#[derive(Clone, Debug, PartialEq)]
pub struct IrError(pub String);

impl fmt::Display for IrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for IrError {}

fn err<T>(op: &Op, msg: String) -> Result<T, IrError> {
    Err(IrError(format!("{}: {msg}", op.name())))
}

fn dims(t: &TensorType) -> &[Dim] {
    &t.shape.0
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Weight { .. } => "weight",
            Op::Embed => "embed",
            Op::MatMul => "matmul",
            Op::GroupedMatMul { .. } => "grouped_matmul",
            Op::MoeExperts { .. } => "moe_experts",
            Op::Reshape { .. } => "reshape",
            Op::LastRow => "last_row",
            Op::RmsNorm { .. } => "rms_norm",
            Op::RmsNormPlain { .. } => "rms_norm_plain",
            Op::Add => "add",
            Op::HcBroadcast { .. } => "hc_broadcast",
            Op::HcMix { .. } => "hc_mix",
            Op::HcHeadMix { .. } => "hc_head_mix",
            Op::HcCollapse { .. } => "hc_collapse",
            Op::HcExpand { .. } => "hc_expand",
            Op::Rope { .. } => "rope",
            Op::Fp8RoundTrip { .. } => "fp8_roundtrip",
            Op::HadamardFp4 { .. } => "hadamard_fp4",
            Op::RouterScores => "router_scores",
            Op::RouterBiased => "router_biased",
            Op::RouterHash { .. } => "router_hash",
            Op::TopK { .. } => "top_k",
            Op::RouterWeights { .. } => "router_weights",
            Op::SwiGlu { .. } => "swiglu",
            Op::WindowKv { .. } => "window_kv",
            Op::CompressPool { .. } => "compress_pool",
            Op::RowCache { .. } => "row_cache",
            Op::IndexerScores { .. } => "indexer_scores",
            Op::Attention { .. } => "attention",
        }
    }

    /// Number of inputs the op takes (attention's optional inputs counted by mode).
    fn arity(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Weight { .. } => 0,
            Op::Reshape { .. }
            | Op::LastRow
            | Op::RmsNormPlain { .. }
            | Op::HcBroadcast { .. }
            | Op::Rope { .. }
            | Op::Fp8RoundTrip { .. }
            | Op::HadamardFp4 { .. }
            | Op::RouterScores
            | Op::TopK { .. }
            | Op::WindowKv { .. }
            | Op::RowCache { .. } => 1,
            Op::Embed
            | Op::MatMul
            | Op::GroupedMatMul { .. }
            | Op::RmsNorm { .. }
            | Op::Add
            | Op::HcCollapse { .. }
            | Op::RouterBiased
            | Op::RouterHash { .. }
            | Op::RouterWeights { .. }
            | Op::SwiGlu { .. } => 2,
            Op::HcMix { .. } | Op::HcHeadMix { .. } | Op::HcExpand { .. } | Op::CompressPool { .. } | Op::IndexerScores { .. } => 3,
            Op::MoeExperts { .. } => 6,
            Op::Attention { comp, .. } => match comp {
                CompMode::None => 3,
                CompMode::Causal => 4,
                CompMode::Selected => 5,
            },
        }
    }

    /// The output type for these input types, or an error naming the mismatch.
    pub fn infer(&self, ins: &[&TensorType]) -> Result<TensorType, IrError> {
        use Dim::*;
        if ins.len() != self.arity() {
            return err(self, format!("takes {} inputs, got {}", self.arity(), ins.len()));
        }
        let want_f32 = |i: usize| -> Result<(), IrError> {
            if ins[i].dtype != DType::F32 {
                return err(self, format!("input {i} must be f32, got {}", ins[i]));
            }
            Ok(())
        };
        let want_i32 = |i: usize| -> Result<(), IrError> {
            if ins[i].dtype != DType::I32 {
                return err(self, format!("input {i} must be i32, got {}", ins[i]));
            }
            Ok(())
        };
        // A small vector parameter may be a weight of any float type or an f32 activation.
        let want_vec = |i: usize, n: Dim| -> Result<(), IrError> {
            let ok = ins[i].dtype != DType::I32 && dims(ins[i]).iter().fold(Some(1usize), |a, d| match (a, d) {
                (Some(a), Const(c)) => Some(a * c),
                _ => None,
            }) == match n {
                Const(c) => Some(c),
                _ => None,
            };
            if !ok {
                return err(self, format!("input {i} must be a float vector of {n}, got {}", ins[i]));
            }
            Ok(())
        };
        let last = |i: usize| dims(ins[i]).last().copied().unwrap_or(Const(1));
        match self {
            Op::Input { ty, .. } | Op::Weight { ty, .. } => Ok(ty.clone()),
            Op::Embed => {
                want_i32(0)?;
                let w = dims(ins[1]);
                if w.len() != 2 || dims(ins[0]).len() != 1 {
                    return err(self, format!("needs ids [T] and a [V, D] table, got {} and {}", ins[0], ins[1]));
                }
                Ok(TensorType::f32(&[dims(ins[0])[0], w[1]]))
            }
            Op::MatMul => {
                want_f32(0)?;
                let w = dims(ins[1]);
                if w.len() != 2 || last(0) != w[1] {
                    return err(self, format!("x {} does not match weight {}", ins[0], ins[1]));
                }
                let mut out = dims(ins[0]).to_vec();
                *out.last_mut().unwrap() = w[0];
                Ok(TensorType::f32(&out))
            }
            Op::GroupedMatMul { groups } => {
                want_f32(0)?;
                let w = dims(ins[1]);
                let (Const(k), Some(Const(wk)), Some(Const(wn))) = (last(0), w.get(1).copied(), w.first().copied()) else {
                    return err(self, format!("needs constant widths, got {} and {}", ins[0], ins[1]));
                };
                if w.len() != 2 || k != groups * wk || wn % groups != 0 {
                    return err(self, format!("x {} does not split into {groups} groups of weight {}", ins[0], ins[1]));
                }
                let mut out = dims(ins[0]).to_vec();
                *out.last_mut().unwrap() = Const(wn);
                Ok(TensorType::f32(&out))
            }
            Op::MoeExperts { .. } => {
                want_f32(0)?;
                want_i32(1)?;
                want_f32(2)?;
                let (g, u, d) = (dims(ins[3]), dims(ins[4]), dims(ins[5]));
                if g.len() != 3 || g != u || d.len() != 3 || d[0] != g[0] || d[1] != g[2] || d[2] != g[1] || last(0) != g[2] {
                    return err(self, format!("expert weights gate {} up {} down {} do not fit x {}", ins[3], ins[4], ins[5], ins[0]));
                }
                if dims(ins[1]) != dims(ins[2]) {
                    return err(self, format!("selection {} and weights {} differ", ins[1], ins[2]));
                }
                Ok(ins[0].clone())
            }
            Op::Reshape { shape } => {
                let a = ins[0].shape.const_elems();
                let b = shape.const_elems();
                // Symbolic dims must stay in place; the constant parts must agree.
                let sym_a: Vec<Dim> = dims(ins[0]).iter().copied().filter(|d| !matches!(d, Const(_))).collect();
                let sym_b: Vec<Dim> = shape.0.iter().copied().filter(|d| !matches!(d, Const(_))).collect();
                let ca: usize = dims(ins[0]).iter().map(|d| if let Const(c) = d { *c } else { 1 }).product();
                let cb: usize = shape.0.iter().map(|d| if let Const(c) = d { *c } else { 1 }).product();
                if sym_a != sym_b || ca != cb || (a.is_some() != b.is_some()) {
                    return err(self, format!("cannot reshape {} to {}", ins[0], shape));
                }
                Ok(TensorType { dtype: ins[0].dtype, shape: shape.clone() })
            }
            Op::LastRow => {
                want_f32(0)?;
                if dims(ins[0]).first() != Some(&Tokens) {
                    return err(self, format!("needs [T, ...], got {}", ins[0]));
                }
                let mut out = dims(ins[0]).to_vec();
                out[0] = Const(1);
                Ok(TensorType::f32(&out))
            }
            Op::RmsNorm { .. } => {
                want_f32(0)?;
                want_vec(1, last(0))?;
                Ok(ins[0].clone())
            }
            Op::RmsNormPlain { .. } | Op::Fp8RoundTrip { .. } | Op::RouterScores => {
                want_f32(0)?;
                if let Op::Fp8RoundTrip { n_nope } = self {
                    if !matches!(last(0), Const(w) if *n_nope <= w && n_nope % 64 == 0) {
                        return err(self, format!("{n_nope} FP8 channels (blocks of 64) do not fit {}", ins[0]));
                    }
                }
                Ok(ins[0].clone())
            }
            Op::HadamardFp4 { .. } => {
                want_f32(0)?;
                if last(0) != Const(128) {
                    return err(self, format!("needs rows of 128, got {}", ins[0]));
                }
                Ok(ins[0].clone())
            }
            Op::Add => {
                want_f32(0)?;
                want_f32(1)?;
                if ins[0] != ins[1] {
                    return err(self, format!("shapes differ: {} vs {}", ins[0], ins[1]));
                }
                Ok(ins[0].clone())
            }
            Op::HcBroadcast { nh } => {
                want_f32(0)?;
                let d = dims(ins[0]);
                if d.len() != 2 {
                    return err(self, format!("needs [T, D], got {}", ins[0]));
                }
                Ok(TensorType::f32(&[d[0], Const(*nh), d[1]]))
            }
            Op::HcMix { nh, .. } => {
                want_f32(0)?;
                let mw = Const(crate::kernels::hc::mix_width(*nh));
                if last(0) != mw {
                    return err(self, format!("needs mix logits of {mw}, got {}", ins[0]));
                }
                want_vec(1, Const(3))?;
                want_vec(2, mw)?;
                Ok(ins[0].clone())
            }
            Op::HcHeadMix { nh, .. } => {
                want_f32(0)?;
                if last(0) != Const(*nh) {
                    return err(self, format!("needs {nh} logits, got {}", ins[0]));
                }
                want_vec(1, Const(1))?;
                want_vec(2, Const(*nh))?;
                Ok(ins[0].clone())
            }
            Op::HcCollapse { nh } => {
                want_f32(0)?;
                want_f32(1)?;
                let r = dims(ins[0]);
                if r.len() != 3 || r[1] != Const(*nh) || dims(ins[1])[0] != r[0] {
                    return err(self, format!("residual {} / mix {} mismatch", ins[0], ins[1]));
                }
                Ok(TensorType::f32(&[r[0], r[2]]))
            }
            Op::HcExpand { nh } => {
                for i in 0..3 {
                    want_f32(i)?;
                }
                let r = dims(ins[1]);
                if r.len() != 3 || r[1] != Const(*nh) || dims(ins[0]) != [r[0], r[2]] || last(2) != Const(2 * nh + nh * nh) {
                    return err(self, format!("y {} / residual {} / mix {} mismatch", ins[0], ins[1], ins[2]));
                }
                Ok(ins[1].clone())
            }
            Op::Rope { n_rot, inv_freq, .. } => {
                want_f32(0)?;
                let ok = dims(ins[0]).len() == 3 && matches!(last(0), Const(hd) if *n_rot <= hd) && n_rot % 2 == 0 && inv_freq.len() == n_rot / 2;
                if !ok {
                    return err(self, format!("needs [rows, heads, hd ≥ {n_rot}], got {}", ins[0]));
                }
                Ok(ins[0].clone())
            }
            Op::RouterBiased => {
                want_f32(0)?;
                want_vec(1, last(0))?;
                Ok(ins[0].clone())
            }
            Op::RouterHash { k } => {
                want_i32(0)?;
                let tbl = dims(ins[1]);
                if ins[1].dtype != DType::Weight(crate::GgmlType::I32) || tbl.len() != 2 || tbl[1] != Const(*k) {
                    return err(self, format!("needs an i32 table [V, {k}], got {}", ins[1]));
                }
                Ok(TensorType::i32(&[dims(ins[0])[0], Const(*k)]))
            }
            Op::TopK { k } => {
                want_f32(0)?;
                let mut out = dims(ins[0]).to_vec();
                *out.last_mut().unwrap() = Const(*k);
                Ok(TensorType::i32(&out))
            }
            Op::RouterWeights { .. } => {
                want_f32(0)?;
                want_i32(1)?;
                Ok(TensorType::f32(dims(ins[1])))
            }
            Op::SwiGlu { .. } => {
                want_f32(0)?;
                want_f32(1)?;
                if ins[0] != ins[1] {
                    return err(self, format!("gate {} and up {} differ", ins[0], ins[1]));
                }
                Ok(ins[0].clone())
            }
            Op::WindowKv { window, .. } => {
                want_f32(0)?;
                Ok(TensorType::f32(&[WindowKeys(*window), last(0)]))
            }
            Op::CompressPool { ratio, overlap, width, .. } => {
                want_f32(0)?;
                want_f32(1)?;
                let c = if *overlap { 2 } else { 1 };
                let cw = Const(c * width);
                let ape = dims(ins[2]);
                if last(0) != cw || ins[0] != ins[1] || ape != [Const(*ratio), cw] {
                    return err(self, format!("kv {} / gate {} / ape {} do not fit ratio {ratio}, width {c}×{width}", ins[0], ins[1], ins[2]));
                }
                Ok(TensorType::f32(&[NewRows(*ratio), Const(*width)]))
            }
            Op::RowCache { ratio, .. } => {
                want_f32(0)?;
                if dims(ins[0])[0] != NewRows(*ratio) {
                    return err(self, format!("needs new rows of ratio {ratio}, got {}", ins[0]));
                }
                Ok(TensorType::f32(&[TotalRows(*ratio), last(0)]))
            }
            Op::IndexerScores { ratio } => {
                for i in 0..3 {
                    want_f32(i)?;
                }
                let (q, w, rows) = (dims(ins[0]), dims(ins[1]), dims(ins[2]));
                if q.len() != 3 || w != [q[0], q[1]] || rows != [TotalRows(*ratio), q[2]] {
                    return err(self, format!("q {} / weights {} / rows {} mismatch", ins[0], ins[1], ins[2]));
                }
                Ok(TensorType::f32(&[q[0], TotalRows(*ratio)]))
            }
            Op::Attention { window, ratio, comp } => {
                want_f32(0)?;
                want_f32(1)?;
                let q = dims(ins[0]);
                if q.len() != 3 || dims(ins[1]) != [WindowKeys(*window), q[2]] {
                    return err(self, format!("q {} / window keys {} mismatch", ins[0], ins[1]));
                }
                want_vec(2, q[1])?;
                if *comp != CompMode::None {
                    want_f32(3)?;
                    if dims(ins[3]) != [TotalRows(*ratio), q[2]] {
                        return err(self, format!("compressed rows {} do not fit q {}", ins[3], ins[0]));
                    }
                }
                if *comp == CompMode::Selected {
                    want_i32(4)?;
                    if dims(ins[4])[0] != q[0] {
                        return err(self, format!("selection {} does not fit q {}", ins[4], ins[0]));
                    }
                }
                Ok(ins[0].clone())
            }
        }
    }

    /// Stateful ops name their slot.
    pub fn slot(&self) -> Option<Slot> {
        match self {
            Op::WindowKv { slot, .. } | Op::CompressPool { slot, .. } | Op::RowCache { slot, .. } => Some(*slot),
            _ => None,
        }
    }
}
