//! Decode steps as CUDA graphs: the launch plan.
//!
//! A decode step is ~1,900 small launches with no host round trip between them; launched
//! one by one, each costs the host several microseconds and leaves the GPU a gap. While a
//! [`LaunchPlan`] records, `launch` and the device-to-device copies are queued here
//! instead of being submitted; every `chunk_len` of them (16 after the host's last
//! interaction, 64 where it went on without waiting, doubling up to [`CHUNK_STEPS`]), and
//! at the next host interaction (a read, a write, a synchronize, a free to the driver),
//! the queue goes to the GPU as one graph launch: the GPU runs a chunk while the host
//! records the next.
//!
//! Graphs are kept per *shape* of queue (each step's kernel, block size, shared memory and
//! argument count, in order): the next step of the same shape updates the instantiated
//! graph in place, only the nodes whose grid or arguments changed (positions, lengths,
//! the pool's buffers where they differ), then launches it. A new shape (the compressor's
//! cadence, a longer context's grids on other kernels) builds and instantiates its graph
//! once; [`MAX_GRAPHS`] of them are kept.
//!
//! A graph is a chain, but for one side branch: between [`LaunchPlan::lane`]`(true)` and
//! [`LaunchPlan::join`], the steps queued on the side lane form a chain of their own that
//! starts after the main lane's last step before it (the fork) and that the main lane's
//! first step after the join waits for; the main lane's steps in between run beside it.
//! The executor puts the shared expert there, beside the routing, and the attention's
//! query beside its KV, compressors and indexer (`fusion_plan.rs`). Across graph chunks
//! nothing changes: a chunk starts after the previous one ends.
//!
//! Why replay is safe: the queue runs in order on the same (legacy default) stream as
//! every other copy, and a launch or copy made while not recording first submits what is
//! queued (sessions sharing a device may record and not at once), so stream order is what
//! it was without recording; the buffers it
//! reads stay allocated because a pooled buffer is only reused by later queued work, and
//! anything that would touch memory from the host (a write, a read, a free, the pool's
//! release) first submits the queue.

use super::device::{Arg, CudaError};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;

/// Instantiated graphs kept (distinct queue shapes of a session's decode steps).
pub const MAX_GRAPHS: usize = 64;

/// Queues shorter than this are submitted launch by launch (a graph's update and launch
/// cost more than they save).
const MIN_GRAPH_STEPS: usize = 8;

/// A queue this long is submitted at once, so that the GPU runs it while the host records
/// the next (a whole step as one graph would leave the GPU idle while the host records).
/// Each graph launch is a point where no kernel of the next graph starts before the last
/// one's end (no programmatic launch across it): fewer, longer chunks once the host runs
/// ahead (greedy decoding, `CudaSession::decode_greedy`): H200, decode steady at ctx 2048,
/// 128 / 256 / 512: 142.3 / 144.6 / 144.2 t/s. `DS4_GRAPH_CHUNK` overrides it.
pub const CHUNK_STEPS: usize = 256;

fn chunk_steps() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| steps_from_env("DS4_GRAPH_CHUNK", CHUNK_STEPS))
}

/// A chunk length set by environment variable `var` (at least `MIN_GRAPH_STEPS`), else
/// `default`.
fn steps_from_env(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).filter(|&n| n >= MIN_GRAPH_STEPS).unwrap_or(default)
}

/// The first chunk after the host drained the queue (a decode step's start: the ids
/// written, the previous step's logits read) is this short: the GPU, idle since the host
/// read, starts once these are recorded rather than after a whole chunk, and the host
/// records the rest while it runs. `DS4_GRAPH_FIRST` overrides it (for measuring).
pub const FIRST_CHUNK_STEPS: usize = 16;

fn first_chunk_steps() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| steps_from_env("DS4_GRAPH_FIRST", FIRST_CHUNK_STEPS))
}

/// The first chunk after the host submitted the queue *without* waiting for it
/// ([`LaunchPlan::submit_ahead`]: greedy decoding queues step k + 1 while the GPU runs step
/// k, `CudaSession::decode_greedy`): the GPU has a step queued, so the first chunk need not
/// be short, and longer chunks mean fewer graph launches, each a point where no kernel of
/// the next graph starts before the last one's end. H200, synthetic q2, decode steady at
/// ctx 2048 (RESULTS.md, eighteenth stop): on one lease every first chunk 16 / 64, six runs
/// each, 148.15 / 150.31 t/s (32: 148.94, 128: 149.94, three runs); on another, this
/// constant 16 / 64, four interleaved sets of 256 tokens, 152.28 / 152.83 (each 64 above
/// each 16). Where the host waits on every step (`DS4_PIPELINE=0`), 64 for every first
/// chunk was slower (two pairs: 128.0 / 120.5 against 109.6 / 118.7), hence two lengths.
/// `DS4_GRAPH_FIRST_AHEAD` overrides it.
pub const AHEAD_FIRST_CHUNK_STEPS: usize = 64;

