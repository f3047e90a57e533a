//! A loaded model and the sessions (conversations) that run on it.

use crate::all_rows::AllRows;
use crate::exec::{ExecError, Executor, RunInputs};
use crate::state::{RowLog, SessionState};
use crate::weights::{Compute, Weights};
use ds4_ir::{Bind, Graph};
use ds4_model::builder::{build_graph, BuildError, GraphOptions, TensorTable};
use ds4_model::gguf::{GgufError, GgufFile};
use ds4_model::hparams::{HParams, HParamsError};
use ds4_ir::GgmlType;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    HParams(#[from] HParamsError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Session(String),
}

struct FileTable<'a>(&'a GgufFile);

impl TensorTable for FileTable<'_> {
    fn lookup(&self, name: &str) -> Option<(GgmlType, Vec<u64>)> {
        self.0.tensor(name).map(|t| (t.ggml_type, t.dims.clone()))
    }
}

/// A model file with its hyper-parameters and the forward-pass graphs built for it.
pub struct Model {
    pub hp: HParams,
    pub weights: Weights,
    /// The DS4 graph over all layers, with the activation round trips.
    pub graph: Graph,
    /// The same without the round trips (for comparison with `reference_plain`).
    pub graph_plain: Graph,
    /// `graph` and `graph_plain` with logits for the batch's last token only (same
    /// state slots, so a session switches freely between them).
    pub graph_last: Graph,
    pub graph_plain_last: Graph,
}

impl Model {
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        Model::from_gguf(GgufFile::open(path)?)
    }

    /// Check the metadata and the tensor table against the graph, then keep the file.
    pub fn from_gguf(file: GgufFile) -> Result<Model, ModelError> {
        let hp = HParams::from_gguf(&file)?;
        let tt = FileTable(&file);
        let graph = build_graph(&hp, &tt, &GraphOptions::full(&hp))?;
        let graph_plain = build_graph(&hp, &tt, &GraphOptions { plain: true, ..GraphOptions::full(&hp) })?;
                let last = |plain| build_graph(&hp, &tt, &GraphOptions { plain, last_only: true, ..GraphOptions::full(&hp) });
        let (graph_last, graph_plain_last) = (last(false)?, last(true)?);
        Ok(Model { hp, weights: Weights::new(Arc::new(file)), graph, graph_plain, graph_last, graph_plain_last })
    }

    /// Build another graph on this model's tensors (a layer range, extra outputs).
    pub fn build(&self, opts: &GraphOptions) -> Result<Graph, ModelError> {
        Ok(build_graph(&self.hp, &FileTable(&self.weights.file), opts)?)
    }
}

#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Without the FP8 / FP4 activation round trips.
    pub plain: bool,
    /// Positions `rewind` can drop (extra state kept).
    pub max_rewind: usize,
    /// CPU fast path: matmuls quantize each activation row to int8 (blocks of 32) and use
    /// the quant types' integer dot products (`ds4_ir::quant::dot_row_fast`). Not exact:
    /// its deviation from the exact path is measured in tests/tests/fast_path.rs. Off by
    /// default (the golden tests use the exact path); ignored by the f64 reference.
    pub fast: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { plain: false, max_rewind: 256, fast: false }
    }
}

/// One conversation: the state of every layer and the position reached. `F` is f32 for
/// the CPU target, f64 for the float64 reference.
pub struct Session<'m, F> {
    model: &'m Model,
    graph: std::borrow::Cow<'m, Graph>,
    /// The last-token-logits variant of `graph`, when there is one.
    graph_last: Option<&'m Graph>,
    /// What `graph`'s and `graph_last`'s runs may skip (`crate::all_rows`), found once.
    all_rows: (AllRows, Option<AllRows>),
    state: SessionState<RowLog<F>>,
    pos: usize,
    opts: SessionOptions,
}

impl<'m, F: Compute> Session<'m, F> {
    pub fn new(model: &'m Model, opts: SessionOptions) -> Self {
        let (graph, last) = if opts.plain { (&model.graph_plain, &model.graph_plain_last) } else { (&model.graph, &model.graph_last) };
        let mut s = Session::with_graph(model, std::borrow::Cow::Borrowed(graph), opts);
        s.graph_last = Some(last);
        s.all_rows.1 = Some(AllRows::of(last));
        s
    }

