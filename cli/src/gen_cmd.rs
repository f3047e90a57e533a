//! `ds4 gen --target cuda-sm90|cuda-sm120|wgsl|metal|cpu [--model M] --out DIR`: the source
//! of every kernel the model's graph runs (op kernels and, per weight type, the quant
//! kernels), plus `manifest.json` describing each (ops, types, launch, shared memory).

use crate::common::load_model;
use anyhow::{Context, Result};
use ds4_codegen::manifest::{generate, KernelSet};
use ds4_codegen::Target;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct GenArgs {
    /// cpu, cuda-sm90, cuda-sm120, wgsl or metal.
    #[arg(long)]
    pub target: Target,
    /// The model whose graph decides the kernels and weight types (default: the embedded one).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Every op kernel and every registered quant type, whatever the model uses.
    #[arg(long)]
    pub all: bool,
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: GenArgs) -> Result<()> {
    let set = if a.all {
        KernelSet::everything()
    } else {
        let model = load_model(a.model.as_deref())?;
        let mut set = KernelSet::for_graph(&model.graph, a.target);
        // The plain graph (no round trips) is a session option: its kernels are a subset.
        set.extend(KernelSet::for_graph(&model.graph_plain, a.target));
        set
    };
    let (files, manifest) = generate(&set, a.target)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    for f in &files {
        let p = a.out.join(&f.file);
        std::fs::write(&p, &f.source).with_context(|| format!("writing {}", p.display()))?;
    }
    std::fs::write(a.out.join("manifest.json"), manifest).context("writing manifest.json")?;
    eprintln!("wrote {} kernel sources and manifest.json for {} to {}", files.len(), a.target, a.out.display());
    Ok(())
}