fn ahead_first_chunk_steps() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| steps_from_env("DS4_GRAPH_FIRST_AHEAD", AHEAD_FIRST_CHUNK_STEPS))
}

/// The length of chunk `k` after the host drained the queue: `FIRST_CHUNK_STEPS` (or
/// `AHEAD_FIRST_CHUNK_STEPS` where the GPU has work `ahead`), then twice the one before,
/// up to `CHUNK_STEPS`. The GPU runs a chunk while the host records the next, and the
/// host records a launch in ~3 µs where the GPU runs it in ~7 (H200, `DS4_PROFILE=host`):
/// a chunk twice as long as the one running is recorded before the GPU runs dry, where a
/// 128-launch chunk after 16 left it idle ~250 µs a decode step. `DS4_GRAPH_RAMP=0`: the
/// first chunk, then `CHUNK_STEPS` (for measuring).
fn chunk_len(k: usize, ahead: bool) -> usize {
    let first = if ahead { ahead_first_chunk_steps() } else { first_chunk_steps() };
    let most = chunk_steps();
    if k == 0 {
        first
    } else if switched_off!("DS4_GRAPH_RAMP") {
        most
    } else {
        (first << k.min(16)).min(most)
    }
}

/// How consecutive kernels of a graph are linked (`DS4_PDL`): by a programmatic edge, so
/// that a kernel is launched before its predecessor finishes and waits for it in its
/// first statement (`griddepcontrol.wait`, which every generated kernel starts with: see
/// `ds4_codegen::cuda::GRID_WAIT`), hiding the launch latency of a step's ~1,900 small
/// kernels. `exit` (the default): launched once every block of the predecessor has
/// exited (its writes may still be in flight); `order`: once they have all started; `0`:
/// plain edges (launched after the predecessor completes). Measured on the H200
/// (synthetic q2 decode at ctx 96, t/s): 0 / order / exit: 57.0 / 47.7 / 58.5; with
/// `order` the waiting kernels hold SM slots the running one's later blocks need.
fn pdl_port() -> Option<u8> {
    static P: std::sync::OnceLock<Option<u8>> = std::sync::OnceLock::new();
    *P.get_or_init(|| match std::env::var("DS4_PDL").as_deref() {
        Ok("0") => None,
        Ok("order") => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8),
        _ => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8),
    })
}

/// How a queued step is linked to the steps before it in its graph (see the module
/// comment): after the main lane's last step (`Chain`), first of a side branch (`Fork`:
/// after the main lane's last step, with a plain edge), after the side lane's last step
/// (`Side`), or after the main lane's last step and the side branch's last (`Join`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Link {
    Chain,
    Fork,
    Side,
    Join,
}

/// The side branch as the executor marks it.
#[derive(Default)]
struct Branch {
    /// Between a side step's marking and the join.
    open: bool,
    /// The thread whose run opened it: only its steps go to the side lane. (The device
    /// opens no branch while two executor runs are in progress; this keeps out what other
    /// threads queue outside a run, such as a new session's copies.)
    owner: Option<std::thread::ThreadId>,
    /// Steps queued now go to the side lane.
    side: bool,
    /// The next side step starts the branch.
    fork_next: bool,
    /// The next main step waits for the branch.
    join_next: bool,
}

/// One queued operation.
#[derive(Clone, PartialEq)]
pub(super) enum Step {
    Kernel { func: sys::CUfunction, grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32, args: Vec<[u8; 8]> },
    Copy { dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize },
}

impl Step {
    pub(super) fn kernel(func: sys::CUfunction, grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32, args: &[Arg]) -> Step {
        Step::Kernel { func, grid, block, shared, args: args.iter().map(arg_bytes).collect() }
    }

    /// What must match for a graph node to be updated in place rather than rebuilt.
    fn shape(&self) -> (usize, u32, u32, usize) {
        match self {
            Step::Kernel { func, block, shared, args, .. } => (*func as usize, block.0, *shared, args.len()),
            Step::Copy { .. } => (0, 0, 0, 0),
        }
    }

