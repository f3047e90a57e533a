//! `ds4 run [--model M] (--tokens 0,5,9 | --prompt TEXT) -n N [--temp 0] [--plain] [--ids]`.

use crate::common::{load_model, parse_tokens};
use crate::text_model::load_text_model;
use ds4_model::tokenizer::StreamDecoder;
use anyhow::{anyhow, Result};
use ds4_runtime::sample::Sampler;
use ds4_runtime::cuda::AnySession;
use ds4_runtime::SessionOptions;
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
    #[command(flatten)]
    pub on: crate::common::BackendArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    let sampling = crate::common::sampler_options(a.temp, a.top_p, a.min_p, a.seed)?;
    // Token ids in, ids out; or text in (BOS + the text's tokens), text out.
    let (model, tok, prompt) = match (&a.tokens, &a.prompt) {
        (Some(t), _) => (load_model(a.model.as_deref())?, None, parse_tokens(t)?),
        (None, Some(text)) => {
            let tm = load_text_model(a.model.as_deref())?;
            let mut ids = vec![tm.tok.bos()];
            ids.extend(tm.tok.encode(text));
            (tm.model, Some(tm.tok), ids)
        }
        (None, None) => return Err(anyhow!("give a prompt with --tokens 0,5,9 or --prompt TEXT")),
    };
    let mut s = AnySession::open(&model, a.on.backend, SessionOptions { plain: a.plain, ..Default::default() }, &a.on.cuda_options())?;
    let mut sampler = Sampler::new(sampling);
    let t0 = std::time::Instant::now();
    let logits = s.prefill_last(&prompt, a.chunk)?;
    let t_prefill = t0.elapsed();
    let mut next = sampler.sample(&logits) as u32;
    let mut out = Vec::with_capacity(a.n);
    let t1 = std::time::Instant::now();
    let stdout = std::io::stdout();
    let mut stream = tok.as_ref().map(|_| StreamDecoder::new());
    {
        let mut emit = |t: u32| {
            out.push(t);
            if !a.ids {
                match (&tok, &mut stream) {
                    (Some(tk), Some(sd)) => print!("{}", sd.push(tk, t)),
                    _ => print!("{}{t}", if out.len() > 1 { " " } else { "" }),
                }
                stdout.lock().flush().ok();
            }
        };
        if a.n > 0 {
            emit(next);
            if a.temp <= 0.0 {
                // Greedy: on CUDA the picks stay on the device, the host a step ahead.
                s.decode_greedy(next, a.n - 1, |t| {
                    emit(t);
                    true
                })?;
            } else {
                for _ in 1..a.n {
                    let l = s.feed(&[next])?;
                    next = sampler.sample(&l) as u32;
                    emit(next);
                }
            }
        }
    }
    if !a.ids {
        if let Some(sd) = &mut stream {
            print!("{}", sd.finish());
        }
        println!();
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
