//! `ds4 serve [--model M] [--host H] [--port P] [--backend cpu|cuda]`: an OpenAI-compatible
//! HTTP server.
//!
//! Each generation request gets its own session on a blocking thread, so requests share
//! nothing mutable; `--parallel` bounds how many run at once (the rest queue). The model
//! (and with `--backend cuda` its kernels and device weights) is loaded once and leaked:
//! it lives as long as the process, and every session borrows it for `'static`. On CUDA
//! the requests' sessions share the device (their decode steps take turns in its launch
//! queue; `cuda_golden` holds two at once to their logits alone).

mod error;
pub mod generate;
mod http;
mod ids;
mod job;
mod openai;
pub mod output;
mod request;
mod routes;
mod server;

use crate::text_model::{load_text_model, TextModel};
use anyhow::{Context, Result};
use ds4_model::chat::ThinkMode;
use request::Defaults;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use tokio::sync::Semaphore;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// GGUF model; without it, the embedded default (random weights) with the DS4 tokenizer.
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port; the address is printed on stderr either way.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Generations that run at once; further requests wait their turn.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Thinking for chat requests that do not say: none, high or max.
    #[arg(long, default_value = "high", value_parser = parse_think)]
    pub think: ThinkMode,
    /// max_tokens for requests that do not give one.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Prefill batch size.
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    /// On SIGTERM / SIGINT, seconds to let running generations finish before they are cut.
    #[arg(long, default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    #[command(flatten)]
    pub on: crate::common::BackendArgs,
}

fn parse_think(s: &str) -> Result<ThinkMode, String> {
    ThinkMode::parse(s).ok_or_else(|| format!("'{s}' is not one of none, high, max"))
}

#[derive(Default)]
pub struct Stats {
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
}

/// What every request handler shares; nothing in it belongs to one request.
pub struct State {
    pub tm: &'static TextModel,
    /// The GPU the sessions run on (`--backend cuda`), loaded once.
    pub cuda: Option<Arc<ds4_runtime::cuda::CudaBackend<'static>>>,
    pub defaults: Defaults,
    pub chunk: usize,
    pub max_body: usize,
    pub permits: Arc<Semaphore>,
    /// Shutdown has begun: new generations are refused.
    pub draining: AtomicBool,
    /// The shutdown grace period is over: running generations stop.
    pub stopping: AtomicBool,
    pub stats: Stats,
    /// When the server started (the model's `created`).
    pub started: u64,
}

pub fn run(a: ServeArgs) -> Result<()> {
    anyhow::ensure!(a.parallel >= 1, "--parallel must be at least 1");
    anyhow::ensure!(a.max_tokens >= 1, "--max-tokens must be at least 1");
    anyhow::ensure!(a.shutdown_timeout >= 0.0, "--shutdown-timeout must not be negative");
    let tm: &'static TextModel = Box::leak(Box::new(load_text_model(a.model.as_deref())?));
    let cuda = a.on.backend.load(&tm.model, &a.on.cuda_options()).context("--backend cuda")?;
    let state = Arc::new(State {
        tm,
        cuda,
        defaults: Defaults { think: a.think, max_tokens: a.max_tokens },
        chunk: a.chunk.max(1),
        max_body: a.max_body,
        permits: Arc::new(Semaphore::new(a.parallel)),
        draining: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        stats: Stats::default(),
        started: routes::unix_now(),
    });
    // Two I/O threads are plenty: the model work runs on blocking threads.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the async runtime")?;
    let res = rt.block_on(server::serve(state, &a.host, a.port, std::time::Duration::from_secs_f64(a.shutdown_timeout)));
    // Generation threads have been told to stop; do not wait on a straggler forever.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    res
}