    /// Submits the step on its own (outside a graph).
    fn submit(&self) -> Result<(), CudaError> {
        match self {
            Step::Kernel { func, grid, block, shared, args } => {
                let mut slots = args.clone();
                let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s.as_mut_ptr() as *mut c_void).collect();
                // SAFETY: one value per kernel parameter, alive until the call returns (the
                // driver copies them); the function and arguments were checked when queued.
                unsafe { cudarc::driver::result::launch_kernel(*func, *grid, *block, *shared, std::ptr::null_mut(), &mut params) }?;
            }
            // SAFETY: bounds were checked when the copy was queued (`DeviceBuf::copy_from`).
            Step::Copy { dst, src, bytes } => unsafe { cudarc::driver::result::memcpy_dtod_sync(*dst, *src, *bytes) }?,
        }
        Ok(())
    }
}

/// An argument's value as the 8 bytes a kernel parameter slot holds.
fn arg_bytes(a: &Arg) -> [u8; 8] {
    let mut s = [0u8; 8];
    match *a {
        Arg::Ptr(p) | Arg::U64(p) => s.copy_from_slice(&p.to_ne_bytes()),
        Arg::I32(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
        Arg::F32(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
        Arg::Bool(v) => s[0] = v as u8,
    }
    s
}

/// What must match, step for step, for a queue to reuse a built graph: each step's shape
/// (`Step::shape`) and link.
type StepKey = ((usize, u32, u32, usize), Link);

/// One instantiated graph and the steps its nodes hold now.
struct Built {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    steps: Vec<Step>,
    /// When it was last used (for eviction).
    used: u64,
}

/// The recorder and the graphs it has built (see the module comment).
#[derive(Default)]
pub struct LaunchPlan {
    /// Executor runs recording now (sessions sharing the device may overlap).
    recorders: usize,
    queue: Vec<Step>,
    /// Each queued step's link (parallel to `queue`).
    links: Vec<Link>,
    branch: Branch,
    built: HashMap<Vec<StepKey>, Built>,
    /// `copy_spans` (`ds4_codegen::cuda_copy`), where loaded: copies queued on a lane one
    /// after another become one launch of it (`run`, `join_copy`).
    pub copy_kernel: Option<CopyKernel>,
    clock: u64,
    /// Chunks submitted since the host last drained the queue (`full`).
    chunks: usize,
    /// The queue was last drained by `submit_ahead`: the GPU has work queued ahead of
    /// what is recorded now (`chunk_len`).
    ahead: bool,
    /// Graph launches and the steps they carried (for `ds4 bench`'s report).
    pub graphs_launched: u64,
    pub steps_in_graphs: u64,
}

// SAFETY: the raw driver handles (functions, graphs, nodes) are context objects, usable
// from any thread that binds the context (every entry point does); the plan is only
// reached through the device's mutex.
unsafe impl Send for LaunchPlan {}

impl LaunchPlan {
    /// One more (or one fewer) executor run recording; recording while any is.
    pub fn set_recording(&mut self, on: bool) {
        if on {
            self.recorders += 1;
        } else {
            self.recorders = self.recorders.saturating_sub(1);
        }
    }

    fn recording(&self) -> bool {
        self.recorders > 0
    }

    /// Queues the next steps on the side lane (`true`, opening the branch if it is not
    /// open) or the main lane. Only one run recording alone branches (another session's
    /// steps stay in the chain); otherwise, and when not recording, it does nothing and
    /// says so (`false`).
    pub fn lane(&mut self, side: bool) -> bool {
        let me = std::thread::current().id();
        if self.recorders != 1 {
            // Nothing more on the side lane (an open branch still joins where it would).
            self.branch.side = false;
            return false;
        }
        if self.branch.open && self.branch.owner != Some(me) {
            // Another thread's branch: this run's steps stay in the chain.
            return false;
        }
        if side && !self.branch.open {
            self.branch.open = true;
            self.branch.owner = Some(me);
            self.branch.fork_next = true;
        }
        self.branch.side = side && self.branch.open;
        true
    }

    /// Closes the side branch: the next main step waits for it. Whether one was open.
    pub fn join(&mut self) -> bool {
        let open = std::mem::take(&mut self.branch.open);
        self.branch.owner = None;
        self.branch.side = false;
        self.branch.fork_next = false;
        self.branch.join_next |= open;
        open
    }

    /// The link of the step queued next (and the branch's state after it).
    fn next_link(&mut self) -> Link {
        let b = &mut self.branch;
        if b.side && b.owner == Some(std::thread::current().id()) {
            if std::mem::take(&mut b.fork_next) {
                Link::Fork
            } else {
                Link::Side
            }
        } else if std::mem::take(&mut b.join_next) {
            Link::Join
        } else {
            Link::Chain
        }
    }

    /// Queues `step` while recording (submitting the queue when it is full); else submits
    /// what is queued, then `step` (stream order is queue order).
    pub(super) fn run(&mut self, step: Step, ctx: sys::CUcontext) -> Result<(), CudaError> {
        if self.recording() {
            let link = self.next_link();
            // A copy of whole aligned words: a span of the `copy_spans` launch queued last
            // where it can join it, else a launch of its own.
            let step = match (self.copy_kernel, &step) {
                (Some(k), &Step::Copy { dst, src, bytes }) if whole_words(dst, src, bytes) => {
                    let span = (dst, src, bytes / 4);
                    if self.join_copy(k, span, link) {
                        return Ok(());
                    }
                    k.step(&[span])
                }
                _ => step,
            };
            self.queue.push(step);
            self.links.push(link);
            if self.full() {
                self.send(ctx)?;
                self.chunks += 1;
            }
            return Ok(());
        }
        self.submit(ctx)?;
        step.submit()
    }

    /// Adds copy `span` (destination, source, words; linked `link`) to the `copy_spans`
    /// launch queued last, where that launch is on the same lane, has room and no span of
    /// it overlaps this one: whether it did. (Copies are queued in stream order on their
    /// lane; a launch's disjoint spans do what the copies one after another did.)
    fn join_copy(&mut self, k: CopyKernel, span: (u64, u64, usize), link: Link) -> bool {
        let same_lane = matches!((self.links.last(), link), (Some(Link::Fork | Link::Side), Link::Side) | (Some(Link::Chain | Link::Join), Link::Chain));
        let Some(last) = self.queue.last_mut().filter(|_| same_lane) else { return false };
        let Some(mut spans) = k.spans_of(last) else { return false };
        let bytes = |(d, s, n): (u64, u64, usize)| ((d, 4 * n as u64), (s, 4 * n as u64));
        let (to, from) = bytes(span);
        if spans.len() >= COPY_SPANS || spans.iter().any(|&old| {
            let (old_to, old_from) = bytes(old);
            overlaps(old_to, to) || overlaps(old_from, to) || overlaps(old_to, from)
        }) {
            return false;
        }
        spans.push(span);
        *last = k.step(&spans);
        true
    }

    /// Whether the queue is long enough to submit now: [`chunk_len`] of the chunks sent
    /// since the host drained it.
    fn full(&self) -> bool {
        self.queue.len() >= chunk_len(self.chunks, self.ahead)
    }

    /// Submits the queue for the host (before it touches device memory, or as a run
    /// stops recording): the next chunk is a first one.
    pub(super) fn submit(&mut self, ctx: sys::CUcontext) -> Result<(), CudaError> {
        self.chunks = 0;
        self.ahead = false;
        self.send(ctx)
    }

    /// Submits the queue where the host goes on recording without waiting for it (a
    /// marker set a step ahead, `Marker::set`): the next chunk is a first one, of
    /// `AHEAD_FIRST_CHUNK_STEPS`, until the host next drains the queue.
    pub(super) fn submit_ahead(&mut self, ctx: sys::CUcontext) -> Result<(), CudaError> {
        self.submit(ctx)?;
        self.ahead = true;
        Ok(())
    }

    /// Submits the queue: as a graph (built or updated) when long enough, else one by one.
    fn send(&mut self, ctx: sys::CUcontext) -> Result<(), CudaError> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let steps = std::mem::take(&mut self.queue);
        let links = std::mem::take(&mut self.links);
        let n = steps.len() as u64;
        if steps.len() < MIN_GRAPH_STEPS {
            return steps.iter().try_for_each(Step::submit);
        }
        self.clock += 1;
        let key: Vec<_> = steps.iter().map(Step::shape).zip(links.iter().copied()).collect();
        let exec = match self.built.remove(&key) {
            Some(mut b) => {
                let updated = steps.iter().zip(&b.steps).enumerate().filter(|(_, (new, old))| new != old).try_for_each(|(i, (new, _))| set_node(b.exec, b.nodes[i], new, ctx));
                if updated.is_err() {
                    // The driver refused an update: this shape goes back to direct
                    // launches until it is built again (correct, only slower).
                    destroy(&b);
                    return steps.iter().try_for_each(Step::submit);
                }
                let exec = b.exec;
                b.steps = steps;
                b.used = self.clock;
                self.built.insert(key, b);
                exec
            }
            None => {
                if self.built.len() >= MAX_GRAPHS {
                    let oldest = self.built.iter().min_by_key(|(_, b)| b.used).map(|(k, _)| k.clone());
                    if let Some(b) = oldest.and_then(|k| self.built.remove(&k)) {
                        destroy(&b);
                    }
                }
                match build(&steps, &links, ctx, self.clock) {
                    Ok(b) => {
                        let exec = b.exec;
                        self.built.insert(key, Built { steps, ..b });
                        exec
                    }
                    // No graph for this queue: launched one by one.
                    Err(_) => return steps.iter().try_for_each(Step::submit),
                }
            }
        };
        // SAFETY: an instantiated graph of this context, on the legacy default stream.
        unsafe { sys::cuGraphLaunch(exec, std::ptr::null_mut()).result() }?;
        self.graphs_launched += 1;
        self.steps_in_graphs += n;
        Ok(())
    }

    /// Destroys every graph (the device is going away).
    pub fn clear(&mut self) {
        for (_, b) in self.built.drain() {
            destroy(&b);
        }
        self.queue.clear();
        self.links.clear();
    }
}

/// The most copies one `copy_spans` launch takes (`ds4_codegen::cuda_copy::MAX_SPANS`).
const COPY_SPANS: usize = ds4_codegen::cuda_copy::MAX_SPANS;

/// Whether a copy is of whole 4-byte words at aligned addresses (`copy_spans` copies words).
fn whole_words(dst: u64, src: u64, bytes: usize) -> bool {
    (dst | src | bytes as u64).is_multiple_of(4)
}

/// Whether byte ranges (start, length) `a` and `b` overlap.
fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// The loaded `copy_spans` kernel (`ds4_codegen::cuda_copy`).
#[derive(Clone, Copy)]
pub struct CopyKernel(pub sys::CUfunction);

impl CopyKernel {
    /// A launch of it over `spans` (destination, source, words), at most [`COPY_SPANS`].
    fn step(self, spans: &[(u64, u64, usize)]) -> Step {
        let mut args = vec![Arg::U64(spans.len() as u64)];
        for i in 0..COPY_SPANS {
            let (d, s, n) = spans.get(i).copied().unwrap_or((0, 0, 0));
            args.extend([Arg::U64(d), Arg::U64(s), Arg::U64(n as u64)]);
        }
        let c = ds4_codegen::cuda_copy::BLOCKS_A_SPAN;
        Step::kernel(self.0, (c, spans.len() as u32, 1), (ds4_codegen::cuda_copy::THREADS, 1, 1), 0, &args)
    }

    /// The spans of `step` if it is a launch of this kernel.
    fn spans_of(self, step: &Step) -> Option<Vec<(u64, u64, usize)>> {
        let Step::Kernel { func, args, .. } = step else { return None };
        if *func != self.0 {
            return None;
        }
        let word = |i: usize| u64::from_ne_bytes(args[i]);
        Some((0..word(0) as usize).map(|i| (word(1 + 3 * i), word(2 + 3 * i), word(3 + 3 * i) as usize)).collect())
    }
}

/// A kernel node's parameters; `slots` must outlive the call that reads them.
fn kernel_params(step: &Step, slots: &mut Vec<*mut c_void>, values: &mut [[u8; 8]]) -> Option<sys::CUDA_KERNEL_NODE_PARAMS> {
    let Step::Kernel { func, grid, block, shared, .. } = step else { return None };
    *slots = values.iter_mut().map(|s| s.as_mut_ptr() as *mut c_void).collect();
    Some(sys::CUDA_KERNEL_NODE_PARAMS {
        func: *func,
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: *shared,
        kernelParams: slots.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    })
}

/// A device-to-device copy node's parameters.
fn copy_params(step: &Step) -> Option<sys::CUDA_MEMCPY3D> {
    let Step::Copy { dst, src, bytes } = *step else { return None };
    let null = std::ptr::null_mut();
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    let p = sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: null as sys::CUarray,
        reserved0: null,
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: null,
        dstDevice: dst,
        dstArray: null as sys::CUarray,
        reserved1: null,
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: bytes,
        Height: 1,
        Depth: 1,
    };
    Some(p)
}

