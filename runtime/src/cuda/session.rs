//! A model on the GPU ([`CudaBackend`]: kernels compiled, weights placed) and the
//! conversations that run on it ([`CudaSession`]: the same feed / prefill / rewind API
//! as `crate::Session<f32>`).

use super::compile::Kernels;
use super::device::{CudaError, DevSlice, Device, DeviceBuf, MappedI32, Marker};
use super::device_log::DeviceLog;
use super::exec::{GpuExecutor, GreedyPicks, StepIds};
use super::expert_ids::check_expert_sources;
use super::fusion_plan::FusionPlan;
use super::placement::{DeviceWeights, Placement, WeightPlan};
use crate::session::{Model, ModelError, SessionOptions};
use crate::state::SessionState;
use ds4_codegen::manifest::KernelSet;
use ds4_ir::{Bind, Graph};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    pub placement: Placement,
    /// Tensors generated in device memory (random) instead of copied from the file.
    pub generate: std::collections::BTreeSet<String>,
    /// The most shared memory a block may have, where less than the device's: runs the
    /// paths of a device with less (sm_120's 99 KiB) on this one (`Device::open_with`).
    pub shared_optin: Option<u32>,
}

impl From<CudaError> for ModelError {
    fn from(e: CudaError) -> Self {
        ModelError::Session(e.to_string())
    }
}

/// A model's kernels and weights on GPU 0.
pub struct CudaBackend<'m> {
    pub model: &'m Model,
    pub dev: Arc<Device>,
    pub kernels: Kernels,
    pub weights: DeviceWeights,
    dummy: DeviceBuf,
    /// `hc_pre`'s ticket counters, one per token, zero between launches.
    hc_counters: DeviceBuf,
    /// RoPE frequency tables uploaded once (keyed by their bits).
    freqs: super::exec::FreqCache,
    /// The fused launches of the model's four graphs (`fusion_plan.rs`), found once.
    plans: Vec<(&'m Graph, Arc<FusionPlan>)>,
}

impl<'m> CudaBackend<'m> {
    /// Checks where the graphs' expert ids come from (`expert_ids.rs`: decode reads none
    /// back), compiles the kernels of the model's graphs (with and without the round
    /// trips) and uploads their weights.
    pub fn new(model: &'m Model, opts: &CudaOptions) -> Result<Arc<CudaBackend<'m>>, CudaError> {
        for g in [&model.graph, &model.graph_plain] {
            check_expert_sources(g, &model.weights)?;
        }
        let dev = Device::open_with(opts.shared_optin)?;
        let target = super::compile::target_for(dev.sm);
        // A model the device cannot hold is refused before its kernels compile.
        let graphs = [&model.graph, &model.graph_plain];
        let plan = WeightPlan::of(&model.weights, &graphs, opts.placement, target)?;
        plan.check_fits(&dev)?;
        let mut set = KernelSet::for_graph(&model.graph, target);
        set.extend(KernelSet::for_graph(&model.graph_plain, target));
        let kernels = Kernels::compile(&dev, &set)?;
        if let Some(k) = kernels.by_name.get(ds4_codegen::cuda_copy::NAME) {
            dev.set_copy_kernel(&k.func)?;
        }
        let weights = DeviceWeights::upload(&dev, &model.weights, &plan, &opts.generate)?;
        let dummy = dev.alloc(16)?;
        let hc_counters = dev.upload(&[0i32; ds4_codegen::cuda_hc_pre::COUNTERS])?;
        let plans = [&model.graph, &model.graph_last, &model.graph_plain, &model.graph_plain_last].into_iter().map(|g| (g, Arc::new(FusionPlan::of(g)))).collect();
        Ok(Arc::new(CudaBackend { model, dev, kernels, weights, dummy, hc_counters, freqs: Default::default(), plans }))
    }

    /// The fused launches of `g`: found at load for the model's graphs, else now.
    fn plan_for(&self, g: &Graph) -> Arc<FusionPlan> {
        match self.plans.iter().find(|(m, _)| std::ptr::eq(*m, g)) {
            Some((_, p)) => p.clone(),
            None => Arc::new(FusionPlan::of(g)),
        }
    }

    /// Device name and compute capability, for reports.
    pub fn describe(&self) -> String {
        format!("{} (sm_{}), {} MiB of weights", self.dev.name, self.dev.sm, self.weights.bytes >> 20)
    }
}

/// An executor of `graph` on `b`'s device and weights.
fn executor<'a>(b: &'a CudaBackend<'_>, graph: &'a Graph, plan: &'a FusionPlan) -> GpuExecutor<'a> {
    GpuExecutor { dev: &b.dev, kernels: &b.kernels, weights: &b.weights, graph, plan, dummy: &b.dummy, hc_counters: &b.hc_counters, freqs: &b.freqs, branch: Default::default(), digits_ahead: Default::default(), comb_pending: Default::default(), router_parts: Default::default(), shared_later: Default::default() }
}

/// One conversation on the GPU.
pub struct CudaSession<'m> {
    backend: Arc<CudaBackend<'m>>,
    graph: Cow<'m, Graph>,
    /// The last-token-logits variant of `graph`, when there is one.
    graph_last: Option<&'m Graph>,
    /// The fused launches of `graph` and of `graph_last` (`fusion_plan.rs`).
    plan: Arc<FusionPlan>,
    plan_last: Option<Arc<FusionPlan>>,
    state: SessionState<DeviceLog>,
    pos: usize,
    opts: SessionOptions,
}