    /// A session running a custom graph of this model (e.g. with per-layer outputs).
    pub fn with_graph(model: &'m Model, graph: std::borrow::Cow<'m, Graph>, opts: SessionOptions) -> Self {
        let state = SessionState::new(graph.n_slots, opts.max_rewind);
        let all_rows = (AllRows::of(&graph), None);
        Session { model, graph, graph_last: None, all_rows, state, pos: 0, opts }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    pub fn state_bytes(&self) -> usize {
        self.state.bytes()
    }

    /// Feed a batch of tokens (a prefill chunk, or one token when decoding) and return the
    /// graph's outputs for them (`logits`: [T, vocab]).
    pub fn feed_outputs(&mut self, ids: &[u32]) -> Result<std::collections::HashMap<String, Vec<F>>, ModelError> {
        self.feed_with_residual(ids, None)
    }

    /// Feed a batch to a graph over a later layer range: `residual` is the incoming
    /// hyper-connection state [T, nh, D] from the stage before (a pipeline split).
    pub fn feed_with_residual(&mut self, ids: &[u32], residual: Option<&[F]>) -> Result<std::collections::HashMap<String, Vec<F>>, ModelError> {
        self.run_graph(ids, residual, false)
    }

    fn run_graph(&mut self, ids: &[u32], residual: Option<&[F]>, last_only: bool) -> Result<std::collections::HashMap<String, Vec<F>>, ModelError> {
        if ids.is_empty() {
            return Err(ModelError::Session("no tokens to feed".into()));
        }
        let vocab = self.model.hp.vocab;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Session(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let ids32: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let bind = Bind { pos0: self.pos, tokens: ids.len() };
        let (graph, all_rows) = match (last_only, self.graph_last, &self.all_rows.1) {
            (true, Some(g), Some(rows)) => (g, rows),
            _ => (&*self.graph, &self.all_rows.0),
        };
        let ex = Executor { graph, all_rows, weights: &self.model.weights, fast: self.opts.fast };
        let outs = ex.run(&mut self.state, bind, RunInputs { ids: &ids32, residual })?;
        self.pos += ids.len();
        Ok(outs)
    }

    /// Feed tokens and return their logits, [T, vocab] row-major.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<F>, ModelError> {
        let mut outs = self.feed_outputs(ids)?;
        outs.remove("logits").ok_or_else(|| ModelError::Session("this graph has no logits output".into()))
    }

    /// Feed tokens and return the logits of the last one only ([vocab]): what generation
    /// needs, without the output head over every prompt token.
    pub fn feed_last(&mut self, ids: &[u32]) -> Result<Vec<F>, ModelError> {
        let mut outs = self.run_graph(ids, None, true)?;
        let l = outs.remove("logits").ok_or_else(|| ModelError::Session("this graph has no logits output".into()))?;
        let vocab = self.model.hp.vocab;
        Ok(l[l.len() - vocab..].to_vec())
    }

    /// Prefill in chunks of `chunk` tokens; returns the last token's logits ([vocab]).
    pub fn prefill_last(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<F>, ModelError> {
        last_of_chunks(ids, chunk, |c| self.feed_last(c))
    }

    /// Prefill in chunks of `chunk` tokens; returns the logits of every token.
    pub fn prefill(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<F>, ModelError> {
        all_of_chunks(ids, chunk, self.model.hp.vocab, |c| self.feed(c))
    }

    /// Drop the last `n` positions, as if they had never been fed.
    pub fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        rewind_state(&mut self.state, &mut self.pos, &self.opts, n)
    }
}

/// Feeds `ids` in chunks of `chunk` through `feed`; every chunk's logits (rows of `vocab`)
/// in order (every backend's `prefill`).
pub(crate) fn all_of_chunks<T>(ids: &[u32], chunk: usize, vocab: usize, mut feed: impl FnMut(&[u32]) -> Result<Vec<T>, ModelError>) -> Result<Vec<T>, ModelError> {
    let mut all = Vec::with_capacity(ids.len() * vocab);
    for c in ids.chunks(chunk.max(1)) {
        all.extend(feed(c)?);
    }
    Ok(all)
}

/// Drops the last `n` of the `pos` positions `state` holds, as if they had never been fed:
/// at most what was fed and what `opts.max_rewind` keeps (every backend's `rewind`).
pub(crate) fn rewind_state<L: crate::state::LogStore>(state: &mut SessionState<L>, pos: &mut usize, opts: &SessionOptions, n: usize) -> Result<(), ModelError> {
    if n > *pos {
        return Err(ModelError::Session(format!("cannot rewind {n} positions: only {pos} fed")));
    }
    if n > opts.max_rewind {
        return Err(ModelError::Session(format!("cannot rewind {n} positions: this session keeps state for {}", opts.max_rewind)));
    }
    *pos -= n;
    state.truncate(*pos);
    Ok(())
}

/// Feeds `ids` in chunks of `chunk` through `feed_last`; the last chunk's result (every
/// backend's `prefill_last`).
pub(crate) fn last_of_chunks<T>(ids: &[u32], chunk: usize, mut feed_last: impl FnMut(&[u32]) -> Result<Vec<T>, ModelError>) -> Result<Vec<T>, ModelError> {
    let mut last = Vec::new();
    for c in ids.chunks(chunk.max(1)) {
        last = feed_last(c)?;
    }
    Ok(last)
}
