//! The graph executor on the GPU: `crate::exec` with device buffers. Same node order,
//! same shapes, same kernels (the generated CUDA of the same kernel bodies), same errors.
//! The stateful ops' logs live on the device (`DeviceLog`, with `crate::slot_ops`'s
//! bookkeeping), token ids are checked from the host's copy, and the expert ids of a
//! decode step need no check (`expert_ids.rs`): the only read back is the outputs (and,
//! in prefill, each MoE layer's picks, to group the tokens by expert).
//!
//! Here: the walk over the nodes (`run_nodes`), the launch helpers and the side lanes. The
//! launches a node's op may take sit by concern: `matvec.rs` (mat-vecs and matmuls),
//! `digits.rs` (the integer paths and the MoE routing), `hyper.rs` (`hc_pre`, its
//! Sinkhorn, the expand), `rope.rs` (the RoPE chains).

mod digits;
mod hyper;
mod matvec;
mod rope;

use super::compile::{Kernels, Loaded, ParamSig};
use super::profile;
use super::device::{launch, Arg, CudaError, DevSlice, Device, DeviceBuf, MappedI32};
use super::device_log::DeviceLog;
use super::fusion_plan::{self, Branch, FusionPlan};
use super::x_parts::{self, XParts};
use super::placement::{DeviceTensor, DeviceWeights};
use crate::exec::ExecError;
use crate::slot_ops;
use crate::state::SessionState;
use ds4_codegen::quant::cuda_matvec_dense;
use ds4_codegen::{cuda_argmax, cuda_attention, cuda_attention_merge, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix};
use ds4_codegen::quant::{kernel_name, QuantKernelKind};
use ds4_ir::kernels::attention;
use ds4_ir::{Bind, CompMode, Graph, Op, RopePos};
use std::collections::HashMap;

/// Blocks per SM an attention launch aims for.
const ATTENTION_BLOCKS_PER_SM: usize = 4;

/// The most chunks an attention item's rows are split into.
const ATTENTION_MAX_CHUNKS: usize = 32;

/// Chunks an attention launch splits each item's rows into: enough for
/// [`ATTENTION_BLOCKS_PER_SM`] blocks an SM (`blocks`: the launch's blocks at one chunk),
/// at most [`ATTENTION_MAX_CHUNKS`], but no more than one per `min_rows` of the `seen`
/// rows a token may see (window and compressed or selected rows). A decode token of an
/// HCA layer at ctx 2048 sees 144 rows: 32 chunks gave each block a part of one
/// `attention_tiled` tile (16 rows) and the merge 32 partial rows a head to fold, where 9
/// chunks cost the attention no more and the merge less. H200, synthetic q2, decode
/// steady t/s, two rounds (`DS4_ATT_CHUNK_ROWS`, 0 for no floor): none 149.37 / 151.38,
/// 16 rows 152.18 / 151.98, 32 150.55 / 149.19, 64 145.36 / 145.60; ctx 8192 150.79 →
/// 151.47 (16).
fn attention_chunks(blocks: usize, sms: usize, seen: usize, min_rows: usize) -> usize {
    let by_sms = (ATTENTION_BLOCKS_PER_SM * sms / blocks.max(1)).clamp(1, ATTENTION_MAX_CHUNKS);
    if min_rows == 0 {
        by_sms
    } else {
        by_sms.min(seen.div_ceil(min_rows).max(1))
    }
}

/// Rows an attention chunk takes at least: one `attention_tiled` tile.
/// `DS4_ATT_CHUNK_ROWS` overrides it (0: no floor; for measuring).
fn attention_chunk_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("DS4_ATT_CHUNK_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(cuda_attention::TILE_ROWS))
}

/// Iterations a thread takes at least when an op kernel's item is spread over blocks (a
/// decode step's few items): one, so that a decode's small ops (`hc_expand`'s 16384
/// outputs: 32 blocks, not 8) wait out one round of loads. H200, decode at ctx 2048
/// (steady t/s, two runs): 4 a thread 81.8 / 82.5, 2 82.3 / 83.2, 1 83.8 / 84.3.
/// `DS4_OP_PER_THREAD` overrides it (for measuring).
fn op_per_thread() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("DS4_OP_PER_THREAD").ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(1))
}

/// Tokens per block of the SIMT matmul, and rows × tokens of the tensor-core one.
const TOKENS: usize = ds4_codegen::quant::TOKENS as usize;
const MMA_ROWS: usize = ds4_codegen::quant::MMA_ROWS as usize;
const MMA_TOKENS: usize = ds4_codegen::quant::MMA_TOKENS as usize;
use std::sync::Arc;

impl From<CudaError> for ExecError {
    fn from(e: CudaError) -> Self {
        ExecError::Internal(e.to_string())
    }
}

/// Whether side branches of kind `b` run beside the main lane: `DS4_SIDE_BRANCH=0` keeps
/// every node on the main lane, `DS4_SIDE_QUERY=0` the attention's query.
fn branch_on(b: Branch) -> bool {
    !switched_off!("DS4_SIDE_BRANCH") && !(b == Branch::Query && switched_off!("DS4_SIDE_QUERY"))
}

/// Node `id`'s value in, and the inputs whose last reader it is (at `step`) freed.
fn settle(vals: &mut HashMap<usize, GVal>, id: ds4_ir::NodeId, value: GVal, ins: &[ds4_ir::NodeId], step: usize, last_use: &[usize]) {
    vals.insert(id.index(), value);
    for i in ins {
        if last_use[i.index()] == step {
            vals.insert(i.index(), GVal::Freed);
        }
    }
}

/// A fused launch's values: those of the later nodes it made, kept for their turn; the
/// node that ran it has none of its own.
fn fused(made: &mut HashMap<usize, GVal>, ahead: Vec<(usize, GVal)>) -> GVal {
    made.extend(ahead);
    GVal::Freed
}

/// A hyper-connection expand that the launch making its y may make too
/// (`cuda_hc_expand.rs`): its node, the new streams' length (floats), the old streams' and
/// the mix's addresses, nh. The launch that takes it allocates the new streams.
struct ExpandTo {
    node: ds4_ir::NodeId,
    len: usize,
    r: u64,
    mix: u64,
    nh: usize,
}

/// An expand a launch takes, with the new streams' buffer.
type ExpandOut<'e> = (&'e ExpandTo, DeviceBuf);

/// The new streams of an expand a launch made, as its node's value.
fn expand_value((e, out): ExpandOut) -> (usize, GVal) {
    (e.node.index(), GVal::F(DevSlice::whole(out, e.len)))
}

/// The weight a MatMul node reads (its input 1).
fn weight_of(g: &Graph, id: ds4_ir::NodeId) -> Result<String, ExecError> {
    g.weight_name(g.inputs(id)[1]).map(str::to_string).ok_or_else(|| ExecError::Internal(format!("{}: a matmul's weight is not a weight node", g.node(id).label)))
}

/// A RoPE launch's frequencies, position base and multiplier, and sign (`rope_args`).
struct RopeArgs {
    freq: Arc<DeviceBuf>,
    base: usize,
    mult: usize,
    sign: f32,
}

/// A value flowing along an edge: f32 or i32 elements on the device, or a weight.
enum GVal {
    F(DevSlice),
    I(DevSlice),
    W(String),
    Freed,
}

