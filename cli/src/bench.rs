//! `ds4 bench`: prefill and decode tokens/s on the CPU or CUDA backend, as CSV.

use crate::common::load_model;
use anyhow::Result;
use ds4_runtime::cuda::{AnySession, BackendKind, CudaOptions};
use ds4_runtime::SessionOptions;
use ds4_model::gguf::GgufFile;
use ds4_model::synthetic::{build_writer, RealLayout, SynthConfig};
use ds4_runtime::traffic::decode_weight_bytes_stored;
use ds4_runtime::Model;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(long, conflicts_with = "synthetic")]
    pub model: Option<PathBuf>,
    /// Instead of a file: a synthetic model of this architecture with random weights made
    /// in device memory (CUDA only). Only `ds4-flash` (DeepSeek-V4-Flash's shapes).
    #[arg(long)]
    pub synthetic: Option<String>,
    /// --synthetic: the real file layout to imitate, q2 or q4.
    #[arg(long, default_value = "q2")]
    pub recipe: String,
    /// --synthetic: layers (43 in DeepSeek-V4-Flash).
    #[arg(long, default_value_t = 43)]
    pub layers: usize,
    /// Prompt lengths to prefill, comma-separated.
    #[arg(long, default_value = "128,512")]
    pub prefill: String,
    /// Tokens to decode after each prefill.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Measure each prefill length (with its decode) this many times on the one loaded
    /// model: a CSV row each, and the median rates on stderr. Runs of one binary
    /// vary by more than a change measured one run apart (a lease's noise:
    /// bench/RESULTS.md), while a load costs tens of seconds on a full-size file.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
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
    #[command(flatten)]
    pub on: crate::common::BackendArgs,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.matvec && a.on.backend == BackendKind::Cuda {
        return cuda_kernels(a.passes, &a.prefill);
    }
    if a.matvec {
        let o = crate::bench_matvec::MatvecOpts { set_mib: a.matvec_mib, passes: a.passes, types: a.types, fast: a.fast };
        return crate::bench_matvec::run(o);
    }
    if a.repeat == 0 {
        anyhow::bail!("--repeat must be at least 1");
    }
    let t_load = Instant::now();
    let (model, generate) = match &a.synthetic {
        None => (load_model(a.model.as_deref())?, BTreeSet::new()),
        Some(arch) => synthetic_model(arch, &a.recipe, a.layers, a.on.backend)?,
    };
    // One CUDA backend (kernels compiled, weights uploaded) for every measurement.
    let cuda = a.on.backend.load(&model, &CudaOptions { generate, ..a.on.cuda_options() })?;
    eprintln!("ds4 bench: model ready in {:.1} s", t_load.elapsed().as_secs_f64());
    // The roofline: weight bytes per decoded token (as the backend stores them) over the
    // measured copy bandwidth.
    let step_bytes = decode_weight_bytes_stored(&model.graph_last, &model.weights, |n| cuda.as_ref().and_then(|b| b.weights.tensor(n).ok()).map(|t| t.bytes));
    let copy_gbs = match &cuda {
        Some(b) => b.dev.copy_bandwidth(1 << 30, 5)?,
        None => crate::bench_matvec::memory_bandwidth(256 << 20, 3).0,
    };
    let roofline_tps = copy_gbs * 1e9 / step_bytes.max(1) as f64;
    eprintln!("ds4 bench: {:.3} GB of weights read per decoded token; copy bandwidth {copy_gbs:.0} GB/s; roofline {roofline_tps:.1} tokens/s", step_bytes as f64 / 1e9);
    let roof = Roofline { step_bytes, copy_gbs, tps: roofline_tps };
    println!("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,gen_tps_ss,first_token_sec,kvcache_bytes,weight_bytes_per_token,copy_gbs,roofline_tps,gen_frac_roofline,threads");
    for n in crate::common::parse_tokens(&a.prefill)? {
        let n = n as usize;
        let (mut prefill, mut steady) = (Vec::with_capacity(a.repeat), Vec::with_capacity(a.repeat));
        for _ in 0..a.repeat {
            let (p, d) = measure(&a, &model, cuda.as_ref(), n, &roof)?;
            prefill.push(p);
            steady.push(d);
        }
        if a.repeat > 1 {
            let (decode, prefill) = (median(&mut steady), median(&mut prefill));
            let list: Vec<String> = steady.iter().map(|t| format!("{t:.2}")).collect();
            // A rate of nothing measured is not a rate: say what was not measured.
            let decode = if a.gen == 0 { "no decode (--gen 0)".to_string() } else { format!("decode steady median {decode:.2} t/s ({})", list.join(" ")) };
            let prefill = if n == 0 { "no prefill".to_string() } else { format!("prefill median {prefill:.1} t/s") };
            eprintln!("ds4 bench: prefill {n}, {} runs: {decode}, {prefill}", a.repeat);
        }
    }
    Ok(())
}

/// Weight bytes a decoded token reads, the copy bandwidth, and the decode rate that
/// bandwidth gives those bytes.
struct Roofline {
    step_bytes: u64,
    copy_gbs: f64,
    tps: f64,
}

