//! `ds4 inspect FILE [--json]`.

use anyhow::{Context, Result};
use ds4_model::gguf::GgufFile;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// The GGUF file.
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: InspectArgs) -> Result<()> {
    let f = GgufFile::open(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ds4_model::inspect::inspect_json(&f))?);
    } else {
        print!("{}", ds4_model::inspect::inspect_text(&f));
    }
    Ok(())
}