/// A mat-vec launch's operands and shape (`ds4_codegen::quant`): `n` rows of `k` of `w`
/// against x at `x` for `m` output rows; the picked experts `sel` (each of `picks` rows of
/// a token weighted by `wts` and summed, x row `r / x_div`), row groups of `ng` rows
/// reading their own x (`groups`).
struct MatVec<'w> {
    w: &'w DeviceTensor,
    x: u64,
    sel: Option<u64>,
    wts: Option<u64>,
    n: usize,
    k: usize,
    m: usize,
    picks: usize,
    x_div: usize,
    groups: usize,
    ng: usize,
}

impl<'w> MatVec<'w> {
    /// Every row of `w` (n of k) for each of `m` x rows: no picks, one row group.
    fn rows(w: &'w DeviceTensor, x: u64, n: usize, k: usize, m: usize) -> MatVec<'w> {
        MatVec { w, x, sel: None, wts: None, n, k, m, picks: 1, x_div: 1, groups: 1, ng: n }
    }
}

/// Executes one run of a graph (`session.rs` makes one a run): what a run leaves pending
/// (`digits_ahead`, `comb_pending`) ends with it.
pub struct GpuExecutor<'a> {
    pub dev: &'a Arc<Device>,
    pub kernels: &'a Kernels,
    pub weights: &'a DeviceWeights,
    pub graph: &'a Graph,
    /// The fused launches `graph` offers (`fusion_plan.rs`).
    pub plan: &'a FusionPlan,
    /// A one-element buffer bound to pointer params a launch does not read.
    pub dummy: &'a DeviceBuf,
    /// `hc_pre`'s ticket counters (`cuda_hc_pre::MAX_TOKENS` zeros).
    pub hc_counters: &'a DeviceBuf,
    pub freqs: &'a FreqCache,
    /// The first node of this run's open side branch (`lane_for`; `join` clears it).
    pub branch: std::cell::Cell<Option<usize>>,
    /// x's digits made by the routing's launch for the experts' gate and up
    /// (`router_select`), taken by them (`digits_experts`).
    pub digits_ahead: std::cell::RefCell<Option<DigitsAhead>>,
    /// An `hc_pre` launch's Sinkhorn, left for where it goes (`CombHome`).
    pub comb_pending: std::cell::RefCell<Option<CombPending<'a>>>,
}

/// Where an `hc_pre` launch's Sinkhorn goes: out of its grid, which the launch after it
/// waits for, while only the sublayer's expand reads the Sinkhorn (`cuda_hc_pre::HC_COMB`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CombHome {
    /// The FFN's: an `hc_comb` launch at the head of the shared expert's side lane, which
    /// waits for the routed experts' down anyway.
    SharedExpert,
    /// The attention's: a block of its own in the next `matvec_dense_q8_0_r` launch of as
    /// many tokens (`attn_q_a`, with `attn_kv` in a CSA layer), which outlasts it. The
    /// lanes have no time to spare for a launch of its own (RESULTS.md, twenty-second
    /// stop).
    Ride,
}

/// The Sinkhorn an `hc_pre` launch left (`cuda_hc_pre::HC_COMB`): its chain, mix and
/// tokens, and the projections' buffer, kept until it is launched or rides a launch.
pub struct CombPending<'a> {
    home: CombHome,
    chain: &'a super::hc_pre::HcPreChain,
    proj: DeviceBuf,
    mix: u64,
    tokens: usize,
}

/// The digits of the `len` floats at `x` (`x_digits`' outputs), made ahead of their use.
pub struct DigitsAhead {
    x: u64,
    len: usize,
    digits: (DeviceBuf, DeviceBuf, DeviceBuf),
}

/// RoPE frequency tables on the device, uploaded at first use.
pub type FreqCache = std::sync::Mutex<HashMap<Vec<u32>, Arc<DeviceBuf>>>;

