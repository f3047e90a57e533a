//! `ds4 logits --model M --tokens 0,5,9 [--plain] --out F.safetensors`: one prefill, the
//! logits of every position as `logits` (f32 [T, vocab]).

use crate::common::{load_model, parse_tokens};
use anyhow::{Context, Result};
use ds4_runtime::cuda::AnySession;
use ds4_runtime::SessionOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Comma-separated token ids.
    #[arg(long)]
    pub tokens: String,
    /// Without the FP8 / FP4 activation round trips.
    #[arg(long)]
    pub plain: bool,
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub on: crate::common::BackendArgs,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let ids = parse_tokens(&a.tokens)?;
    let model = load_model(a.model.as_deref())?;
    let mut s = AnySession::open(&model, a.on.backend, SessionOptions { plain: a.plain, ..Default::default() }, &a.on.cuda_options())?;
    let logits = s.feed(&ids)?;
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ids.len(), model.hp.vocab], &bytes)?;
    // Serialized here and written by std, whose error reads as a sentence (safetensors'
    // file writer prints its I/O error in debug form).
    let file = safetensors::serialize([("logits", view)], &None)?;
    std::fs::write(&a.out, file).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote logits [{}, {}] to {}", ids.len(), model.hp.vocab, a.out.display());
    Ok(())
}
