//! The CLI forms external checks rely on, and its refusals of bad input.

use std::path::PathBuf;
use std::process::Command;

fn ds4() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4"))
}

fn golden(name: &str) -> PathBuf {
    ds4_golden::model_path(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn run_ids_prints_the_golden_greedy_continuation() {
    let r = ds4_golden::load_reference("tiny-f32", true).unwrap();
    let toks: Vec<String> = r["p1.tokens"].as_ids().iter().map(|t| t.to_string()).collect();
    let want: Vec<String> = r["p1.greedy_tokens"].as_ids().iter().map(|t| t.to_string()).collect();
    let out = ds4().args(["run", "--model"]).arg(golden("tiny-f32")).args(["--tokens", &toks.join(","), "-n", "16", "--temp", "0", "--plain", "--ids"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want.join(","));
}

#[test]
fn logits_writes_a_safetensors_file() {
    let out_path = tmp("logits.safetensors");
    let out = ds4().args(["logits", "--model"]).arg(golden("tiny-f32")).args(["--tokens", "0,5,9", "--out"]).arg(&out_path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = ds4_golden::load_safetensors(&out_path).unwrap();
    assert_eq!(t["logits"].shape, vec![3, 384]);
}

#[test]
fn run_without_a_model_uses_the_embedded_default() {
    let out = ds4().args(["run", "--tokens", "0,5,9", "-n", "4", "--ids"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RANDOM weights"), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().split(',').count(), 4);
}

#[test]
fn inspect_lists_metadata_and_tensors() {
    let out = ds4().arg("inspect").arg(golden("tiny-q2")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("deepseek4.block_count") && s.contains("blk.0.ffn_gate_exps.weight") && s.contains("IQ2_XXS"), "{s}");
    let out = ds4().arg("inspect").arg(golden("tiny-f32")).arg("--json").output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.is_object());
}

/// Each bad input: a non-zero exit and a message naming the problem, never a panic.
fn refuses(args: &[&str], extra: Option<&PathBuf>, needle: &str) {
    let mut c = ds4();
    c.args(args);
    if let Some(p) = extra {
        c.arg(p);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(out.status.code(), Some(1), "{args:?}: exit {:?} (a panic exits 101): {err}", out.status.code());
    assert!(err.contains(needle), "{args:?}: '{needle}' not in: {err}");
}

#[test]
fn bad_inputs_get_clear_errors() {
    let m = golden("tiny-f32");
    let ms = m.to_str().unwrap();
    refuses(&["run", "--model", ms, "--tokens", "0,384", "-n", "2"], None, "outside the vocabulary");
    refuses(&["run", "--model", ms, "--tokens", "0,x", "-n", "2"], None, "not a token id");
    refuses(&["run", "--model", "/nonexistent/model.gguf", "--tokens", "0", "-n", "1"], None, "/nonexistent/model.gguf");
    // A corrupt file: the golden model truncated in the middle of its tensor data.
    let bytes = std::fs::read(&m).unwrap();
    let trunc = tmp("truncated.gguf");
    std::fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
    refuses(&["run", "--tokens", "0", "-n", "1", "--model"], Some(&trunc), "past end of file");
    let garbage = tmp("garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file at all").unwrap();
    refuses(&["inspect"], Some(&garbage), "magic");
    // Sampler options that cannot sample, before any model is loaded.
    refuses(&["run", "--model", ms, "--tokens", "0", "-n", "1", "--temp", "nan"], None, "--temp is NaN");
    refuses(&["run", "--model", ms, "--tokens", "0", "-n", "1", "--temp=-1"], None, "--temp is -1");
    refuses(&["run", "--model", ms, "--tokens", "0", "-n", "1", "--top-p", "0"], None, "--top-p is 0; it must be in (0, 1]");
    refuses(&["run", "--model", ms, "--tokens", "0", "-n", "1", "--min-p", "2"], None, "--min-p is 2; it must be in [0, 1]");
    refuses(&["chat", "--model", ms, "--top-p", "1.5"], None, "--top-p is 1.5");
    // An output that cannot be written, said as a sentence.
    refuses(&["logits", "--model", ms, "--tokens", "0", "--out", "/nonexistent/dir/x.safetensors"], None, "writing /nonexistent/dir/x.safetensors: No such file or directory");
}

/// `ds4 bench --synthetic`: bad architecture, recipe or layer count, or a backend that
/// cannot hold it, are refused with a clear message (the CUDA run is in gpu-check.sh).
#[test]
fn bench_synthetic_refuses_what_it_cannot_do() {
    refuses(&["bench", "--synthetic", "llama"], None, "the only synthetic architecture is ds4-flash");
    refuses(&["bench", "--synthetic", "ds4-flash", "--recipe", "q3", "--backend", "cuda"], None, "expected q2 or q4");
    refuses(&["bench", "--synthetic", "ds4-flash", "--layers", "0", "--backend", "cuda"], None, "at least 1");
    refuses(&["bench", "--synthetic", "ds4-flash", "--layers", "2"], None, "use it with --backend cuda");
}

/// `ds4 bench --repeat N` on the CPU: the CSV header, then N rows for each prefill length
/// (one loaded model, a fresh session each), and the median rates on stderr (none for what
/// `--gen 0` or a prefill of 0 does not measure); `--repeat 0` is refused.
#[test]
fn bench_repeats_each_measurement_on_one_model() {
    let out = ds4().args(["bench", "--model"]).arg(golden("tiny-f32")).args(["--prefill", "5,9", "--gen", "4", "--chunk", "4", "--repeat", "3"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 3, "{stdout}");
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(header[..6], ["ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps", "gen_tps_ss"]);
    for (i, row) in lines[1..].iter().enumerate() {
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), header.len(), "{row}");
        let n = if i < 3 { 5 } else { 9 };
        assert_eq!((cols[0], cols[1], cols[3]), (&*(n + 4).to_string(), &*n.to_string(), "4"), "{row}");
        assert!(cols[5].parse::<f64>().unwrap() > 0.0, "{row}");
    }
    assert_eq!(stderr.matches(", 3 runs: decode steady median ").count(), 2, "{stderr}");
    assert_eq!(stderr.matches("prefill median ").count(), 2, "{stderr}");
    refuses(&["bench", "--repeat", "0", "--model"], Some(&golden("tiny-f32")), "--repeat must be at least 1");
    // Nothing decoded (or nothing prefilled) is said so, not reported as a rate of 0.
    let out = ds4().args(["bench", "--model"]).arg(golden("tiny-f32")).args(["--prefill", "5", "--gen", "0", "--repeat", "2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("2 runs: no decode (--gen 0), prefill median "), "{stderr}");
    let out = ds4().args(["bench", "--model"]).arg(golden("tiny-f32")).args(["--prefill", "0", "--gen", "2", "--repeat", "2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("2 runs: decode steady median ") && stderr.contains(", no prefill"), "{stderr}");
}

/// A model whose tensor table does not match the graph is refused naming the tensor.
#[test]
fn missing_or_misshaped_tensors_are_named() {
    use ds4_model::gguf::GgufFile;
    use ds4_model::gguf_writer::GgufWriter;
    let src = GgufFile::open(&golden("tiny-f32")).unwrap();
    let rewrite = |skip: &str, reshape: Option<&str>| -> PathBuf {
        let mut w = GgufWriter::new();
        for (k, v) in &src.metadata {
            w.add_meta(k.clone(), v.clone()).unwrap();
        }
        for t in &src.tensors {
            if t.name == skip {
                continue;
            }
            let mut dims = t.dims.clone();
            if Some(t.name.as_str()) == reshape {
                dims.reverse();
            }
            w.add_tensor(&t.name, t.ggml_type, &dims, src.tensor_data(t).to_vec()).unwrap();
        }
        let p = tmp(&format!("edit-{skip}-{}.gguf", reshape.unwrap_or("")));
        w.write(&p).unwrap();
        p
    };
    let missing = rewrite("blk.3.attn_kv.weight", None);
    refuses(&["run", "--tokens", "0", "-n", "1", "--model"], Some(&missing), "blk.3.attn_kv.weight");
    let bad_shape = rewrite("", Some("blk.2.attn_q_b.weight"));
    refuses(&["run", "--tokens", "0", "-n", "1", "--model"], Some(&bad_shape), "blk.2.attn_q_b.weight");
}

#[test]
fn tokenize_jsonl_reproduces_the_golden_cases() {
    let cases = ds4_golden::golden_dir().join("tokenizer/cases.jsonl");
    let tok = ds4_golden::golden_dir().join("tokenizer/tokenizer.gguf");
    let out = ds4().args(["tokenize", "--model"]).arg(&tok).arg("--jsonl").arg(&cases).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want: Vec<serde_json::Value> = std::fs::read_to_string(&cases).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let got: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["text"], w["text"]);
        assert_eq!(g["ids"], w["ids"], "text {:?}", w["text"]);
    }
}

#[test]
fn run_prompt_works_on_the_embedded_default() {
    let out = ds4().args(["run", "--prompt", "Hello", "-n", "3", "--ids"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().split(',').count(), 3);
}