/// Named arguments of one launch.
type Named<'n> = [(&'n str, Arg)];
/// Named arguments made to be passed on (`Named` owned).
type NamedArgs = Vec<(&'static str, Arg)>;

/// `ds4_codegen::quant::mma_k_unit` for type `t`.
fn k_unit_of(t: ds4_ir::GgmlType) -> Result<usize, ExecError> {
    let spec = ds4_ir::quant::spec(t).ok_or_else(|| CudaError(format!("{t}: no quant declaration")))?;
    Ok(ds4_codegen::quant::mma_k_unit(spec) as usize)
}

/// `(k_slice, slices)` of a tensor-core matmul of `tiles` blocks over rows of `k`
/// columns: one slice where the tiles fill the GPU, else enough slices to give each of
/// the `sms` SMs two blocks, each slice at least 1024 columns and a multiple of `unit`
/// (`ds4_codegen::quant::mma_k_unit`).
pub fn mma_k_slices(tiles: usize, k: usize, unit: usize, sms: usize) -> (usize, usize) {
    if tiles == 0 || tiles >= sms {
        return (k, 1);
    }
    let want = (2 * sms / tiles).min(k / 1024).max(1);
    let k_slice = k.div_ceil(want).div_ceil(unit).max(1) * unit;
    (k_slice, k.div_ceil(k_slice))
}

impl GpuExecutor<'_> {
    /// Launches kernel `name` over `grid` blocks, its arguments matched by name.
    fn call(&self, name: &str, grid: (u32, u32), named: &Named) -> Result<(), ExecError> {
        let k = self.kernels.get(name)?;
        self.call_loaded(k, name, (grid.0, grid.1, 1), k.dyn_shared, named)
    }

    /// `call` with the kernel already looked up and `shared` bytes of dynamic shared memory.
    fn call_loaded(&self, k: &Loaded, name: &str, grid: (u32, u32, u32), shared: u32, named: &Named) -> Result<(), ExecError> {
        self.call_threads(k, name, grid, k.threads, shared, named)
    }

    /// `call_loaded` with blocks of `threads` (op kernels stride their loops by the block).
    fn call_threads(&self, k: &Loaded, name: &str, grid: (u32, u32, u32), threads: u32, shared: u32, named: &Named) -> Result<(), ExecError> {
        let mut args = Vec::with_capacity(k.params.len());
        for (p, sig) in &k.params {
            let a = named.iter().find(|(n, _)| n == p).map(|(_, a)| *a).ok_or_else(|| CudaError(format!("{name}: no argument for {p}")))?;
            let ok = matches!((sig, a), (ParamSig::Ptr, Arg::Ptr(_)) | (ParamSig::U64, Arg::U64(_)) | (ParamSig::I32, Arg::I32(_)) | (ParamSig::F32, Arg::F32(_)) | (ParamSig::Bool, Arg::Bool(_)));
            if !ok {
                return Err(CudaError(format!("{name}: argument {p} is {a:?}, the kernel takes {sig:?}")).into());
            }
            args.push(a);
        }
        launch(self.dev, &k.func, grid, (threads, 1, 1), shared, &args)?;
        Ok(())
    }

    /// An op kernel over the items of an output of `n_out` floats, `out_len` per item
    /// (its parallel loop over the item's outputs, light work each).
    fn op(&self, name: &str, n_out: usize, out_len: usize, named: &Named) -> Result<GVal, ExecError> {
        self.op_over(name, n_out, out_len, (out_len, op_per_thread()), named)
    }

    /// `op` whose parallel loop has `work.0` iterations per item, at least `work.1` of
    /// them per thread when an item is spread over blocks (see `item_splits`).
    fn op_over(&self, name: &str, n_out: usize, out_len: usize, work: (usize, usize), named: &Named) -> Result<GVal, ExecError> {
        let out = self.dev.alloc(n_out * 4)?;
        if n_out > 0 && out_len > 0 {
            self.items_into(name, out.ptr, n_out / out_len, out_len, work, named)?;
        }
        Ok(GVal::F(DevSlice::whole(out, n_out)))
    }

    /// Op kernel `name` over `items` items of `out_len` floats into `out` (see `op_over`);
    /// a kernel that stages its item's output gets the shared memory for it.
    fn items_into(&self, name: &str, out: u64, items: usize, out_len: usize, work: (usize, usize), named: &Named) -> Result<(), ExecError> {
        let mut all = vec![("out", Arg::Ptr(out))];
        all.extend_from_slice(named);
        let k = self.kernels.get(name)?;
        self.call_threads(k, name, (items as u32, self.item_splits(k, items, work.0, work.1) as u32, 1), self.op_threads(k, items, work.0), k.shared_for(out_len), &all)
    }

    /// The side branch node `id` runs on in a decode step's graph (`fusion_plan.rs`):
    /// `DS4_SIDE_BRANCH=0` keeps every node on the main lane, `DS4_SIDE_QUERY=0` the
    /// attention's query.
    fn lane_of(&self, id: ds4_ir::NodeId) -> Option<Branch> {
        self.plan.side(id).filter(|&b| branch_on(b))
    }

    /// Whether node `i`'s value is made by a main-lane launch after node `o` in graph
    /// order (a weight is made by none; a reshape is its input's value).
    fn main_after(&self, i: ds4_ir::NodeId, o: usize) -> bool {
        match self.graph.node(i).op {
            Op::Weight { .. } => false,
            Op::Reshape { .. } => self.main_after(self.graph.inputs(i)[0], o),
            _ => self.lane_of(i).is_none() && i.index() > o,
        }
    }

    /// Puts node `id`'s launches on the lane `fusion_plan.rs` gives it (`launch_plan.rs`):
    /// a side node opens this run's branch, or first joins it where it reads a main value
    /// made after the branch opened (it would read that value unordered); a main node
    /// that reads the branch's output joins it. Outside a branch a main node touches
    /// nothing.
    fn lane_for(&self, id: ds4_ir::NodeId, ins: &[ds4_ir::NodeId]) -> Result<(), ExecError> {
        if self.lane_of(id).is_some() {
            if self.branch.get().is_some_and(|o| ins.iter().any(|&i| self.main_after(i, o))) {
                self.join()?;
            }
            if self.branch.get().is_none() {
                self.branch.set(Some(id.index()));
            }
            self.dev.lane(true)?;
        } else if self.plan.joins(id) {
            self.join()?;
        } else if self.branch.get().is_some() {
            self.dev.lane(false)?;
        }
        Ok(())
    }

    /// Joins the side branch, if one is open (`Device::join`).
    fn join(&self) -> Result<(), ExecError> {
        self.branch.set(None);
        Ok(self.dev.join()?)
    }

    /// Runs the graph for a batch at `bind`, updating `state`; returns the named outputs.
    /// A decode step (one token) is recorded and submitted as CUDA graphs
    /// (`launch_plan.rs`; `DS4_CUDA_GRAPHS=0` launches one by one).
    pub fn run(&self, state: &mut SessionState<DeviceLog>, bind: Bind, ids: &[i32], residual: Option<&[f32]>) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        self.run_step(state, bind, StepIds::Host(ids), residual, None)
    }

    /// Runs the graph as [`run`](Self::run) does, but reads nothing back: each row of its
    /// logits is picked greedily on the device into `picks` (`cuda_argmax.rs`), where a
    /// later step's ids may come from. The host may queue more before the picks are made.
    pub fn run_greedy(&self, state: &mut SessionState<DeviceLog>, bind: Bind, ids: StepIds, picks: GreedyPicks) -> Result<(), ExecError> {
        self.run_step(state, bind, ids, None, Some(picks)).map(|_| ())
    }

    fn run_step(&self, state: &mut SessionState<DeviceLog>, bind: Bind, ids: StepIds, residual: Option<&[f32]>, greedy: Option<GreedyPicks>) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        let record = bind.tokens == 1 && graphs_enabled();
        if record {
            self.dev.record_launches(true)?;
        }
        let began = self.dev.begin_run();
        let out = began.map_err(ExecError::from).and_then(|_| self.run_nodes(state, bind, ids, residual, greedy));
        self.dev.end_run();
        // A branch left open (a failed step) joins here, and its held buffers return.
        let joined = self.join();
        if record {
            // Stops this run's recording and submits what is queued (after a failed step
            // too: queued launches are whole and valid, and may be another session's).
            let stopped = self.dev.record_launches(false);
            if out.is_ok() {
                stopped?;
            }
        }
        joined?;
        out
    }

    fn run_nodes(&self, state: &mut SessionState<DeviceLog>, bind: Bind, ids: StepIds, residual: Option<&[f32]>, greedy: Option<GreedyPicks>) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        let g = self.graph;
        // Selections that are every row: not made (`crate::all_rows`), and the order
        // without them.
        let skipped = self.plan.all_rows().skipped(bind);
        let schedule = self.plan.schedule(!skipped.is_empty());
        let (order, last_use) = (&schedule.order, &schedule.last_use);
        let mut vals: HashMap<usize, GVal> = HashMap::new();
        // Values made ahead of their node by a fused launch (`hc_pre`, `router_select`,
        // `norm_rope`, a mat-vec group), by node.
        let mut made: HashMap<usize, GVal> = HashMap::new();
        state.ensure_slots(g.n_slots);
        let u = |v: usize| Arg::U64(v as u64);
        let fl = |v: f32| Arg::F32(v);
        for (step, &id) in order.iter().enumerate() {
            let node = g.node(id);
            let label = node.label.as_str();
            let ins = g.inputs(id);
            let shape = node.ty.shape.eval(bind);
            let n_out: usize = shape.iter().product();
            let in_shape = |i: usize| g.node(ins[i]).ty.shape.eval(bind);
            let last = |i: usize| *in_shape(i).last().unwrap_or(&1);
            let rows = |i: usize| {
                let s = in_shape(i);
                s.iter().product::<usize>() / s.last().copied().unwrap_or(1).max(1)
            };
            let fs = |i: usize| -> Result<&DevSlice, ExecError> {
                match vals.get(&ins[i].index()) {
                    Some(GVal::F(s)) => Ok(s),
                    _ => Err(ExecError::Internal(format!("{label}: input {i} is not a float value"))),
                }
            };
            let f = |i: usize| -> Result<Arg, ExecError> { Ok(Arg::Ptr(fs(i)?.ptr())) };
            let is = |i: usize| -> Result<&DevSlice, ExecError> {
                match vals.get(&ins[i].index()) {
                    Some(GVal::I(s)) => Ok(s),
                    _ => Err(ExecError::Internal(format!("{label}: input {i} is not an i32 value"))),
                }
            };
            let iv = |i: usize| -> Result<Arg, ExecError> { Ok(Arg::Ptr(is(i)?.ptr())) };
            // Token ids are checked on the host's copy, the graph input (no read back); ids
            // on the device by the bound they are known to keep.
            let check_ids = |i: usize, size: usize, what: &str| -> Result<(), ExecError> {
                if !matches!(&g.node(ins[i]).op, Op::Input { name, .. } if name == "ids") {
                    return Err(ExecError::Internal(format!("{label}: token ids must be the graph's ids input")));
                }
                match ids {
                    StepIds::Host(host) => match host.iter().find(|&&t| t < 0 || t as usize >= size) {
                        Some(bad) => Err(ExecError::Input(format!("token id {bad} is outside the {what} (size {size})"))),
                        None => Ok(()),
                    },
                    StepIds::Device { below, .. } if below > size => Err(ExecError::Input(format!("token ids up to {} may be outside the {what} (size {size})", below - 1))),
                    StepIds::Device { .. } => Ok(()),
                }
            };
            let w = |i: usize| -> Result<&DeviceTensor, ExecError> {
                match vals.get(&ins[i].index()) {
                    Some(GVal::W(name)) => Ok(self.weights.tensor(name)?),
                    _ => Err(ExecError::Internal(format!("{label}: input {i} is not a weight"))),
                }
            };
            // A small float parameter: an activation or a weight kept as an f32 vector.
            let vecf = |i: usize| -> Result<Arg, ExecError> {
                match vals.get(&ins[i].index()) {
                    Some(GVal::F(s)) => Ok(Arg::Ptr(s.ptr())),
                    Some(GVal::W(name)) => Ok(Arg::Ptr(self.weights.vector(name)?.ptr)),
                    _ => Err(ExecError::Internal(format!("{label}: input {i} has no value"))),
                }
            };
            if skipped.contains(&id.index()) {
                made.remove(&id.index());
                continue;
            }
            // A value a fused launch made before its node's turn.
            if let Some(v) = made.remove(&id.index()) {
                settle(&mut vals, id, v, &ins, step, last_use);
                continue;
            }
            // The shared expert and the attention's query on side branches of the step's
            // graph, joined where their output is read.
            self.lane_for(id, &ins)?;
            // The Sinkhorn an `hc_pre` left (`CombHome`): the FFN's first on the shared
            // expert's lane; any before the routed experts (whose down makes the expand
            // that reads the FFN's) or an expand at the latest (a launch that makes the
            // expand launches it first: `expand_to`).
            let home = self.comb_pending.borrow().as_ref().map(|p| p.home);
            if (home == Some(CombHome::SharedExpert) && self.lane_of(id) == Some(Branch::SharedExpert)) || matches!(node.op, Op::MoeExperts { .. } | Op::HcExpand { .. }) {
                self.launch_comb()?;
            }
            let t_node = profile::start(self.dev)?;
            let value = match &node.op {
                Op::Input { name, .. } => match name.as_str() {
                    "ids" => match ids {
                        StepIds::Host(host) => GVal::I(DevSlice::whole(self.dev.upload(host)?, host.len())),
                        StepIds::Device { ids, .. } if ids.len == bind.tokens => GVal::I(ids.clone()),
                        StepIds::Device { ids, .. } => return Err(ExecError::Input(format!("{} token ids on the device for {} tokens", ids.len, bind.tokens))),
                    },
                    "residual" => {
                        let r = residual.ok_or_else(|| ExecError::Input("this graph needs an incoming residual".into()))?;
                        if r.len() != n_out {
                            return Err(ExecError::Input(format!("residual has {} values, the graph needs {n_out}", r.len())));
                        }
                        GVal::F(DevSlice::whole(self.dev.upload(r)?, n_out))
                    }
                    other => return Err(ExecError::Input(format!("unknown graph input '{other}'"))),
                },
                Op::Weight { name, .. } => GVal::W(name.clone()),
                Op::Embed => {
                    let table = w(1)?;
                    let (d, vocab) = (shape[1], table.ne[1] as usize);
                    check_ids(0, vocab, "vocabulary")?;
                    let out = self.dev.alloc(n_out * 4)?;
                    let named = [("out", Arg::Ptr(out.ptr)), ("w", Arg::Ptr(table.ptr)), ("ids", iv(0)?), ("k", u(d)), ("row_bytes", u(table.row_bytes(d)))];
                    self.call(&kernel_name(QuantKernelKind::DequantRows, table.ty), (bind.tokens as u32, 1), &named)?;
                    GVal::F(DevSlice::whole(out, n_out))
                }
                Op::MatMul => {
                    let (k, n, m) = (last(0), shape[shape.len() - 1], rows(0));
                    let Arg::Ptr(x) = f(0)? else { unreachable!() };
                    if m > 1 {
                        let out = self.dev.alloc(n_out * 4)?;
                        self.matmul(&out, w(1)?, x, n, k, m, 1, n)?;
                        GVal::F(DevSlice::whole(out, n_out))
                    } else {
                        // With the mat-vecs after it that read the same x from weights
                        // right after its own: one launch, each output a view of its.
                        let w0 = w(1)?;
                        let mut group = vec![(id, n)];
                        let mut end = w0.ptr + w0.bytes as u64;
                        while let Some((next, rows)) = self.next_in_group(id, ins[0], w0, k, end, |i| vals.contains_key(&i) || made.contains_key(&i) || skipped.contains(&i)) {
                            group.push((next, rows));
                            end = self.weights.tensor(&weight_of(g, next)?)?.ptr + (rows * w0.row_bytes(k)) as u64;
                        }
                        let total: usize = group.iter().map(|&(_, r)| r).sum();
                        let out = std::sync::Arc::new(self.dev.alloc(total * 4)?);
                        let flat = DeviceTensor { ptr: w0.ptr, ty: w0.ty, ne: vec![k as u64, total as u64], bytes: total * w0.row_bytes(k) };
                        // A lone mat-vec may make the expand of its output (`attn_output_b`).
                        let expand = if group.len() == 1 { self.expand_to(id, &vals, n)? } else { None };
                        made.extend(self.matvec_expand(&out, &MatVec::rows(&flat, x, total, k, 1), expand.as_ref())?);
                        let mut off = n;
                        for &(other, rows) in &group[1..] {
                            made.insert(other.index(), GVal::F(DevSlice { buf: out.clone(), off, len: rows }));
                            off += rows;
                        }
                        GVal::F(DevSlice { buf: out, off: 0, len: n })
                    }
                }
                Op::GroupedMatMul { groups } => {
                    let (kg, n, m) = (last(0) / groups, shape[shape.len() - 1], rows(0));
                    let out = self.dev.alloc(n_out * 4)?;
                    let Arg::Ptr(x) = f(0)? else { unreachable!() };
                    if m > 1 {
                        self.matmul(&out, w(1)?, x, n, kg, m, *groups, n / groups)?;
                    } else {
                        self.matvec(&out, &MatVec { groups: *groups, ng: n / groups, ..MatVec::rows(w(1)?, x, n, kg, m) })?;
                    }
                    GVal::F(DevSlice::whole(out, n_out))
                }
                Op::MoeExperts { clamp } => {
                    let (Arg::Ptr(a), Arg::Ptr(sel), Arg::Ptr(wts)) = (f(0)?, iv(1)?, f(2)?) else { unreachable!() };
                    let (gate, up, down) = (w(3)?, w(4)?, w(5)?);
                    let (d, k, t) = (last(0), last(1), rows(0));
                    let (ff, n_exp) = (gate.ne[1] as usize, gate.ne[2] as usize);
                    // Prefill: the (token, pick) rows grouped by expert, TOKENS to a group,
                    // so that each de-quantized expert weight serves its group (the tiled
                    // matmul over row lists): the picks are read back (checked, as on the
                    // CPU). Decode: a mat-vec per (token, pick) over the picked expert's
                    // rows, with no read (see expert_ids.rs).
                    let groups = if t > 1 {
                        let sel_host: Vec<i32> = is(1)?.read()?;
                        if let Some(bad) = sel_host.iter().find(|&&e| e < 0 || e as usize >= n_exp) {
                            return Err(ExecError::Input(format!("{label}: expert id {bad} outside 0..{n_exp}")));
                        }
                        let (idx, gexp) = expert_groups(&sel_host, n_exp, MMA_TOKENS);
                        Some((self.dev.upload(&idx)?, self.dev.upload(&gexp)?, gexp.len()))
                    } else {
                        None
                    };
                    let gb = self.dev.alloc(t * k * ff * 4)?;
                    let ub = self.dev.alloc(t * k * ff * 4)?;
                    match &groups {
                        Some((idx, gexp, n_groups)) => {
                            let mma = QuantKernelKind::MatMulMma;
                            // Gate and up read the same x: its parts made once.
                            let kernels = [self.kernels.get(&kernel_name(mma, gate.ty))?, self.kernels.get(&kernel_name(mma, up.ty))?];
                            let parts = self.split_x(&kernels, a, x_parts::x_len(t * k, d, 1, k))?;
                            self.matmul_launch(mma, &gb, gate, a, ff, d, t * k, 1, ff, k, Some((idx.ptr, gexp.ptr)), *n_groups, parts.as_ref())?;
                            self.matmul_launch(mma, &ub, up, a, ff, d, t * k, 1, ff, k, Some((idx.ptr, gexp.ptr)), *n_groups, parts.as_ref())?;
                        }
                        None if t == 1 && self.digits_experts(&gb, &ub, gate, up, a, sel, ff, d, k)? => {}
                        None => {
                            // Row t·k + j: token t's pick j, its x row t.
                            self.matvec(&gb, &MatVec { sel: Some(sel), x_div: k, ..MatVec::rows(gate, a, ff, d, t * k) })?;
                            self.matvec(&ub, &MatVec { sel: Some(sel), x_div: k, ..MatVec::rows(up, a, ff, d, t * k) })?;
                        }
                    }
                    // Digits the routing made for x and nothing took stay behind no layer.
                    self.digits_ahead.replace(None);
                    // A decode's integer down takes the digits of the SwiGLU, made by
                    // `x_digits` from the gate and up rows: the SwiGLU is never made.
                    if groups.is_none() && t == 1 && self.digits_down_fits(down, d, ff, k) {
                        let out = self.dev.alloc(n_out * 4)?;
                        // The graph's add of the shared expert, which this node's only
                        // reader is, folded into the integer down (`fusion_plan.rs`).
                        let add = self.plan.moe_add(id).filter(|_| !switched_off!("DS4_MOE_ADD")).and_then(|(add, other)| match vals.get(&other.index()) {
                            Some(GVal::F(s)) if s.len == n_out => Some((add, s.ptr())),
                            _ => None,
                        });
                        // And the expand of what it makes (the add's value, or its own).
                        let expand = self.expand_to(add.map_or(id, |(add, _)| add), &vals, d)?;
                        made.extend(self.digits_down(&out, down, gb.ptr, ub.ptr, *clamp, sel, wts, add.map(|(_, p)| p), expand.as_ref(), d, ff, k)?);
                        let value = GVal::F(DevSlice::whole(out, n_out));
                        match add {
                            Some((add, _)) => fused(&mut made, vec![(add.index(), value)]),
                            None => value,
                        }
                    } else {
                        let h = self.op("swiglu", t * k * ff, ff, &[("g", Arg::Ptr(gb.ptr)), ("u", Arg::Ptr(ub.ptr)), ("n", u(ff)), ("clamp", fl(*clamp))])?;
                        let GVal::F(h) = h else { unreachable!() };
                        // Per token: Σ over picks of weight · down(h).
                        match &groups {
                            Some((idx, gexp, n_groups)) => {
                                let y = self.dev.alloc(t * k * d * 4)?;
                                self.matmul_launch(QuantKernelKind::MatMulMma, &y, down, h.ptr(), d, ff, t * k, 1, d, 1, Some((idx.ptr, gexp.ptr)), *n_groups, None)?;
                                self.op("moe_combine", n_out, d, &[("y", Arg::Ptr(y.ptr)), ("wts", Arg::Ptr(wts)), ("k", u(k)), ("d", u(d))])?
                            }
                            None => {
                                let out = self.dev.alloc(n_out * 4)?;
                                // Token t's k picks summed with their weights.
                                self.matvec(&out, &MatVec { sel: Some(sel), wts: Some(wts), picks: k, ..MatVec::rows(down, h.ptr(), d, ff, t) })?;
                                GVal::F(DevSlice::whole(out, n_out))
                            }
                        }
                    }
                }
                // A view of the last row, no copy.
                Op::LastRow => match vals.get(&ins[0].index()) {
                    Some(GVal::F(s)) => GVal::F(DevSlice { buf: s.buf.clone(), off: s.off + s.len - n_out, len: n_out }),
                    _ => return Err(ExecError::Internal(format!("{label}: input 0 is not a float value"))),
                },
                Op::Reshape { .. } => match vals.get(&ins[0].index()) {
                    Some(GVal::F(s)) => GVal::F(s.clone()),
                    Some(GVal::I(s)) => GVal::I(s.clone()),
                    _ => return Err(ExecError::Internal(format!("{label}: reshape of a non-activation"))),
                },
                Op::RmsNorm { eps } => {
                    let n = last(0);
                    match self.norm_rope(id, fs(0)?, n_out, n, bind)? {
                        Some(ahead) => fused(&mut made, ahead),
                        None => match self.norm_digits(id, f(0)?, vecf(1)?, n_out, n, *eps)? {
                            Some(v) => v,
                            None => self.op("rms_norm", n_out, n, &[("x", f(0)?), ("w", vecf(1)?), ("n", u(n)), ("eps", fl(*eps))])?,
                        },
                    }
                }
                Op::RmsNormPlain { eps } => {
                    let n = last(0);
                    let ahead = match self.hc_pre(id, fs(0)?, rows(0), n, *eps)? {
                        Some(ahead) => Some(ahead),
                        None => self.norm_rope(id, fs(0)?, n_out, n, bind)?,
                    };
                    match ahead {
                        Some(ahead) => fused(&mut made, ahead),
                        None => self.op("rms_norm_plain", n_out, n, &[("x", f(0)?), ("n", u(n)), ("eps", fl(*eps))])?,
                    }
                }
                Op::Add => {
                    let n = last(0);
                    self.op("add", n_out, n, &[("a", f(0)?), ("b", f(1)?), ("n", u(n))])?
                }
                Op::HcBroadcast { nh } => {
                    let d = last(0);
                    self.op("hc_broadcast", n_out, nh * d, &[("x", f(0)?), ("nh", u(*nh)), ("d", u(d))])?
                }
                Op::HcMix { nh, iters, eps } => {
                    let mw = last(0);
                    let named = [("m", f(0)?), ("scale", vecf(1)?), ("base", vecf(2)?), ("nh", u(*nh)), ("iters", u(*iters)), ("eps", fl(*eps))];
                    // A warp per token where the nh × nh matrix fits one (cuda_hc_mix.rs: the
                    // same contract, launched as the op kernel is, a block of its own size).
                    let warp = cuda_hc_mix::fits(*nh) && self.kernels.by_name.contains_key(cuda_hc_mix::NAME);
                    self.op(if warp { cuda_hc_mix::NAME } else { "hc_mix" }, n_out, mw, &named)?
                }
                Op::HcHeadMix { nh, eps } => self.op("hc_head_mix", n_out, *nh, &[("m", f(0)?), ("scale", vecf(1)?), ("base", vecf(2)?), ("nh", u(*nh)), ("eps", fl(*eps))])?,
                Op::HcCollapse { nh } => {
                    let (d, mw) = (last(0), last(1));
                    self.op("hc_collapse", n_out, d, &[("r", f(0)?), ("mix", f(1)?), ("nh", u(*nh)), ("d", u(d)), ("mw", u(mw))])?
                }
                Op::HcExpand { nh } => {
                    let d = last(0);
                    // Its parallel loop is over the d channels (each thread makes the nh streams
                    // of its channel).
                    self.op_over("hc_expand", n_out, nh * d, (d, op_per_thread()), &[("y", f(0)?), ("r", f(1)?), ("mix", f(2)?), ("nh", u(*nh)), ("d", u(d))])?
                }
                Op::Rope { n_rot, .. } => {
                    let (heads, hd) = (shape[1], shape[2]);
                    // With the Hadamard transform after it, one launch where it can.
                    match self.rope_hadamard(id, fs(0)?, n_out, heads, hd, *n_rot, bind)? {
                        Some(ahead) => fused(&mut made, ahead),
                        None => {
                            let r = self.rope_args(id, bind)?;
                            let named = [("x", f(0)?), ("inv_freq", Arg::Ptr(r.freq.ptr)), ("heads", u(heads)), ("hd", u(hd)), ("n_rot", u(*n_rot)), ("pos_base", u(r.base)), ("pos_mult", u(r.mult)), ("sign", fl(r.sign))];
                            self.op("rope", n_out, hd, &named)?
                        }
                    }
                }
                Op::Fp8RoundTrip { n_nope } => {
                    let wd = last(0);
                    self.op("fp8_roundtrip", n_out, wd, &[("x", f(0)?), ("w", u(wd)), ("n_nope", u(*n_nope))])?
                }
                Op::HadamardFp4 { fp4 } => self.op("hadamard_fp4", n_out, 128, &[("x", f(0)?), ("fp4", Arg::Bool(*fp4))])?,
                Op::RouterScores => {
                    let n = last(0);
                    // The routed experts' input, whose digits the routing may make for them.
                    let x = self.plan.router(id).and_then(|c| c.experts).and_then(|moe| match vals.get(&g.inputs(moe)[0].index()) {
                        Some(GVal::F(s)) => Some(s),
                        _ => None,
                    });
                    match self.router_select(id, fs(0)?, x, rows(0), n)? {
                        Some(ahead) => fused(&mut made, ahead),
                        None => self.op("router_scores", n_out, n, &[("logits", f(0)?), ("n", u(n))])?,
                    }
                }
                Op::RouterBiased => {
                    let n = last(0);
                    self.op("router_biased", n_out, n, &[("scores", f(0)?), ("bias", vecf(1)?), ("n", u(n))])?
                }
                Op::RouterHash { k } => {
                    let table = w(1)?;
                    let vocab = table.bytes / 4 / k;
                    check_ids(0, vocab, "hash table")?;
                    let GVal::F(s) = self.op("router_hash", n_out, *k, &[("ids", iv(0)?), ("table", Arg::Ptr(table.ptr)), ("k", u(*k))])? else { unreachable!() };
                    GVal::I(s)
                }
                Op::TopK { k } => {
                    let n = last(0);
                    let named = [("scores", f(0)?), ("n", u(n)), ("k", u(*k))];
                    // Long rows (the indexer's at long contexts): a radix selection, then a
                    // sort of the k picks (cuda_top_k_radix.rs; `DS4_TOP_K_RADIX=0` turns it
                    // off); shorter ones: a block sorts each row in shared memory
                    // (cuda_top_k.rs). Both: a block a row.
                    // An attention's selection read by it alone: the radix selection's picks in
                    // row order, unsorted (`FusionPlan::rows_top_k`; `DS4_TOP_K_ROWS=0` sorts).
                    let rows = self.plan.rows_top_k(id) && cuda_top_k_radix::fits(*k) && !switched_off!("DS4_TOP_K_ROWS") && self.kernels.by_name.contains_key(cuda_top_k_radix::ROWS_NAME);
                    let radix = (n > cuda_top_k_radix::FROM_N || !cuda_top_k::fits(n)) && cuda_top_k_radix::fits(*k) && !switched_off!("DS4_TOP_K_RADIX");
                    let block = if rows {
                        (cuda_top_k_radix::ROWS_NAME, cuda_top_k_radix::THREADS, 0)
                    } else if radix {
                        (cuda_top_k_radix::NAME, cuda_top_k_radix::THREADS, cuda_top_k_radix::shared_bytes(n, *k))
                    } else {
                        (cuda_top_k::NAME, cuda_top_k::threads(n), cuda_top_k::shared_bytes(n))
                    };
                    match self.kernels.by_name.get(block.0).filter(|_| (rows || radix || cuda_top_k::fits(n)) && n_out > 0) {
                        Some(kl) => {
                            let out = self.dev.alloc(n_out * 4)?;
                            let mut all = vec![("out", Arg::Ptr(out.ptr))];
                            all.extend_from_slice(&named);
                            self.call_threads(kl, block.0, ((n_out / k) as u32, 1, 1), block.1, block.2, &all)?;
                            GVal::I(DevSlice::whole(out, n_out))
                        }
                        // Otherwise by rank, a candidate's rank a scan of up to n scores, one
                        // candidate per thread, an item over as many blocks as that takes.
                        None => {
                            let GVal::F(s) = self.op_over("top_k", n_out, *k, (n.max(1), 1), &named)? else { unreachable!() };
                            GVal::I(s)
                        }
                    }
                }
                Op::RouterWeights { scale, normalize } => {
                    let (n, k) = (last(0), last(1));
                    self.op("router_weights", n_out, k, &[("scores", f(0)?), ("sel", iv(1)?), ("n", u(n)), ("k", u(k)), ("scale", fl(*scale)), ("normalize", Arg::Bool(*normalize))])?
                }
                Op::SwiGlu { clamp } => {
                    let n = last(0);
                    self.op("swiglu", n_out, n, &[("g", f(0)?), ("u", f(1)?), ("n", u(n)), ("clamp", fl(*clamp))])?
                }
                Op::WindowKv { slot, window } => GVal::F(slot_ops::window_kv(state, *slot, *window, last(0), fs(0)?, bind, label)?),
                Op::CompressPool { slot, ratio, overlap, width } => {
                    let wd = *width;
                    let logs = slot_ops::compress_log(state, *slot, *ratio, *overlap, last(0), fs(0)?, fs(1)?, shape[0], bind, label)?;
                    // The new rows' slots gathered from the logs (kv, then gate + ape), pooled.
                    let slots = slot_ops::pool_slots(*ratio, *overlap);
                    let per_row = slots * wd;
                    let named = [
                        ("kv", Arg::Ptr(logs.kv.ptr())),
                        ("gate", Arg::Ptr(logs.gate.ptr())),
                        ("ape", vecf(2)?),
                        ("n_rows", u(logs.n_rows)),
                        ("first_row", u(logs.first_row)),
                        ("first", u(logs.first)),
                        ("ratio", u(*ratio)),
                        ("slots", u(slots)),
                        ("w", u(wd)),
                    ];
                    let GVal::F(gathered) = self.op("compress_gather", 2 * logs.n_rows * per_row, per_row, &named)? else { unreachable!() };
                    let (kv, gate) = (gathered.ptr(), gathered.ptr() + (logs.n_rows * per_row * 4) as u64);
                    self.op("compress_pool", n_out, wd, &[("kv", Arg::Ptr(kv)), ("gate", Arg::Ptr(gate)), ("slots", u(slots)), ("w", u(wd))])?
                }
                Op::RowCache { slot, ratio } => GVal::F(slot_ops::row_cache(state, *slot, *ratio, last(0), fs(0)?, bind, label)?),
                Op::IndexerScores { ratio } => {
                    let (qs, n_rows) = (in_shape(0), shape[1]);
                    let (tokens, heads, dk) = (qs[0], qs[1], qs[2]);
                    let (Arg::Ptr(q), Arg::Ptr(rows)) = (f(0)?, f(2)?) else { unreachable!() };
                    let common = [("n_rows", u(n_rows)), ("heads", u(heads)), ("dk", u(dk)), ("pos0", u(bind.pos0)), ("ratio", u(*ratio))];
                    // A decode token's scores in one launch (cuda_indexer_scores.rs: the
                    // CPU's floats); `DS4_INDEXER_VEC=0` turns it off.
                    if cuda_indexer_scores::fits(tokens, heads, dk, n_rows) && (q | rows) % 16 == 0 && !switched_off!("DS4_INDEXER_VEC") && self.kernels.by_name.contains_key(cuda_indexer_scores::NAME) {
                        let out = self.dev.alloc(n_out * 4)?;
                        let tile = cuda_indexer_scores::tile_rows(n_rows, self.dev.sms);
                        let named = [&[("out", Arg::Ptr(out.ptr)), ("q", Arg::Ptr(q)), ("w", f(1)?), ("rows", Arg::Ptr(rows)), ("tile_rows", u(tile))][..], &common].concat();
                        let k = self.kernels.get(cuda_indexer_scores::NAME)?;
                        self.call_threads(k, cuda_indexer_scores::NAME, (cuda_indexer_scores::blocks(n_rows, tile, self.dev.sms), tokens as u32, 1), cuda_indexer_scores::threads(heads), cuda_indexer_scores::shared_bytes(heads, dk), &named)?;
                        GVal::F(DevSlice::whole(out, n_out))
                    } else {
                        // Two steps (see `indexer_head_dots`). Step 1 is every (token, head)
                        // query against every row: one tensor-core matmul with the rows as an
                        // F32 "weight" (rows a query may not see are computed and then masked
                        // by step 2).
                        let dots = self.dev.alloc(n_out * heads * 4)?;
                        let rows = DeviceTensor { ptr: rows, ty: ds4_ir::GgmlType::F32, ne: vec![dk as u64, n_rows as u64], bytes: n_rows * dk * 4 };
                        let m = tokens * heads;
                        self.matmul_launch(QuantKernelKind::MatMulMma, &dots, &rows, q, n_rows, dk, m, 1, n_rows, 1, None, m.div_ceil(MMA_TOKENS), None)?;
                        self.op("indexer_combine", n_out, n_rows, &[&[("dots", Arg::Ptr(dots.ptr)), ("w", f(1)?)][..], &common].concat())?
                    }
                }
                Op::Attention { window, ratio, comp } => {
                    let comp = if self.plan.all_rows().every_row(id, bind) { &CompMode::Causal } else { comp };
                    let (heads, hd) = (shape[1], shape[2]);
                    let n_win = in_shape(1)[0];
                    let win_pos0 = bind.pos0 - bind.window_prior(*window);
                    let dummy = Arg::Ptr(self.dummy.ptr);
                    let (comp_rows, n_comp) = if *comp != CompMode::None { (f(3)?, in_shape(3)[0]) } else { (dummy, 0) };
                    let (sel, k_sel) = if *comp == CompMode::Selected { (iv(4)?, last(4)) } else { (dummy, 0) };
                    let mode = match comp {
                        CompMode::None => attention::COMP_NONE,
                        CompMode::Causal => attention::COMP_CAUSAL,
                        CompMode::Selected => attention::COMP_SELECTED,
                    };
                    let scale = 1.0 / (hd as f32).sqrt();
                    let named = [
                        ("q", f(0)?),
                        ("win", f(1)?),
                        ("comp", comp_rows),
                        ("sel", sel),
                        ("sinks", vecf(2)?),
                        ("heads", u(heads)),
                        ("hd", u(hd)),
                        ("pos0", u(bind.pos0)),
                        ("win_pos0", u(win_pos0)),
                        ("n_win", u(n_win)),
                        ("window", u(*window)),
                        ("n_comp", u(n_comp)),
                        ("comp_mode", u(mode)),
                        ("ratio", u(*ratio)),
                        ("k_sel", u(k_sel)),
                        ("scale", fl(scale)),
                    ];
                    // Each item's rows in `nc` chunks, then the merge: few blocks (decode) get
                    // more chunks, so that the launch has ~4 blocks per SM, but no chunk fewer
                    // rows than a tile (`attention_chunks`). attention_tiled
                    // serves 16 heads of a token per block, holding their Q and O in
                    // registers; heads wider than MAX_HD take the generated attention_partial
                    // (a block per head).
                    let (items, tokens) = (n_out / hd, shape[0]);
                    let tiled = hd <= cuda_attention::MAX_HD && self.kernels.by_name.contains_key(cuda_attention::NAME);
                    let blocks = if tiled { cuda_attention::blocks(tokens, heads, 1) } else { items };
                    let seen = n_win + if *comp == CompMode::Selected { k_sel } else { n_comp };
                    let nc = attention_chunks(blocks, self.dev.sms, seen, attention_chunk_rows());
                    let mut pnamed: Vec<(&str, Arg)> = named.to_vec();
                    pnamed.push(("nc", u(nc)));
                    let part = if tiled {
                        let part = self.dev.alloc(items * nc * (hd + 2) * 4)?;
                        pnamed.push(("out", Arg::Ptr(part.ptr)));
                        self.call(cuda_attention::NAME, (cuda_attention::blocks(tokens, heads, nc) as u32, 1), &pnamed)?;
                        DevSlice::whole(part, items * nc * (hd + 2))
                    } else {
                        let GVal::F(part) = self.op("attention_partial", items * nc * (hd + 2), hd + 2, &pnamed)? else { unreachable!() };
                        part
                    };
                    // A warp takes the chunks' maxima and sums where they fit one
                    // (cuda_attention_merge.rs: the same contract and floats).
                    // `DS4_MERGE_WARP=0` turns it off (for measuring).
                    let warp = !switched_off!("DS4_MERGE_WARP") && cuda_attention_merge::fits(nc) && self.kernels.by_name.contains_key(cuda_attention_merge::NAME);
                    // With the inverse RoPE after it where the plan pairs them.
                    let with_rope = match self.plan.attention_rope(id).filter(|_| warp) {
                        Some(rope) => self.merge_rope(rope, &part, items, heads, hd, nc, bind)?.map(|out| (rope, out)),
                        None => None,
                    };
                    match with_rope {
                        Some((rope, out)) => fused(&mut made, vec![(rope.index(), GVal::F(DevSlice::whole(out, n_out)))]),
                        None => self.op(if warp { cuda_attention_merge::NAME } else { "attention_merge" }, n_out, hd, &[("part", Arg::Ptr(part.ptr())), ("hd", u(hd)), ("nc", u(nc))])?,
                    }
                }
            };
            profile::stop(self.dev, t_node, node.op.name(), label)?;
            settle(&mut vals, id, value, &ins, step, last_use);
        }
        // A Sinkhorn no node took (none should be left).
        self.launch_comb()?;
        state.trim(bind.pos0 + bind.tokens);
        let mut outs = HashMap::new();
        if let Some(picks) = greedy {
            // The logits picked on the device; nothing read back.
            let Some(Some(GVal::F(logits))) = g.outputs.iter().find(|(name, _)| name == "logits").map(|(_, id)| vals.get(&id.index())) else {
                return Err(ExecError::Internal("a greedy step needs the graph's logits".into()));
            };
            let rows = bind.tokens;
            let n = logits.len / rows.max(1);
            if rows == 0 || picks.picked.len < rows || picks.at + rows > picks.host.count() || n * rows != logits.len {
                return Err(ExecError::Internal(format!("greedy picks for {rows} rows of {} logits", logits.len)));
            }
            let host = picks.host.ptr() + 4 * picks.at as u64;
            let named = [("picked", Arg::Ptr(picks.picked.ptr())), ("picked_host", Arg::Ptr(host)), ("x", Arg::Ptr(logits.ptr())), ("n", u(n))];
            self.call_threads(self.kernels.get(cuda_argmax::NAME)?, cuda_argmax::NAME, (rows as u32, 1, 1), cuda_argmax::THREADS, 0, &named)?;
            return Ok(outs);
        }
        for (name, id) in &g.outputs {
            match vals.get(&id.index()) {
                Some(GVal::F(s)) => {
                    outs.insert(name.clone(), s.read::<f32>()?);
                }
                _ => return Err(ExecError::Internal(format!("output '{name}' has no float value"))),
            }
        }
        Ok(outs)
    }
}