/// A graph of `steps` linked as `links` say (see [`Link`]), instantiated (its `steps` left
/// for the caller to fill).
fn build(steps: &[Step], links: &[Link], ctx: sys::CUcontext, clock: u64) -> Result<Built, CudaError> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: creates an empty graph.
    unsafe { sys::cuGraphCreate(&mut graph, 0).result() }?;
    let mut nodes: Vec<sys::CUgraphNode> = Vec::with_capacity(steps.len());
    let made = (|| -> Result<sys::CUgraphExec, CudaError> {
        for (s, (pred, other)) in steps.iter().zip(lane_deps(links)) {
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            // A kernel after a kernel in its lane is linked by a programmatic edge
            // (`pdl_port`), added once the node exists; anything else by a plain one.
            let both_kernels = pred.is_some_and(|p| matches!((&steps[p], s), (Step::Kernel { .. }, Step::Kernel { .. })));
            let programmatic = if both_kernels { pdl_port() } else { None };
            let mut deps: Vec<sys::CUgraphNode> = other.iter().flatten().map(|&o| nodes[o]).collect();
            if programmatic.is_none() {
                deps.extend(pred.map(|p| nodes[p]));
            }
            match s {
                Step::Kernel { args, .. } => {
                    let (mut slots, mut values) = (Vec::new(), args.clone());
                    let p = kernel_params(s, &mut slots, &mut values).ok_or_else(|| CudaError("not a kernel".into()))?;
                    // SAFETY: parameters point at live values; the driver copies them.
                    unsafe { sys::cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &p).result() }?;
                }
                Step::Copy { .. } => {
                    let p = copy_params(s).ok_or_else(|| CudaError("not a copy".into()))?;
                    // SAFETY: a 1-D device-to-device copy within checked bounds.
                    unsafe { sys::cuGraphAddMemcpyNode(&mut node, graph, deps.as_ptr(), deps.len(), &p, ctx).result() }?;
                }
            }
            if let (Some(port), Some(prev)) = (programmatic, pred.map(|p| nodes[p])) {
                let edge = sys::CUgraphEdgeData { from_port: port, to_port: 0, type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8, reserved: [0; 5] };
                // SAFETY: two kernel nodes of this graph, one edge's data.
                unsafe { sys::cuGraphAddDependencies_v2(graph, &prev, &node, &edge, 1).result() }?;
            }
            nodes.push(node);
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a complete graph of this context.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result() }?;
        Ok(exec)
    })();
    match made {
        Ok(exec) => Ok(Built { graph, exec, nodes, steps: Vec::new(), used: clock }),
        Err(e) => {
            // SAFETY: the graph made above, not instantiated.
            unsafe {
                let _ = sys::cuGraphDestroy(graph);
            }
            Err(e)
        }
    }
}