/// One measurement of a prefill of `n` tokens and `a.gen` decode steps on a fresh session:
/// its CSV row printed, its prefill and steady decode rates returned.
fn measure(a: &BenchArgs, model: &Model, cuda: Option<&std::sync::Arc<ds4_runtime::cuda::CudaBackend>>, n: usize, roof: &Roofline) -> Result<(f64, f64)> {
    // A deterministic prompt of in-vocabulary ids.
    let vocab = model.hp.vocab as u32;
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 1) % vocab).collect();
    let mut s = AnySession::on(model, cuda, SessionOptions::default());
    let t0 = Instant::now();
    let logits = s.prefill_last(&ids, a.chunk)?;
    let prefill_tps = n as f64 / t0.elapsed().as_secs_f64();
    let next = ds4_runtime::sample::argmax(&logits) as u32;
    let first_token = t0.elapsed().as_secs_f64();
    let prof = ds4_runtime::cuda::profile::report();
    if !prof.is_empty() {
        eprintln!("DS4_PROFILE, prefill of {n}:\n{prof}");
    }
    // Every step's time: gen_tps over all of them, gen_tps_ss over the second half
    // (steady state: caches and buffer pools warm).
    // (On CUDA the host queues a step before it reads the last one's pick: a step's
    // time is the time between picks.)
    let mut steps = Vec::with_capacity(a.gen);
    let mut t = Instant::now();
    s.decode_greedy(next, a.gen, |_| {
        steps.push(t.elapsed().as_secs_f64());
        t = Instant::now();
        true
    })?;
    let tps = |d: &[f64]| if d.is_empty() { 0.0 } else { d.len() as f64 / d.iter().sum::<f64>().max(1e-9) };
    let (gen_tps, ss_tps) = (tps(&steps), tps(&steps[steps.len() / 2..]));
    println!(
        "{},{},{:.1},{},{:.2},{:.2},{:.3},{},{},{:.0},{:.1},{:.4},{}",
        n + a.gen,
        n,
        prefill_tps,
        a.gen,
        gen_tps,
        ss_tps,
        first_token,
        s.state_bytes(),
        roof.step_bytes,
        roof.copy_gbs,
        roof.tps,
        ss_tps / roof.tps,
        rayon::current_num_threads()
    );
    let prof = ds4_runtime::cuda::profile::report();
    if !prof.is_empty() {
        eprintln!("DS4_PROFILE, {} decode steps:\n{prof}", a.gen);
    }
    Ok((prefill_tps, ss_tps))
}

/// The middle value (of an even count, the mean of the two in the middle).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) { (v[m - 1] + v[m]) / 2.0 } else { v[m] }
}

/// `--synthetic ds4-flash`: the real layout with its big tensors deferred (never in host
/// memory), and the names of those, which the CUDA backend fills with random blocks.
fn synthetic_model(arch: &str, recipe: &str, layers: usize, backend: BackendKind) -> Result<(Model, BTreeSet<String>)> {
    if arch != "ds4-flash" {
        anyhow::bail!("--synthetic {arch}: the only synthetic architecture is ds4-flash");
    }
    let recipe = RealLayout::parse(recipe).ok_or_else(|| anyhow::anyhow!("--recipe {recipe}: expected q2 or q4"))?;
    if layers == 0 {
        anyhow::bail!("--layers must be at least 1");
    }
    if backend != BackendKind::Cuda {
        anyhow::bail!("--synthetic makes its weights in device memory: use it with --backend cuda");
    }
    let w = build_writer(&SynthConfig::ds4_flash(layers, recipe))?;
    let generate = w.deferred_names().map(String::from).collect();
    // A sparse file holds the layout (its big tensors are holes, never read: the device
    // makes them); it is unlinked once mapped.
    let path = std::env::temp_dir().join(format!("ds4-synthetic-{}.gguf", std::process::id()));
    w.write_sparse(&path)?;
    let file = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    let model = Model::from_gguf(file?)?;
    Ok((model, generate))
}

/// `--matvec --backend cuda`: the quant kernels alone at DeepSeek-V4-Flash's shapes
/// (decode mat-vecs, and prefill matmuls at the first --prefill length).
fn cuda_kernels(passes: usize, prefill: &str) -> Result<()> {
    use ds4_runtime::cuda::kernel_bench;
    let m = crate::common::parse_tokens(prefill)?.first().copied().unwrap_or(0) as usize;
    let cases = kernel_bench::ds4_flash_cases(m);
    let (rows, copy_gbs, name) = kernel_bench::run(&cases, passes.max(1) * 20)?;
    eprintln!("ds4 bench: quant kernels on {name}; copy bandwidth {copy_gbs:.0} GB/s");
    println!("what,kernel,n,k,m,picks,us_per_call,weight_gbs,frac_copy,tflops,regs,blocks_per_sm");
    for r in rows {
        let c = &r.case;
        println!(
            "{},{},{},{},{},{},{:.1},{:.0},{:.3},{:.2},{},{}",
            c.what,
            r.kernel,
            c.n,
            c.k,
            c.m,
            c.experts.map_or(1, |e| e.1),
            r.micros,
            r.gbs,
            r.gbs / copy_gbs,
            r.tflops,
            r.regs,
            r.blocks_per_sm
        );
    }
    Ok(())
}