/// The values a launch makes ahead of a chain of nodes: the skipped ones never made, the
/// last one `out` (`n` floats).
fn chain_values(skipped: &[ds4_ir::NodeId], last: ds4_ir::NodeId, out: DeviceBuf, n: usize) -> Vec<(usize, GVal)> {
    skipped.iter().map(|s| (s.index(), GVal::Freed)).chain([(last.index(), GVal::F(DevSlice::whole(out, n)))]).collect()
}

/// Where a step's token ids come from.
#[derive(Clone, Copy)]
pub enum StepIds<'a> {
    /// The host's (checked against the tables they index).
    Host(&'a [i32]),
    /// A device value, an id per token, each below `below` (an earlier step's greedy picks
    /// over `below` logits): not read back.
    Device { ids: &'a DevSlice, below: usize },
}

/// Where a greedy step's picks go: `picked` on the device (i32 a row) and the same values
/// in mapped host memory, `host` from value `at`.
#[derive(Clone, Copy)]
pub struct GreedyPicks<'a> {
    pub picked: &'a DevSlice,
    pub host: &'a MappedI32,
    pub at: usize,
}

/// Whether decode steps run as CUDA graphs: 0 not yet decided, 1 yes, 2 no.
static GRAPHS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether decode steps run as CUDA graphs (`DS4_CUDA_GRAPHS=0` turns it off).
fn graphs_enabled() -> bool {
    use std::sync::atomic::Ordering;
    match GRAPHS.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("DS4_CUDA_GRAPHS").map_or(true, |v| v != "0");
            GRAPHS.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
        v => v == 1,
    }
}

