//! The graph executor on the GPU: `crate::exec` with device buffers. Same node order,
//! same shapes, same kernels (the generated CUDA of the same kernel bodies), same errors.
//! The stateful ops' logs live on the device (`DeviceLog`, with `crate::slot_ops`'s
//! bookkeeping), token ids are checked from the host's copy, and the expert ids of a
//! decode step need no check (`expert_ids.rs`): the only read back is the outputs (and,
//! in prefill, each MoE layer's picks, to group the tokens by expert).
//!
//! Here: the walk over the nodes (`run_nodes`), each op's launches (`node_value`), the
//! launch helpers and the side lanes; the node at hand is a `NodeView` (`node.rs`). The
//! larger ops and the launches they may take sit by concern: `matvec.rs` (mat-vecs and
//! matmuls), `moe.rs` (the routed experts), `attention.rs` (the compressor's pool and the
//! attention), `indexer.rs` (the indexer's scores, top-k), `digits.rs` (the integer paths
//! and the MoE routing), `hyper.rs` (`hc_pre`, its Sinkhorn, the expand), `rope.rs` (the
//! RoPE chains).

mod attention;
mod digits;
mod hyper;
mod indexer;
mod matvec;
mod moe;
mod node;
mod rope;

pub use moe::expert_groups;

use super::compile::{Kernels, Loaded, ParamSig};
use super::profile;
use super::device::{launch, Arg, CudaError, DevSlice, Device, DeviceBuf, MappedI32};
use super::device_log::DeviceLog;
use super::fusion_plan::{self, Branch, CombAt, FusionPlan};
use super::x_parts::{self, XParts};
use super::placement::{DeviceTensor, DeviceWeights};
use crate::exec::ExecError;
use crate::slot_ops;
use crate::state::SessionState;
use ds4_codegen::quant::cuda_matvec_dense;
use ds4_codegen::{cuda_argmax, cuda_attention, cuda_attention_merge, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix};
use ds4_codegen::quant::{kernel_name, QuantKernelKind};
use ds4_ir::{Bind, CompMode, Graph, Op, RopePos};
use node::{fl, u, NodeView};
use std::collections::{HashMap, HashSet};

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
    !(switched_off!("DS4_SIDE_BRANCH") || (b == Branch::Query && switched_off!("DS4_SIDE_QUERY")))
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
/// (`cuda_hc_expand.rs`): its node, the new streams' length (floats), the old streams'
/// address, the mix, nh. The launch that takes it allocates the new streams.
struct ExpandTo {
    node: ds4_ir::NodeId,
    len: usize,
    r: u64,
    mix: DevSlice,
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

impl RopeArgs {
    /// The four arguments every RoPE kernel takes from these, by their names.
    fn named(&self) -> [(&'static str, Arg); 4] {
        [("inv_freq", Arg::Ptr(self.freq.ptr)), ("pos_base", u(self.base)), ("pos_mult", u(self.mult)), ("sign", fl(self.sign))]
    }
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
    /// The router logits' parts an `hc_pre` launch made, taken by the routing's launch.
    pub router_parts: std::cell::RefCell<Option<RouterParts>>,
    /// The shared expert's share of an FFN's expand, left for the next `hc_pre` to add.
    pub shared_later: std::cell::RefCell<Option<SharedLater>>,
}

/// The shared expert's y that an FFN's expand left out of the streams it made (node
/// `streams`), with the mix whose post weights scale it: the next `hc_pre` adds it
/// (`cuda_hc_pre`'s `pending`). Held here, the buffers outlive their nodes' last readers.
pub struct SharedLater {
    streams: usize,
    y: DevSlice,
    mix: DevSlice,
}

/// The parts of a router mat-vec's logits an `hc_pre` launch made in its router blocks
/// (`cuda_hc_pre::router_blocks`), for the routing's launch to add up (`router_select`):
/// the mat-vec node they stand for, the parts (`nh` a logit), the norm's scale a token,
/// and the mix whose first `nh` of `mw` entries are the pre weights.
pub struct RouterParts {
    logits: usize,
    parts: DeviceBuf,
    inv: DeviceBuf,
    mix: u64,
    nh: usize,
    mw: usize,
}

/// Where a routing launch reads its logits: rows of them, or the parts `hc_pre` made.
pub(super) enum Logits<'l> {
    Rows(&'l DevSlice),
    Parts(&'l RouterParts),
}

/// Where an `hc_pre` launch's Sinkhorn goes: out of its grid, which the launch after it
/// waits for, while only the sublayer's expand reads the Sinkhorn (`cuda_hc_pre::HC_COMB`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CombHome {
    /// The FFN's where its router's mat-vec is a launch of its own: an `hc_comb` launch at
    /// the head of the shared expert's side lane, which waits for the routed experts'
    /// down anyway.
    SharedExpert,
    /// The attention's: a block of its own in the next `matvec_dense_q8_0_r` launch of as
    /// many tokens (`attn_q_a`, with `attn_kv` in a CSA layer), which outlasts it. The
    /// lanes have no time to spare for a launch of its own (RESULTS.md, twenty-second
    /// stop). And the FFN's where `hc_pre` makes the router's parts: in the shared
    /// expert's gate and up (RESULTS.md, twenty-eighth stop).
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

    /// Kernel `form` where `wanted` and it is loaded, else `otherwise` (the plain form of
    /// the same launch).
    fn form_or(&self, wanted: bool, form: &'static str, otherwise: &'static str) -> &'static str {
        if wanted && self.kernels.by_name.contains_key(form) {
            form
        } else {
            otherwise
        }
    }