/// Each step's dependencies in its graph from the links: the step it follows in its lane
/// (linked programmatically between kernels) and up to two more (plain edges): a fork's
/// main step, a join's side step. A branch opened again before its join was used also
/// waits for the side lane's last step (nothing else would).
fn lane_deps(links: &[Link]) -> Vec<(Option<usize>, [Option<usize>; 2])> {
    let (mut last_main, mut last_side): (Option<usize>, Option<usize>) = (None, None);
    links
        .iter()
        .enumerate()
        .map(|(i, link)| {
            let deps = match link {
                Link::Chain => (last_main, [None, None]),
                Link::Fork => (None, [last_main, last_side.take()]),
                Link::Side => (last_side, [None, None]),
                Link::Join => (last_main, [last_side.take(), None]),
            };
            match link {
                Link::Chain | Link::Join => last_main = Some(i),
                Link::Fork | Link::Side => last_side = Some(i),
            }
            deps
        })
        .collect()
}

/// Updates one node of an instantiated graph to `step` (same kind and function).
fn set_node(exec: sys::CUgraphExec, node: sys::CUgraphNode, step: &Step, ctx: sys::CUcontext) -> Result<(), CudaError> {
    match step {
        Step::Kernel { args, .. } => {
            let (mut slots, mut values) = (Vec::new(), args.clone());
            let p = kernel_params(step, &mut slots, &mut values).ok_or_else(|| CudaError("not a kernel".into()))?;
            // SAFETY: a kernel node of this graph with the same function; values copied.
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &p).result() }?;
        }
        Step::Copy { .. } => {
            let p = copy_params(step).ok_or_else(|| CudaError("not a copy".into()))?;
            // SAFETY: a copy node of this graph; a checked 1-D device copy.
            unsafe { sys::cuGraphExecMemcpyNodeSetParams(exec, node, &p, ctx).result() }?;
        }
    }
    Ok(())
}