/// Turns decode-step graphs on or off for the process (tests compare both ways).
pub fn use_graphs(on: bool) {
    GRAPHS.store(if on { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
}

/// Blocks along the rows of a mat-vec (`n` rows, `m` blocks along y, row groups of `ng`
/// rows when `groups` > 1): a row group per warp (`ds4_codegen::quant::matvec_block_rows`
/// rows per block), but for types with tables (staged in shared memory once per block)
/// about 8 blocks per SM, each looping over its rows.
/// Bytes of a row of `k` values of `ty`.
fn row_bytes(ty: ds4_ir::GgmlType, k: usize) -> Result<usize, ExecError> {
    ty.bytes_for(k as u64).map(|b| b as usize).ok_or_else(|| ExecError::Internal(format!("{ty}: no row of {k} values")))
}

pub fn matvec_row_blocks(ty: ds4_ir::GgmlType, n: usize, m: usize, groups: usize, ng: usize, sms: usize) -> usize {
    let Some(spec) = ds4_ir::quant::spec(ty) else { return n.max(1) };
    let rows_per_block = ds4_codegen::quant::matvec_block_rows(ty, n as u64, m as u64, groups as u64, ng as u64) as usize;
    let blocks = n.div_ceil(rows_per_block);
    if !spec.tables.is_empty() {
        blocks.min((8 * sms / m.max(1)).max(1))
    } else {
        blocks
    }
}

/// Row lists for the expert-grouped matmul: the (token, pick) rows `p` of `sel` by expert,
/// in order, `tokens` to a group (-1 pads a group's tail), and each group's expert.
pub fn expert_groups(sel: &[i32], n_exp: usize, tokens: usize) -> (Vec<i32>, Vec<i32>) {
    let mut by_expert: Vec<Vec<i32>> = vec![Vec::new(); n_exp];
    for (p, &e) in sel.iter().enumerate() {
        by_expert[e as usize].push(p as i32);
    }
    let (mut idx, mut gexp) = (Vec::new(), Vec::new());
    for (e, rows) in by_expert.iter().enumerate() {
        for chunk in rows.chunks(tokens) {
            idx.extend_from_slice(chunk);
            idx.extend(std::iter::repeat_n(-1, tokens - chunk.len()));
            gexp.push(e as i32);
        }
    }
    (idx, gexp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_groups_list_every_row_once_by_expert() {
        let sel = [2, 0, 2, 2, 1, 2, 2, 2, 2, 2, 2, 0];
        let (idx, gexp) = expert_groups(&sel, 4, TOKENS);
        assert_eq!(gexp, vec![0, 1, 2, 2]);
        assert_eq!(idx.len(), gexp.len() * TOKENS);
        let mut seen: Vec<i32> = idx.iter().copied().filter(|&p| p >= 0).collect();
        seen.sort();
        assert_eq!(seen, (0..sel.len() as i32).collect::<Vec<_>>());
        for (g, &e) in gexp.iter().enumerate() {
            let rows = &idx[g * TOKENS..(g + 1) * TOKENS];
            assert!(rows[0] >= 0, "a group's first row is always present");
            assert!(rows.iter().filter(|&&p| p >= 0).all(|&p| sel[p as usize] == e));
        }
    }

    #[test]
    fn k_slices_cover_the_row_in_whole_units() {
        // Tiles that fill the GPU, or short rows: one slice.
        assert_eq!(mma_k_slices(132, 16384, 32, 132), (16384, 1));
        assert_eq!(mma_k_slices(4, 512, 32, 132), (512, 1));
        // The hyper-connection projection (one 64-row tile × 32 token tiles, k = 16384).
        assert_eq!(mma_k_slices(32, 16384, 64, 132), (2048, 8));
        for (tiles, k, unit) in [(1, 4096, 256), (7, 10000, 32), (100, 2048, 64), (3, 3072, 256)] {
            let (ks, n) = mma_k_slices(tiles, k, unit, 132);
            assert_eq!(ks % unit, 0);
            assert!(ks * n >= k && ks * (n - 1) < k, "{tiles} {k} {unit}: {ks} × {n}");
            assert!(tiles * n <= 2 * 132 + tiles);
        }
    }

    /// A decode token's chunks: 132 SMs and 4 blocks (64 heads in groups of 16) ask for
    /// 132, capped at 32; the rows seen cap them at one a tile; a prefill's many blocks
    /// take one.
    #[test]
    fn attention_chunks_follow_the_sms_and_the_rows_seen() {
        assert_eq!(attention_chunks(4, 132, 640, 16), 32, "a CSA layer: 512 picks and the window");
        assert_eq!(attention_chunks(4, 132, 144, 16), 9, "an HCA layer at ctx 2048");
        assert_eq!(attention_chunks(4, 132, 144, 0), 32, "no floor");
        assert_eq!(attention_chunks(4, 132, 3, 16), 1);
        assert_eq!(attention_chunks(4, 132, 0, 16), 1);
        assert_eq!(attention_chunks(8192, 132, 144, 16), 1, "a prefill");
    }
}