impl<'m> CudaSession<'m> {
    pub fn model(&self) -> &'m Model {
        self.backend.model
    }

    pub fn new(backend: Arc<CudaBackend<'m>>, opts: SessionOptions) -> Self {
        let model = backend.model;
        let (graph, last) = if opts.plain { (&model.graph_plain, &model.graph_plain_last) } else { (&model.graph, &model.graph_last) };
        let mut s = CudaSession::with_graph(backend, Cow::Borrowed(graph), opts);
        s.graph_last = Some(last);
        s.plan_last = Some(s.backend.plan_for(last));
        s
    }

    /// A session running a custom graph of this model (its ops must be among the
    /// model's graphs', whose kernels the backend compiled).
    pub fn with_graph(backend: Arc<CudaBackend<'m>>, graph: Cow<'m, Graph>, opts: SessionOptions) -> Self {
        let state = SessionState::new(graph.n_slots, opts.max_rewind);
        let plan = backend.plan_for(&graph);
        CudaSession { backend, graph, graph_last: None, plan, plan_last: None, state, pos: 0, opts }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Bytes of per-session state (device memory held by the logs).
    pub fn state_bytes(&self) -> usize {
        self.state.bytes()
    }

    /// Feeds a batch and returns the graph's outputs for it.
    pub fn feed_outputs(&mut self, ids: &[u32]) -> Result<HashMap<String, Vec<f32>>, ModelError> {
        self.feed_with_residual(ids, None)
    }

    /// Feeds a batch to a graph over a later layer range (see `Session::feed_with_residual`).
    pub fn feed_with_residual(&mut self, ids: &[u32], residual: Option<&[f32]>) -> Result<HashMap<String, Vec<f32>>, ModelError> {
        self.run_graph(ids, residual, false)
    }

    fn run_graph(&mut self, ids: &[u32], residual: Option<&[f32]>, last_only: bool) -> Result<HashMap<String, Vec<f32>>, ModelError> {
        if ids.is_empty() {
            return Err(ModelError::Session("no tokens to feed".into()));
        }
        let vocab = self.backend.model.hp.vocab;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Session(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let ids32: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let bind = Bind { pos0: self.pos, tokens: ids.len() };
        let (graph, plan) = match (last_only, self.graph_last, &self.plan_last) {
            (true, Some(g), Some(p)) => (g, &**p),
            _ => (&*self.graph, &*self.plan),
        };
        let outs = executor(&self.backend, graph, plan).run(&mut self.state, bind, &ids32, residual)?;
        self.pos += ids.len();
        Ok(outs)
    }

    /// Greedy decoding: feeds `first`, then each pick, `n` steps in all, and returns the
    /// `n` picks, handing each to `on_pick` as it is known; where `on_pick` says false it
    /// stops, that pick the last returned and not fed (the session holds `first` and the
    /// picks before it, as a step at a time leaves it: the step already queued with that
    /// pick is undone, so the session must keep a position to rewind, `max_rewind` ≥ 1).
    /// The tokens are those `feed` and `sample::argmax` give one step at a time, but each
    /// step's logits are picked on the device (`ds4_codegen::cuda_argmax`) and the next
    /// step's embedding reads the pick there: the host queues step k + 1 before it reads
    /// pick k (from mapped host memory, once a marker after step k has passed), so the GPU
    /// does not wait for the host between steps, and no logits travel.
    pub fn decode_greedy(&mut self, first: u32, n: usize, mut on_pick: impl FnMut(u32) -> bool) -> Result<Vec<u32>, ModelError> {
        let b = self.backend.clone();
        let vocab = b.model.hp.vocab;
        if first as usize >= vocab {
            return Err(ModelError::Session(format!("token id {first} is outside the vocabulary (size {vocab})")));
        }
        if n > 0 && self.opts.max_rewind == 0 {
            return Err(ModelError::Session("greedy decoding a step ahead needs a session that can rewind one position".into()));
        }
        let dev = &b.dev;
        // Two of each: step k writes set k % 2 while step k - 1's is read.
        let picked = [DevSlice::whole(dev.alloc(4)?, 1), DevSlice::whole(dev.alloc(4)?, 1)];
        let host = MappedI32::new(dev, 2)?;
        let marks = [Marker::new(dev)?, Marker::new(dev)?];
        let first = [first as i32];
        let mut picks = Vec::with_capacity(n);
        for k in 0..=n {
            if k < n {
                let ids = if k == 0 { StepIds::Host(&first) } else { StepIds::Device { ids: &picked[(k - 1) % 2], below: vocab } };
                let to = GreedyPicks { picked: &picked[k % 2], host: &host, at: k % 2 };
                let bind = Bind { pos0: self.pos, tokens: 1 };
                executor(&b, &self.graph, &self.plan).run_greedy(&mut self.state, bind, ids, to)?;
                self.pos += 1;
                marks[k % 2].set()?;
            }
            if k > 0 {
                marks[(k - 1) % 2].wait()?;
                let t = host.get((k - 1) % 2);
                if t < 0 || t as usize >= vocab {
                    return Err(ModelError::Session(format!("the device picked token {t} outside the vocabulary (size {vocab})")));
                }
                picks.push(t as u32);
                if !on_pick(t as u32) {
                    if k < n {
                        // Step k, queued before pick k - 1 was known, fed that pick: the
                        // session goes back to where a step at a time would have stopped
                        // (the logs' lengths, on the host: what is queued later runs after
                        // step k on the device).
                        self.rewind(1)?;
                    }
                    break;
                }
            }
        }
        Ok(picks)
    }

    /// Feeds tokens and returns their logits, [T, vocab] row-major.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut outs = self.feed_outputs(ids)?;
        outs.remove("logits").ok_or_else(|| ModelError::Session("this graph has no logits output".into()))
    }

    /// Prefill in chunks of `chunk` tokens; the logits of every token.
    /// Feed tokens and return the last one's logits ([vocab]), the head run on it alone.
    pub fn feed_last(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut outs = self.run_graph(ids, None, true)?;
        let l = outs.remove("logits").ok_or_else(|| ModelError::Session("this graph has no logits output".into()))?;
        let vocab = self.backend.model.hp.vocab;
        Ok(l[l.len() - vocab..].to_vec())
    }

    pub fn prefill_last(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<f32>, ModelError> {
        crate::session::last_of_chunks(ids, chunk, |c| self.feed_last(c))
    }

    pub fn prefill(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<f32>, ModelError> {
        let vocab = self.backend.model.hp.vocab;
        crate::session::all_of_chunks(ids, chunk, vocab, |c| self.feed(c))
    }

    /// Drops the last `n` positions, as if they had never been fed.
    pub fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        crate::session::rewind_state(&mut self.state, &mut self.pos, &self.opts, n)
    }
}
