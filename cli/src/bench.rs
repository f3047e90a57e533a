//! `ds4 bench`: prefill and decode tokens/s on the CPU or CUDA backend, as CSV.

use crate::common::load_model;
use anyhow::Result;
use ds4_runtime::cuda::{AnySession, BackendKind, CudaBackend, CudaOptions, CudaSession, Placement};
use ds4_runtime::{Session, SessionOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths to prefill, comma-separated.
    #[arg(long, default_value = "128,512")]
    pub prefill: String,
    /// Tokens to decode after each prefill.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Instead: CPU mat-vec GB/s per quant type vs copy bandwidth (see bench_matvec.rs).
    #[arg(long)]
    pub matvec: bool,
    /// --matvec: distinct matrix data per measurement (MiB; keep it well above the caches).
    #[arg(long, default_value_t = 256)]
    pub matvec_mib: usize,
    /// --matvec: passes per measurement (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub passes: usize,
    /// --matvec: comma-separated quant types (default: all supported).
    #[arg(long)]
    pub types: Option<String>,
    /// --matvec: also measure the quantized-activation fast path.
    #[arg(long)]
    pub fast: bool,
    /// Where the graph runs: cpu or cuda.
    #[arg(long, default_value = "cpu")]
    pub backend: BackendKind,
    /// CUDA: all weights in one allocation instead of one 2 MiB-aligned allocation per tensor.
    #[arg(long)]
    pub pack_weights: bool,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.matvec {
        let o = crate::bench_matvec::MatvecOpts { set_mib: a.matvec_mib, passes: a.passes, types: a.types, fast: a.fast };
        return crate::bench_matvec::run(o);
    }
    let model = load_model(a.model.as_deref())?;
    let vocab = model.hp.vocab as u32;
    // One CUDA backend (kernels compiled, weights uploaded) for every measurement.
    let cuda = match a.backend {
        BackendKind::Cpu => None,
        BackendKind::Cuda => {
            let placement = if a.pack_weights { Placement::Packed } else { Placement::PerTensor };
            let b = CudaBackend::new(&model, &CudaOptions { placement })?;
            eprintln!("ds4 bench: cuda backend on {}", b.describe());
            Some(b)
        }
    };
    println!("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,threads");
    for n in crate::common::parse_tokens(&a.prefill)? {
        let n = n as usize;
        // A deterministic prompt of in-vocabulary ids.
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 1) % vocab).collect();
        let mut s = match &cuda {
            None => AnySession::Cpu(Session::new(&model, SessionOptions::default())),
            Some(b) => AnySession::Cuda(CudaSession::new(b.clone(), SessionOptions::default())),
        };
        let t0 = Instant::now();
        let logits = s.prefill(&ids, a.chunk)?;
        let pt = t0.elapsed().as_secs_f64();
        let mut next = ds4_runtime::sample::argmax(&logits[logits.len() - vocab as usize..]) as u32;
        let t1 = Instant::now();
        for _ in 0..a.gen {
            let l = s.feed(&[next])?;
            next = ds4_runtime::sample::argmax(&l) as u32;
        }
        let gt = t1.elapsed().as_secs_f64();
        println!("{},{},{:.1},{},{:.1},{},{}", n + a.gen, n, n as f64 / pt, a.gen, a.gen as f64 / gt.max(1e-9), s.state_bytes(), rayon::current_num_threads());
    }
    Ok(())
}
