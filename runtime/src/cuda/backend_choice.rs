//! `--backend cpu|cuda`: one session type for the CLI whichever backend runs it.

use super::session::{CudaBackend, CudaOptions, CudaSession};
use crate::session::{Model, ModelError, Session, SessionOptions};
use std::fmt;
use std::sync::Arc;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    #[default]
    Cpu,
    Cuda,
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(format!("unknown backend `{other}` (expected cpu or cuda)")),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// A session on either backend, with the API both share.
pub enum AnySession<'m> {
    Cpu(Session<'m, f32>),
    Cuda(CudaSession<'m>),
}

impl BackendKind {
    /// The GPU backend of `model` for `cuda` (its kernels compiled, its weights uploaded;
    /// said on stderr), or none for the CPU: what sessions of either kind run on.
    pub fn load<'m>(self, model: &'m Model, cuda: &CudaOptions) -> Result<Option<Arc<CudaBackend<'m>>>, ModelError> {
        match self {
            BackendKind::Cpu => Ok(None),
            BackendKind::Cuda => {
                let b = CudaBackend::new(model, cuda)?;
                eprintln!("ds4: cuda backend on {}", b.describe());
                Ok(Some(b))
            }
        }
    }
}

impl<'m> AnySession<'m> {
    /// A session of `model` on `kind` (for CUDA: compiles the kernels and uploads the
    /// weights first; one backend per session).
    pub fn open(model: &'m Model, kind: BackendKind, opts: SessionOptions, cuda: &CudaOptions) -> Result<AnySession<'m>, ModelError> {
        Ok(AnySession::on(model, kind.load(model, cuda)?.as_ref(), opts))
    }

    /// A session of `model` on the CPU, or on `cuda`'s GPU (a backend loaded once and
    /// shared by many sessions: a server's requests).
    pub fn on(model: &'m Model, cuda: Option<&Arc<CudaBackend<'m>>>, opts: SessionOptions) -> AnySession<'m> {
        match cuda {
            None => AnySession::Cpu(Session::new(model, opts)),
            Some(b) => AnySession::Cuda(CudaSession::new(b.clone(), opts)),
        }
    }

    /// Feeds tokens and returns the last one's logits ([vocab]).
    pub fn feed_last(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        match self {
            AnySession::Cpu(s) => s.feed_last(ids),
            AnySession::Cuda(s) => s.feed_last(ids),
        }
    }

    pub fn options(&self) -> &SessionOptions {
        match self {
            AnySession::Cpu(s) => s.options(),
            AnySession::Cuda(s) => s.options(),
        }
    }

    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        match self {
            AnySession::Cpu(s) => s.feed(ids),
            AnySession::Cuda(s) => s.feed(ids),
        }
    }

    /// Up to `n` greedy steps from `first`: the picks, each handed to `on_pick` as it is
    /// known, until `on_pick` says false (that pick the last; the session then holds
    /// `first` and the picks before it). On CUDA the picks stay on the device and the host
    /// runs a step ahead (`CudaSession::decode_greedy`); on the CPU, with
    /// `DS4_PIPELINE=0`, and for sessions that cannot rewind (the step ahead is undone
    /// where the caller stops), `feed` and `sample::argmax` a step at a time. The same
    /// tokens and the same session either way.
    pub fn decode_greedy(&mut self, first: u32, n: usize, mut on_pick: impl FnMut(u32) -> bool) -> Result<Vec<u32>, ModelError> {
        if let AnySession::Cuda(s) = self {
            if !switched_off!("DS4_PIPELINE") && s.options().max_rewind > 0 {
                return s.decode_greedy(first, n, on_pick);
            }
        }
        let (mut picks, mut next) = (Vec::with_capacity(n), first);
        for _ in 0..n {
            next = crate::sample::argmax(&self.feed(&[next])?) as u32;
            picks.push(next);
            if !on_pick(next) {
                break;
            }
        }
        Ok(picks)
    }

    pub fn prefill(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<f32>, ModelError> {
        match self {
            AnySession::Cpu(s) => s.prefill(ids, chunk),
            AnySession::Cuda(s) => s.prefill(ids, chunk),
        }
    }

    /// Prefill and return the last token's logits ([vocab]).
    pub fn prefill_last(&mut self, ids: &[u32], chunk: usize) -> Result<Vec<f32>, ModelError> {
        match self {
            AnySession::Cpu(s) => s.prefill_last(ids, chunk),
            AnySession::Cuda(s) => s.prefill_last(ids, chunk),
        }
    }

    pub fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        match self {
            AnySession::Cpu(s) => s.rewind(n),
            AnySession::Cuda(s) => s.rewind(n),
        }
    }

    pub fn vocab(&self) -> usize {
        match self {
            AnySession::Cpu(s) => s.model().hp.vocab,
            AnySession::Cuda(s) => s.model().hp.vocab,
        }
    }

    pub fn pos(&self) -> usize {
        match self {
            AnySession::Cpu(s) => s.pos(),
            AnySession::Cuda(s) => s.pos(),
        }
    }

    pub fn state_bytes(&self) -> usize {
        match self {
            AnySession::Cpu(s) => s.state_bytes(),
            AnySession::Cuda(s) => s.state_bytes(),
        }
    }
}