    /// Whether a launch of kernel `name` may ask for `bytes` of dynamic shared memory on
    /// this device (`compile::shared_room`; false where it is not loaded).
    fn has_room(&self, name: &str, bytes: u32) -> bool {
        self.kernels.by_name.get(name).is_some_and(|k| bytes <= k.shared_room)
    }

    /// `call_loaded` with blocks of `threads` (op kernels stride their loops by the block).
    fn call_threads(&self, k: &Loaded, name: &str, grid: (u32, u32, u32), threads: u32, shared: u32, named: &Named) -> Result<(), ExecError> {
        // Up to 48 KiB needs no asking; past it, what the device left the kernel.
        if shared > k.shared_room.max(48 * 1024) {
            return Err(CudaError(format!("{name}: a launch asks for {shared} bytes of shared memory, where this device gives it {}", k.shared_room)).into());
        }
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

    /// The walk over the graph's nodes in the plan's order: each node's value launched
    /// (`node_value`) or taken from a fused launch that made it ahead, on the lane the plan
    /// gives it, and each input freed after its last reader; then the greedy picks, or the
    /// outputs read back.
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
        for (step, &id) in order.iter().enumerate() {
            let ins = g.inputs(id);
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
            // The Sinkhorn an `hc_pre` left (`CombHome`) where the plan puts it (`CombAt`;
            // a launch that makes an expand launches it first too: `expand_to`).
            let due = match self.plan.comb_at(id) {
                Some(CombAt::Latest) => true,
                Some(CombAt::SharedExpertLane) => self.comb_pending.borrow().as_ref().is_some_and(|p| p.home == CombHome::SharedExpert),
                None => false,
            };
            if due {
                self.launch_comb()?;
            }
            let op = &g.node(id).op;
            let t_node = profile::start(self.dev)?;
            let ahead = made.len();
            let value = {
                let nv = NodeView::new(g, id, &ins, bind, &vals, self.weights);
                self.node_value(&nv, op, &mut made, &skipped, state, ids, residual)?
            };
            profile::stop(self.dev, t_node, op.name(), &g.node(id).label)?;
            settle(&mut vals, id, value, &ins, step, last_use);
            // A fused launch's new value for a node already run (the streams an `hc_pre`
            // launch made whole, `SharedLater`): its readers from now on read that. Only
            // a launch that made values ahead can have made one (checked then, not at
            // every node of the step).
            if made.len() > ahead {
                made.retain(|&node, v| match vals.contains_key(&node) {
                    true => {
                        vals.insert(node, std::mem::replace(v, GVal::Freed));
                        false
                    }
                    false => true,
                });
            }
        }
        if self.shared_later.borrow().is_some() {
            return Err(ExecError::Internal("a shared expert's share was left for an hc_pre launch that never came".into()));
        }
        // A Sinkhorn no node took (none should be left).
        self.launch_comb()?;
        state.trim(bind.pos0 + bind.tokens);
        match greedy {
            Some(picks) => self.pick_greedy(&vals, bind, picks).map(|_| HashMap::new()),
            None => self.read_outputs(&vals),
        }
    }

