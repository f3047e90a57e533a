//! `ds4 quantize IN.gguf OUT.gguf --recipe q2|q4|q8_0`.

use anyhow::{anyhow, Context, Result};
use ds4_model::gguf::GgufFile;
use ds4_model::quantize::{quantize_file, Recipe};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Source GGUF (F32 / F16 / BF16 tensors).
    pub input: PathBuf,
    /// Output GGUF.
    pub output: PathBuf,
    /// q2 (IQ2_XXS + Q2_K experts), q4 (Q4_K experts) or q8_0 (every matrix Q8_0).
    #[arg(long)]
    pub recipe: String,
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let recipe = Recipe::parse(&a.recipe).ok_or_else(|| anyhow!("unknown recipe '{}': use q2, q4 or q8_0", a.recipe))?;
    let src = GgufFile::open(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let t0 = std::time::Instant::now();
    // A progress bar on a terminal; nothing in logs.
    let tty = std::io::stderr().is_terminal();
    let mut bar = |done: usize, total: usize, name: &str| {
        if !tty {
            return;
        }
        let w = 30;
        let filled = (done * w).checked_div(total).unwrap_or(w);
        eprint!("\r[{}{}] {done}/{total} {name:<48}", "#".repeat(filled), " ".repeat(w - filled));
        std::io::stderr().flush().ok();
    };
    let reports = quantize_file(&src, recipe, &a.output, &mut bar).map_err(|e| {
        // Leave no half-written file behind.
        let _ = std::fs::remove_file(&a.output);
        anyhow!("{e}")
    })?;
    if tty {
        eprintln!();
    }
    println!("{:<48} {:>8} -> {:<8} {:>10}", "tensor", "from", "to", "rel RMSE");
    for r in reports.iter().filter(|r| r.from != r.to) {
        println!("{:<48} {:>8} -> {:<8} {:>10.3e}", r.name, r.from.name(), r.to.name(), r.rel_rmse);
    }
    let in_size = std::fs::metadata(&a.input)?.len();
    let out_size = std::fs::metadata(&a.output)?.len();
    eprintln!(
        "wrote {} ({} tensors, {:.2} MiB -> {:.2} MiB) in {:.1}s",
        a.output.display(),
        reports.len(),
        in_size as f64 / 1048576.0,
        out_size as f64 / 1048576.0,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