fn destroy(b: &Built) {
    // SAFETY: each handle was made once by `build` and is destroyed once.
    unsafe {
        let _ = sys::cuGraphExecDestroy(b.exec);
        let _ = sys::cuGraphDestroy(b.graph);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(arg: u64) -> Step {
        Step::kernel(std::ptr::null_mut(), (1, 1, 1), (32, 1, 1), 0, &[Arg::U64(arg)])
    }

    /// Copies queued while recording become `copy_spans` launches: those that follow each
    /// other on a lane share one (up to its span count), in queue order; a copy after a
    /// kernel, on the other lane, overlapping an earlier span, or not of whole aligned
    /// words starts anew (the last stays a copy node).
    #[test]
    fn copies_one_after_another_on_a_lane_are_one_launch() {
        let mut p = LaunchPlan { copy_kernel: Some(CopyKernel(0x1000 as sys::CUfunction)), ..Default::default() };
        let k = p.copy_kernel.unwrap();
        let ctx = std::ptr::null_mut();
        let copy = |dst: u64, src: u64, bytes: usize| Step::Copy { dst, src, bytes };
        p.set_recording(true);
        p.run(copy(0x10000, 0x20000, 64), ctx).unwrap();
        p.run(copy(0x10100, 0x20100, 128), ctx).unwrap();
        assert_eq!(p.queue.len(), 1);
        assert_eq!(k.spans_of(&p.queue[0]), Some(vec![(0x10000, 0x20000, 16), (0x10100, 0x20100, 32)]));
        // Reading what an earlier span writes: its own launch.
        p.run(copy(0x30000, 0x10000, 16), ctx).unwrap();
        assert_eq!(p.queue.len(), 2);
        // After a kernel, a new launch; then spans up to the most a launch takes.
        p.run(kernel(1), ctx).unwrap();
        for i in 0..COPY_SPANS as u64 + 1 {
            p.run(copy(0x40000 + 0x100 * i, 0x50000 + 0x100 * i, 4), ctx).unwrap();
        }
        assert_eq!(p.queue.len(), 5);
        assert_eq!(k.spans_of(&p.queue[3]).map(|s| s.len()), Some(COPY_SPANS));
        assert_eq!(k.spans_of(&p.queue[4]).map(|s| s.len()), Some(1));
        // On the side lane: a launch of its own.
        assert!(p.lane(true));
        p.run(copy(0x60000, 0x70000, 8), ctx).unwrap();
        assert_eq!((p.queue.len(), p.links[5]), (6, Link::Fork));
        p.run(copy(0x60100, 0x70100, 8), ctx).unwrap();
        assert_eq!(p.queue.len(), 6, "the side lane's copies share a launch");
        // Not whole words: a copy node.
        p.run(copy(0x60200, 0x70200, 6), ctx).unwrap();
        assert!(matches!(p.queue[6], Step::Copy { bytes: 6, .. }));
        assert_eq!(p.queue[0].shape(), p.queue[3].shape(), "one shape whatever the span count");
    }

    /// Queueing follows the count of recording runs (sessions sharing a device overlap),
    /// and a queue reports full at the chunk length; nothing here touches the driver.
    #[test]
    fn recording_is_counted_and_queues_fill_in_chunks() {
        let mut p = LaunchPlan::default();
        let ctx = std::ptr::null_mut();
        assert!(!p.recording(), "not recording: steps run at once");
        p.set_recording(true);
        p.set_recording(true);
        p.set_recording(false);
        assert!(p.recording(), "one run still records");
        p.run(kernel(1), ctx).unwrap();
        assert_eq!(p.queue.len(), 1);
        p.set_recording(false);
        p.set_recording(false); // more stops than starts stay at zero
        assert!(!p.recording());
        p.set_recording(true);
        while p.queue.len() + 1 < first_chunk_steps() {
            p.run(kernel(3), ctx).unwrap();
        }
        assert!(!p.full(), "one short of a first chunk");
        p.queue.push(kernel(4));
        assert!(p.full());
        // Past the first chunk, each twice the one before, up to whole ones.
        for k in 1..8 {
            p.chunks = k;
            p.queue.clear();
            let len = chunk_len(k, false);
            assert!(len >= chunk_len(k - 1, false).min(chunk_steps()) && len <= chunk_steps());
            while p.queue.len() + 1 < len {
                p.queue.push(kernel(3));
            }
            assert!(!p.full(), "one short of chunk {k}");
            p.queue.push(kernel(4));
            assert!(p.full());
        }
        assert_eq!(chunk_len(1, false), (2 * first_chunk_steps()).min(chunk_steps()));
        assert_eq!((chunk_len(7, false), chunk_len(usize::MAX, false)), (chunk_steps(), chunk_steps()));
        // With the GPU a step ahead, a longer first chunk, the same doubling after it.
        assert_eq!(chunk_len(0, true), ahead_first_chunk_steps());
        assert_eq!(chunk_len(1, true), (2 * ahead_first_chunk_steps()).min(chunk_steps()));
        assert_eq!(chunk_len(7, true), chunk_steps());
    }

    /// A submission ahead makes the next first chunk the longer one; the host's next
    /// drain makes it short again.
    #[test]
    fn a_submission_ahead_lengthens_the_first_chunk() {
        let mut p = LaunchPlan::default();
        let ctx = std::ptr::null_mut();
        p.set_recording(true);
        p.submit_ahead(ctx).unwrap();
        for _ in 0..first_chunk_steps() {
            p.run(kernel(1), ctx).unwrap();
        }
        assert_eq!(p.queue.len(), first_chunk_steps(), "not sent at the short length");
        assert!(p.ahead && !p.full());
        p.queue.clear();
        p.submit(ctx).unwrap();
        assert!(!p.ahead);
    }

    /// The side branch: only a run recording alone opens one; its first step forks, the
    /// next follow it, main steps in between stay in the chain, and the first main step
    /// after the join waits for it.
    #[test]
    fn a_side_branch_forks_and_joins() {
        let mut p = LaunchPlan::default();
        let ctx = std::ptr::null_mut();
        assert!(!p.lane(true), "not recording: no branch");
        p.set_recording(true);
        p.run(kernel(0), ctx).unwrap();
        assert!(p.lane(true));
        p.run(kernel(1), ctx).unwrap();
        p.run(kernel(2), ctx).unwrap();
        p.lane(false);
        p.run(kernel(3), ctx).unwrap();
        assert!(p.join());
        assert!(!p.join(), "closed");
        p.run(kernel(4), ctx).unwrap();
        p.run(kernel(5), ctx).unwrap();
        assert_eq!(p.links, vec![Link::Chain, Link::Fork, Link::Side, Link::Chain, Link::Join, Link::Chain]);
        p.set_recording(true);
        assert!(!p.lane(true), "two runs recording: no branch");
        p.run(kernel(6), ctx).unwrap();
        assert_eq!(p.links.last(), Some(&Link::Chain));
        // A run that starts recording inside a branch: the side lane takes nothing more,
        // the branch still joins.
        p.set_recording(false);
        assert!(p.lane(true));
        p.run(kernel(7), ctx).unwrap();
        p.set_recording(true);
        p.lane(true);
        p.run(kernel(8), ctx).unwrap();
        assert!(p.join());
        p.run(kernel(9), ctx).unwrap();
        assert_eq!(p.links[p.links.len() - 3..], [Link::Fork, Link::Chain, Link::Join]);
        // Another thread's steps, and its lane calls, while this thread's branch is open:
        // in the chain, and the branch stays this thread's.
        p.set_recording(false);
        assert!(p.lane(true));
        std::thread::scope(|sc| {
            sc.spawn(|| {
                assert!(!p.lane(false), "not its branch");
                p.run(kernel(10), std::ptr::null_mut()).unwrap();
            });
        });
        p.run(kernel(11), ctx).unwrap();
        assert_eq!(p.links[p.links.len() - 2..], [Link::Chain, Link::Fork]);
    }

    /// Dependencies: the main chain, a fork after the main step before it, the side chain,
    /// a second fork before any join waiting for the first branch's tail, the join waiting
    /// for the second's; graph chunks may start inside a branch (roots).
    #[test]
    fn lanes_become_dependencies() {
        use Link::*;
        let deps = lane_deps(&[Chain, Fork, Side, Chain, Fork, Side, Chain, Join, Chain]);
        assert_eq!(
            deps,
            vec![
                (None, [None, None]),
                (None, [Some(0), None]),
                (Some(1), [None, None]),
                (Some(0), [None, None]),
                (None, [Some(3), Some(2)]),
                (Some(4), [None, None]),
                (Some(3), [None, None]),
                (Some(6), [Some(5), None]),
                (Some(7), [None, None]),
            ]
        );
        assert_eq!(lane_deps(&[Side, Chain, Join]), vec![(None, [None, None]), (None, [None, None]), (Some(1), [Some(0), None])]);
    }

    /// A graph node is updated in place only where its kernel, block, shared memory and
    /// argument count match; grid and argument values may change.
    #[test]
    fn shapes_ignore_grids_and_argument_values() {
        let a = Step::kernel(std::ptr::null_mut(), (4, 1, 1), (128, 1, 1), 64, &[Arg::U64(1), Arg::F32(2.0)]);
        let b = Step::kernel(std::ptr::null_mut(), (9, 2, 1), (128, 1, 1), 64, &[Arg::U64(7), Arg::F32(-1.0)]);
        let c = Step::kernel(std::ptr::null_mut(), (4, 1, 1), (256, 1, 1), 64, &[Arg::U64(1), Arg::F32(2.0)]);
        let copy = Step::Copy { dst: 0, src: 0, bytes: 4 };
        assert_eq!(a.shape(), b.shape());
        assert_ne!(a.shape(), c.shape());
        assert_ne!(a.shape(), copy.shape());
        assert!(a != b, "different arguments: the node is updated");
    }
}