    /// Node `nv`'s value (`op` its op): launched here, or by a launch that makes later
    /// nodes' values too (kept in `made` for their turn; `skipped`: nodes never made).
    #[allow(clippy::too_many_arguments)]
    fn node_value(&self, nv: &NodeView, op: &Op, made: &mut HashMap<usize, GVal>, skipped: &HashSet<usize>, state: &mut SessionState<DeviceLog>, ids: StepIds, residual: Option<&[f32]>) -> Result<GVal, ExecError> {
        let (id, n_out, bind) = (nv.id, nv.n_out, nv.bind);
        let (f, vecf, last) = (|i| nv.f(i), |i| nv.vecf(i), |i| nv.last(i));
        Ok(match op {
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
                let table = nv.w(1)?;
                let (d, vocab) = (nv.shape[1], table.ne[1] as usize);
                nv.check_ids(0, vocab, "vocabulary", ids)?;
                let out = self.dev.alloc(n_out * 4)?;
                let named = [("out", Arg::Ptr(out.ptr)), ("w", Arg::Ptr(table.ptr)), ("ids", nv.iv(0)?), ("k", u(d)), ("row_bytes", u(table.row_bytes(d)))];
                self.call(&kernel_name(QuantKernelKind::DequantRows, table.ty), (bind.tokens as u32, 1), &named)?;
                GVal::F(DevSlice::whole(out, n_out))
            }
            Op::MatMul => self.matmul_node(nv, made, skipped)?,
            Op::GroupedMatMul { groups } => self.grouped_matmul_node(nv, *groups)?,
            Op::MoeExperts { clamp } => self.moe_experts_node(nv, *clamp, made)?,
            // A view of the last row, no copy.
            Op::LastRow => {
                let s = nv.fs(0)?;
                GVal::F(DevSlice { buf: s.buf.clone(), off: s.off + s.len - n_out, len: n_out })
            }
            Op::Reshape { .. } => match nv.value(0) {
                Some(GVal::F(s)) => GVal::F(s.clone()),
                Some(GVal::I(s)) => GVal::I(s.clone()),
                _ => return Err(ExecError::Internal(format!("{}: reshape of a non-activation", nv.label))),
            },
            Op::RmsNorm { eps } => {
                let n = last(0);
                match self.norm_rope(id, nv.fs(0)?, n_out, n, bind)? {
                    Some(ahead) => fused(made, ahead),
                    None => match self.norm_digits(id, f(0)?, vecf(1)?, n_out, n, *eps)? {
                        Some(v) => v,
                        None => self.op("rms_norm", n_out, n, &[("x", f(0)?), ("w", vecf(1)?), ("n", u(n)), ("eps", fl(*eps))])?,
                    },
                }
            }
            Op::RmsNormPlain { eps } => {
                let n = last(0);
                let ahead = match self.hc_pre(id, nv.fs(0)?, nv.rows(0), n, *eps)? {
                    Some(ahead) => Some(ahead),
                    None => self.norm_rope(id, nv.fs(0)?, n_out, n, bind)?,
                };
                match ahead {
                    Some(ahead) => fused(made, ahead),
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
                let (heads, hd) = (nv.shape[1], nv.shape[2]);
                // With the Hadamard transform after it, one launch where it can.
                match self.rope_hadamard(id, nv.fs(0)?, n_out, heads, hd, *n_rot, bind)? {
                    Some(ahead) => fused(made, ahead),
                    None => {
                        let r = self.rope_args(id, bind)?;
                        let named = [[("x", f(0)?), ("heads", u(heads)), ("hd", u(hd)), ("n_rot", u(*n_rot))], r.named()].concat();
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
                let x = self.plan.router(id).and_then(|c| c.experts).and_then(|moe| match nv.vals.get(&nv.graph.inputs(moe)[0].index()) {
                    Some(GVal::F(s)) => Some(s),
                    _ => None,
                });
                // The logits' parts, where the FFN's `hc_pre` launch made them instead.
                let parts = self.router_parts.take().filter(|p| p.logits == nv.graph.inputs(id)[0].index());
                let logits = match &parts {
                    Some(p) => Logits::Parts(p),
                    None => Logits::Rows(nv.fs(0)?),
                };
                match self.router_select(id, logits, x, nv.rows(0), n)? {
                    Some(ahead) => fused(made, ahead),
                    None if parts.is_some() => return Err(ExecError::Internal(format!("{}: hc_pre made the router's parts and the routing cannot take them", nv.label))),
                    None => self.op("router_scores", n_out, n, &[("logits", f(0)?), ("n", u(n))])?,
                }
            }
            Op::RouterBiased => {
                let n = last(0);
                self.op("router_biased", n_out, n, &[("scores", f(0)?), ("bias", vecf(1)?), ("n", u(n))])?
            }
            Op::RouterHash { k } => {
                let table = nv.w(1)?;
                let vocab = table.bytes / 4 / k;
                nv.check_ids(0, vocab, "hash table", ids)?;
                let GVal::F(s) = self.op("router_hash", n_out, *k, &[("ids", nv.iv(0)?), ("table", Arg::Ptr(table.ptr)), ("k", u(*k))])? else { unreachable!() };
                GVal::I(s)
            }
            Op::TopK { k } => self.top_k_node(nv, *k)?,
            Op::RouterWeights { scale, normalize } => {
                let (n, k) = (last(0), last(1));
                self.op("router_weights", n_out, k, &[("scores", f(0)?), ("sel", nv.iv(1)?), ("n", u(n)), ("k", u(k)), ("scale", fl(*scale)), ("normalize", Arg::Bool(*normalize))])?
            }
            Op::SwiGlu { clamp } => {
                let n = last(0);
                self.op("swiglu", n_out, n, &[("g", f(0)?), ("u", f(1)?), ("n", u(n)), ("clamp", fl(*clamp))])?
            }
            Op::WindowKv { slot, window } => GVal::F(slot_ops::window_kv(state, *slot, *window, last(0), nv.fs(0)?, bind, nv.label)?),
            Op::CompressPool { slot, ratio, overlap, width } => self.compress_pool_node(nv, state, *slot, *ratio, *overlap, *width)?,
            Op::RowCache { slot, ratio } => GVal::F(slot_ops::row_cache(state, *slot, *ratio, last(0), nv.fs(0)?, bind, nv.label)?),
            Op::IndexerScores { ratio } => self.indexer_scores_node(nv, *ratio)?,
            Op::Attention { window, ratio, comp } => self.attention_node(nv, *window, *ratio, comp, made)?,
        })
    }

    /// A greedy step's end: each row of the graph's logits picked on the device into
    /// `picks` (`cuda_argmax.rs`); nothing read back.
    fn pick_greedy(&self, vals: &HashMap<usize, GVal>, bind: Bind, picks: GreedyPicks) -> Result<(), ExecError> {
        let Some(Some(GVal::F(logits))) = self.graph.outputs.iter().find(|(name, _)| name == "logits").map(|(_, id)| vals.get(&id.index())) else {
            return Err(ExecError::Internal("a greedy step needs the graph's logits".into()));
        };
        let rows = bind.tokens;
        let n = logits.len / rows.max(1);
        if rows == 0 || picks.picked.len < rows || picks.at + rows > picks.host.count() || n * rows != logits.len {
            return Err(ExecError::Internal(format!("greedy picks for {rows} rows of {} logits", logits.len)));
        }
        let host = picks.host.ptr() + 4 * picks.at as u64;
        let named = [("picked", Arg::Ptr(picks.picked.ptr())), ("picked_host", Arg::Ptr(host)), ("x", Arg::Ptr(logits.ptr())), ("n", u(n))];
        self.call_threads(self.kernels.get(cuda_argmax::NAME)?, cuda_argmax::NAME, (rows as u32, 1, 1), cuda_argmax::THREADS, 0, &named)
    }

    /// The graph's named outputs, read back.
    fn read_outputs(&self, vals: &HashMap<usize, GVal>) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        let mut outs = HashMap::new();
        for (name, id) in &self.graph.outputs {
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

/// Bytes of a row of `k` values of `ty`.
fn row_bytes(ty: ds4_ir::GgmlType, k: usize) -> Result<usize, ExecError> {
    ty.bytes_for(k as u64).map(|b| b as usize).ok_or_else(|| ExecError::Internal(format!("{ty}: no row of {k} values")))
}

/// Blocks along the rows of a mat-vec (`n` rows, `m` blocks along y, row groups of `ng`
/// rows when `groups` > 1): a row group per warp (`ds4_codegen::quant::matvec_block_rows`
/// rows per block), but for types with tables (staged in shared memory once per block)
/// about 8 blocks per SM, each looping over its rows.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
