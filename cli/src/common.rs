//! What several subcommands share: loading a model (or the embedded default) and parsing
//! token lists.

use anyhow::{anyhow, Context, Result};
use ds4_model::gguf::GgufFile;
use ds4_model::synthetic::{build, SynthConfig};
use ds4_runtime::Model;
use std::path::Path;

/// Load `path`, or build the embedded default model in memory when there is none.
pub fn load_model(path: Option<&Path>) -> Result<Model> {
    match path {
        Some(p) => Model::load(p).with_context(|| format!("loading {}", p.display())),
        None => {
            let cfg = SynthConfig::tiny_default();
            eprintln!(
                "ds4: no --model given; using the embedded default: a tiny DS4-architecture model ({} layers, D={}) with RANDOM weights (seed {:#x}), so its output is noise",
                cfg.n_layer, cfg.d, cfg.seed
            );
            let file = GgufFile::from_bytes(build(&cfg)?).context("building the embedded default model")?;
            Ok(Model::from_gguf(file)?)
        }
    }
}

/// "0,5,9" → [0, 5, 9], with a clear error for anything else.
pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    let ids: Result<Vec<u32>> = s
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| anyhow!("'{t}' in --tokens is not a token id")))
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err(anyhow!("--tokens is empty"));
    }
    Ok(ids)
}

/// The sampler options of `ds4 run` / `ds4 chat` (`--temp`, `--top-p`, `--min-p`, `--seed`),
/// refused with the flag's name where they cannot sample (`SamplerOptions::check`).
pub fn sampler_options(temp: f32, top_p: f32, min_p: f32, seed: u64) -> Result<ds4_runtime::sample::SamplerOptions> {
    let o = ds4_runtime::sample::SamplerOptions { temperature: temp, top_p, min_p, seed };
    let flag = |name: &str| match name {
        "temperature" => "--temp".to_string(),
        other => format!("--{}", other.replace('_', "-")),
    };
    o.check(flag).map_err(|e| anyhow!(e))?;
    Ok(o)
}

/// Where a command's graph runs (`--backend`) and, on CUDA, how its weights are placed
/// (`--pack-weights`): the flags every command that runs the model takes.
#[derive(clap::Args)]
pub struct BackendArgs {
    /// Where the graph runs: cpu or cuda (NVRTC-compiled generated kernels on GPU 0).
    #[arg(long, default_value = "cpu")]
    pub backend: ds4_runtime::cuda::BackendKind,
    /// CUDA: all weights in one allocation instead of one 2 MiB-aligned allocation per tensor.
    #[arg(long)]
    pub pack_weights: bool,
}

impl BackendArgs {
    /// The CUDA backend's options: every weight in one allocation (`--pack-weights`), or
    /// (the default) each in its own 2 MiB-aligned one.
    pub fn cuda_options(&self) -> ds4_runtime::cuda::CudaOptions {
        use ds4_runtime::cuda::{CudaOptions, Placement};
        CudaOptions { placement: if self.pack_weights { Placement::Packed } else { Placement::PerTensor }, ..Default::default() }
    }
}
