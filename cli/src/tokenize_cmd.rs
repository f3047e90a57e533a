//! `ds4 tokenize --model M (--text TEXT | --jsonl FILE)`: token ids of text, as the DS4
//! tokenizer (HF `tokenizers` semantics) gives them. The text of an added token such as
//! `<｜User｜>` or `<think>` becomes that token; no BOS is added.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The GGUF file whose tokenizer to use (a model, or a tokenizer-only GGUF).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Print the ids of this text as a JSON array.
    #[arg(long, conflicts_with = "jsonl")]
    pub text: Option<String>,
    /// Read lines `{"text": ...}` from this file ("-": standard input) and write
    /// `{"text": ..., "ids": [...]}` lines to standard output.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

/// Loads the tokenizer of a GGUF file.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let g = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    Tokenizer::from_gguf(&g).with_context(|| format!("loading the tokenizer of {}", path.display()))
}

pub fn run(args: &TokenizeArgs, tok: &Tokenizer) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    run_to(args, tok, &mut out)?;
    out.flush()?;
    Ok(())
}

/// `run`, writing to `out`.
pub fn run_to(args: &TokenizeArgs, tok: &Tokenizer, out: &mut impl Write) -> Result<()> {
    match (&args.text, &args.jsonl) {
        (Some(text), None) => {
            writeln!(out, "{}", serde_json::to_string(&tok.encode(text))?)?;
            Ok(())
        }
        (None, Some(path)) => {
            if path.as_os_str() == "-" {
                tokenize_jsonl(tok, std::io::stdin().lock(), "standard input", out)
            } else {
                let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
                tokenize_jsonl(tok, BufReader::new(f), &path.display().to_string(), out)
            }
        }
        (Some(_), Some(_)) => bail!("give either --text or --jsonl, not both"),
        (None, None) => bail!("nothing to tokenize: give --text TEXT or --jsonl FILE"),
    }
}

/// One output line per input line; blank lines are skipped. Any bad line stops the run
/// with an error naming it (nothing is written for it).
fn tokenize_jsonl(tok: &Tokenizer, input: impl BufRead, name: &str, out: &mut impl Write) -> Result<()> {
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{name}: reading line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| anyhow!("{name}: line {n} is not valid JSON: {e}"))?;
        let text = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| anyhow!("{name}: line {n}: expected an object with a string \"text\" field"))?;
        let record = serde_json::json!({ "text": text, "ids": tok.encode(text) });
        writeln!(out, "{record}")?;
    }
    Ok(())
}

/// `ds4 tokenize`: the model's tokenizer, or the embedded DS4 one without `--model`.
pub fn main(args: TokenizeArgs) -> Result<()> {
    let tok = match &args.model {
        Some(p) => load_tokenizer(p)?,
        None => crate::text_model::embedded_tokenizer()?,
    };
    run(&args, &tok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn tok() -> &'static Tokenizer {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        TOK.get_or_init(|| {
            let dir = match std::env::var_os("DS4_GOLDEN_DIR") {
                Some(d) => PathBuf::from(d),
                None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")),
            };
            load_tokenizer(&dir.join("tokenizer/tokenizer.gguf")).unwrap()
        })
    }

    fn args(text: Option<&str>, jsonl: Option<PathBuf>) -> TokenizeArgs {
        TokenizeArgs { model: None, text: text.map(String::from), jsonl }
    }

    fn run_str(a: &TokenizeArgs) -> Result<String> {
        let mut out = Vec::new();
        run_to(a, tok(), &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn text_prints_ids() {
        assert_eq!(run_str(&args(Some("Hello world"), None)).unwrap(), "[19923,2058]\n");
        assert_eq!(run_str(&args(Some("<｜User｜>hi"), None)).unwrap(), "[128803,6366]\n");
        assert_eq!(run_str(&args(Some(""), None)).unwrap(), "[]\n");
    }

    #[test]
    fn jsonl_lines() {
        let dir = std::env::temp_dir().join(format!("ds4-tokenize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.jsonl");
        std::fs::write(&good, "{\"text\": \"Hello\"}\n\n{\"text\": \"12345678901\", \"other\": 1}\n").unwrap();
        assert_eq!(
            run_str(&args(None, Some(good))).unwrap(),
            "{\"ids\":[19923],\"text\":\"Hello\"}\n{\"ids\":[6895,18009,25744,2616],\"text\":\"12345678901\"}\n"
        );
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, "{\"text\": \"ok\"}\n{\"text\": 5}\n").unwrap();
        let e = run_str(&args(None, Some(bad.clone()))).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("\"text\""), "{e}");
        std::fs::write(&bad, "{\"text\": \"ok\"}\n\nnot json\n").unwrap();
        let e = run_str(&args(None, Some(bad))).unwrap_err().to_string();
        assert!(e.contains("line 3 is not valid JSON"), "{e}");
        let e = run_str(&args(None, Some(dir.join("missing.jsonl")))).unwrap_err();
        assert!(format!("{e:#}").contains("missing.jsonl"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn needs_exactly_one_input() {
        assert!(run_str(&args(None, None)).unwrap_err().to_string().contains("nothing to tokenize"));
        assert!(run_str(&args(Some("x"), Some("f".into()))).is_err());
    }
}
