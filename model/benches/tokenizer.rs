//! Tokenizer speed: `cargo bench -p ds4-model --bench tokenizer [-- FILE...]`.
//!
//! Loads the golden DS4 tokenizer and reports, for each text (this repository's Rust
//! sources and docs, the golden cases repeated, and any FILE given), the speed of the
//! pre-tokenizer alone, of a full `encode`, and of `decode`. Best of five runs each.

use std::path::PathBuf;
use std::time::Instant;

use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::{pre_tokenize, Tokenizer};

fn golden_dir() -> PathBuf {
    match std::env::var_os("DS4_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")),
    }
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(r);
    }
    (best, out.unwrap())
}

fn bench(label: &str, tok: &Tokenizer, text: &str) {
    let mb = text.len() as f64 / 1e6;
    let (pre_s, pieces) = best_of(5, || pre_tokenize(text).len());
    let (enc_s, ids) = best_of(5, || tok.encode(text));
    let (dec_s, back) = best_of(5, || tok.decode(&ids));
    assert!(back == text, "{label}: decode(encode) differs");
    println!(
        "{label}: {mb:.2} MB, {pieces} pieces, {} tokens | pre-tokenize {:.0} MB/s | encode {:.1} MB/s | decode {:.0} MB/s",
        ids.len(),
        mb / pre_s,
        mb / enc_s,
        mb / dec_s
    );
}

fn main() {
    let path = golden_dir().join("tokenizer/tokenizer.gguf");
    let t = Instant::now();
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let parsed = t.elapsed().as_secs_f64();
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    println!("load: GGUF parse {:.3} s, tokenizer build {:.3} s", parsed, t.elapsed().as_secs_f64() - parsed);

    let mut repo = String::new();
    let mut stack = vec![PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") || name.ends_with(".md") {
                repo.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    bench("repository .rs/.md", &tok, &repo);

    let cases = std::fs::read_to_string(golden_dir().join("tokenizer/cases.jsonl")).expect("cases.jsonl");
    let mut mixed = String::new();
    while mixed.len() < 4 << 20 {
        for line in cases.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("case");
            mixed.push_str(v["text"].as_str().unwrap());
            mixed.push('\n');
        }
    }
    bench("golden cases repeated", &tok, &mixed);

    for arg in std::env::args().skip(1).filter(|a| !a.starts_with('-')) {
        let text = std::fs::read_to_string(&arg).unwrap_or_else(|e| panic!("{arg}: {e}"));
        bench(&arg, &tok, &text);
    }
}
