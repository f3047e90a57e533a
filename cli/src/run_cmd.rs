//! `ds4 run [--model M] (--tokens 0,5,9 | --prompt TEXT) -n N [--temp 0] [--plain] [--ids]`.

use crate::common::{load_model, parse_tokens};
use anyhow::{anyhow, Result};
use ds4_runtime::sample::{Sampler, SamplerOptions};
use ds4_runtime::{Session, SessionOptions};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RunArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Comma-separated prompt token ids.
    #[arg(long, conflicts_with = "prompt")]
    pub tokens: Option<String>,
    /// Prompt text.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n", default_value_t = 16)]
    pub n: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Without the FP8 / FP4 activation round trips.
    #[arg(long)]
    pub plain: bool,
    /// Print only the generated ids, comma-separated on one line.
    #[arg(long)]
    pub ids: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    let prompt = match (&a.tokens, &a.prompt) {
        (Some(t), _) => parse_tokens(t)?,
        (None, Some(_)) => return Err(anyhow!("--prompt needs a tokenizer, which this build does not have yet; pass --tokens instead")),
        (None, None) => return Err(anyhow!("give a prompt with --tokens 0,5,9 (or --prompt TEXT)")),
    };
    let model = load_model(a.model.as_deref())?;
    let vocab = model.hp.vocab;
    let mut s: Session<f32> = Session::new(&model, SessionOptions { plain: a.plain, ..Default::default() });
    let mut sampler = Sampler::new(SamplerOptions { temperature: a.temp, top_p: a.top_p, min_p: a.min_p, seed: a.seed });
    let t0 = std::time::Instant::now();
    let logits = s.prefill(&prompt, a.chunk)?;
    let t_prefill = t0.elapsed();
    let mut next = sampler.sample(&logits[logits.len() - vocab..]) as u32;
    let mut out = Vec::with_capacity(a.n);
    let t1 = std::time::Instant::now();
    let stdout = std::io::stdout();
    for i in 0..a.n {
        out.push(next);
        if !a.ids {
            print!("{next}{}", if i + 1 < a.n { " " } else { "\n" });
            stdout.lock().flush().ok();
        }
        if i + 1 == a.n {
            break;
        }
        let l = s.feed(&[next])?;
        next = sampler.sample(&l) as u32;
    }
    if a.ids {
        let line: Vec<String> = out.iter().map(|t| t.to_string()).collect();
        println!("{}", line.join(","));
    }
    let dec = t1.elapsed().as_secs_f64();
    eprintln!(
        "prefill {} tokens in {:.3}s ({:.1} t/s); generated {} tokens ({:.1} t/s)",
        prompt.len(),
        t_prefill.as_secs_f64(),
        prompt.len() as f64 / t_prefill.as_secs_f64().max(1e-9),
        out.len(),
        (out.len().saturating_sub(1)) as f64 / dec.max(1e-9)
    );
    Ok(())
}
