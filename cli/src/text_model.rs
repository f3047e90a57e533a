//! A model that speaks text: the weights plus the tokenizer that goes with them.
//!
//! A real DS4 GGUF carries its tokenizer in `tokenizer.ggml.*` metadata. The embedded
//! default model and the tiny test models carry none, so a model without tokenizer
//! metadata whose vocabulary is exactly the DS4 one (129,280 ids) is paired with the DS4
//! tokenizer this binary embeds (model/assets/tokenizer.gguf, see model/assets/NOTICE).
//! Any other vocabulary without a tokenizer is refused: its ids would mean nothing.

use crate::common::load_model;
use anyhow::{anyhow, Context, Result};
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;
use ds4_runtime::Model;
use std::path::Path;

/// The DS4 tokenizer as GGUF metadata, built into the binary.
static EMBEDDED_TOKENIZER: &[u8] = include_bytes!("../../model/assets/tokenizer.gguf");

/// The vocabulary size of the DS4 tokenizer, the only one the embedded tokenizer fits.
pub const DS4_VOCAB: usize = 129_280;

pub struct TextModel {
    pub model: Model,
    pub tok: Tokenizer,
    /// What `/v1/models` and responses call this model.
    pub name: String,
}

/// Load `path` (or the embedded default) with its tokenizer.
pub fn load_text_model(path: Option<&Path>) -> Result<TextModel> {
    let model = load_model(path)?;
    let file = &model.weights.file;
    let tok = if file.meta("tokenizer.ggml.model").is_some() {
        Tokenizer::from_gguf(file).context("reading the model's tokenizer")?
    } else if model.hp.vocab == DS4_VOCAB {
        embedded_tokenizer()?
    } else {
        return Err(anyhow!(
            "this model has no tokenizer metadata and its vocabulary ({}) is not the DS4 one ({DS4_VOCAB}), so text cannot be mapped to its ids",
            model.hp.vocab
        ));
    };
    if tok.vocab_size() > model.hp.vocab {
        return Err(anyhow!("the tokenizer has {} ids but the model only {}", tok.vocab_size(), model.hp.vocab));
    }
    let name = model_name(file, path);
    Ok(TextModel { model, tok, name })
}

/// The DS4 tokenizer built into this binary.
pub fn embedded_tokenizer() -> Result<Tokenizer> {
    let file = GgufFile::from_bytes(EMBEDDED_TOKENIZER.to_vec()).context("reading the embedded tokenizer")?;
    Tokenizer::from_gguf(&file).context("loading the embedded tokenizer")
}

/// `general.name` when the file has one, else the file stem, else a fixed name for the
/// embedded default.
fn model_name(file: &GgufFile, path: Option<&Path>) -> String {
    if let Some(n) = file.meta("general.name").and_then(|v| v.as_str()).filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    match path {
        Some(p) => p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "ds4".into()),
        None => "ds4-embedded-tiny".into(),
    }
}
