//! The tiny golden models on the CUDA backend, against the golden references with the
//! bounds of parity_golden.rs (never loosened), and CUDA against the CPU backend.
//! Without a CUDA device or driver every test prints "skipped: no CUDA device" and passes.

use ds4_golden::*;
use ds4_runtime::cuda::{skip_reason, use_graphs, CudaBackend, CudaOptions, CudaSession, Placement};
use ds4_runtime::{Model, Session, SessionOptions};
use std::sync::Arc;

/// A line that shows even under the test harness's output capture (which only takes
/// `print!`/`eprint!`), so a CI log says the GPU tests were skipped.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn skip() -> bool {
    match skip_reason() {
        Some(why) => {
            say(&why);
            true
        }
        None => false,
    }
}

fn load(name: &str) -> Model {
    let p = model_path(name);
    Model::load(&p).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

/// `ds4_golden::run_prompt` on a CUDA session: prefill in one batch, our greedy run,
/// and a teacher-forced run over the reference's greedy tokens.
fn run_prompt_cuda<'m>(b: &Arc<CudaBackend<'m>>, tokens: &[u32], ref_greedy: &[u32], plain: bool) -> PromptRun {
    let vocab = b.model.hp.vocab;
    let opts = SessionOptions { plain, ..Default::default() };
    let mut s = CudaSession::new(b.clone(), opts.clone());
    let logits = s.feed(tokens).unwrap();
    let last = |l: &[f32]| ds4_runtime::sample::argmax(&l[l.len() - vocab..]) as u32;
    let mut greedy = vec![last(&logits)];
    while greedy.len() < ref_greedy.len() {
        let l = s.feed(&[*greedy.last().unwrap()]).unwrap();
        greedy.push(last(&l));
    }
    // The same picks made on the device, the host a step ahead (`decode_greedy`).
    let mut d = CudaSession::new(b.clone(), opts.clone());
    d.feed(tokens).unwrap();
    let mut seen = Vec::new();
    let piped = d
        .decode_greedy(greedy[0], greedy.len() - 1, |t| {
            seen.push(t);
            true
        })
        .unwrap();
    assert_eq!(piped, greedy[1..], "decode_greedy picks other tokens than feed and argmax");
    assert_eq!(seen, piped);
    let mut t = CudaSession::new(b.clone(), opts);
    t.feed(tokens).unwrap();
    let mut step_logits = Vec::new();
    for &g in ref_greedy {
        step_logits.extend(t.feed(&[g]).unwrap().iter().map(|&v| v as f64));
    }
    PromptRun { logits: logits.iter().map(|&v| v as f64).collect(), greedy, step_logits }
}

/// The plain graph on CUDA vs `reference_plain`, within `assert_plain_parity`'s bounds.
fn plain_parity(name: &str) {
    if skip() {
        return;
    }
    let model = load(name);
    let b = CudaBackend::new(&model, &CudaOptions::default()).unwrap();
    let r = load_reference(name, true).unwrap();
    assert_plain_parity(&format!("cuda {name}"), &r, model.hp.vocab, |tokens, greedy| run_prompt_cuda(&b, tokens, greedy, true));
}

/// The full DS4 graph on CUDA (weights packed: the other placement) vs `reference`,
/// within `assert_full_parity`'s bounds.
fn full_parity(name: &str) {
    if skip() {
        return;
    }
    let model = load(name);
    let b = CudaBackend::new(&model, &CudaOptions { placement: Placement::Packed, ..Default::default() }).unwrap();
    let r = load_reference(name, false).unwrap();
    assert_full_parity(&format!("cuda {name}"), &r, model.hp.vocab, |tokens, greedy| run_prompt_cuda(&b, tokens, greedy, false));
}

/// The full DS4 graph on a device that gives a block 99 KiB of shared memory at most
/// (sm_120's and sm_89's opt-in, here a bound the backend is given): the kernels that
/// want more (the top-k sort's 128 KiB, the routing's 192 KiB) still load, with what the
/// device leaves them, and tiny-q2 meets the reference's bounds.
#[test]
fn tiny_q2_on_a_device_of_99_kib_a_block_matches_reference() {
    if skip() {
        return;
    }
    let model = load("tiny-q2");
    let b = CudaBackend::new(&model, &CudaOptions { shared_optin: Some(101_376), ..Default::default() }).unwrap();
    assert_eq!(b.dev.shared_optin, 101_376);
    for name in ["top_k_sort", "router_select"] {
        let k = b.kernels.get(name).unwrap();
        assert!(k.dyn_shared > 101_376 && k.shared_room <= 101_376, "{name}: wants {}, given {}", k.dyn_shared, k.shared_room);
    }
    let r = load_reference("tiny-q2", false).unwrap();
    assert_full_parity("cuda tiny-q2, 99 KiB a block", &r, model.hp.vocab, |tokens, greedy| run_prompt_cuda(&b, tokens, greedy, false));
}

/// CPU and CUDA backends on the same prompt: prefill in chunks, decode, rewind, decode again.
fn cpu_vs_cuda(model: &Model, label: &str) {
    let b = CudaBackend::new(model, &CudaOptions::default()).unwrap();
    let vocab = model.hp.vocab;
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 3) % vocab as u32).collect();
    for plain in [true, false] {
        let opts = SessionOptions { plain, ..Default::default() };
        let mut c: Session<f32> = Session::new(model, opts.clone());
        let mut g = CudaSession::new(b.clone(), opts);
        let mut lc = c.prefill(&ids, 16).unwrap();
        let mut lg = g.prefill(&ids, 16).unwrap();
        c.rewind(5).unwrap();
        g.rewind(5).unwrap();
        lc.extend(c.feed(&ids[35..38]).unwrap());
        lg.extend(g.feed(&ids[35..38]).unwrap());
        let lc: Vec<f64> = lc.iter().map(|&v| v as f64).collect();
        let lg: Vec<f64> = lg.iter().map(|&v| v as f64).collect();
        assert_cpu_and_cuda_agree(&lg, &lc, vocab, plain, label);
    }
}

/// CUDA logits `lg` against the CPU's `lc`: without the round trips (`plain`) within
/// 1e-4·std and the same arg-max everywhere; with them, p99 within 1e-2·std (the FP8 /
/// FP4 round trips may round a value to the neighbouring code) and 95% of the arg-maxes.
fn assert_cpu_and_cuda_agree(lg: &[f64], lc: &[f64], vocab: usize, plain: bool, label: &str) {
    let sd = std_dev(lc);
    let d = max_abs_diff(lg, lc);
    let (same, rows) = argmax_agreement(lg, lc, vocab);
    println!("cpu vs cuda {label} plain={plain}: max|Δ|={d:.3e} ({:.2e}·std) argmax {same}/{rows}", d / sd);
    if plain {
        assert!(d <= 1e-4 * sd, "{label}: CPU and CUDA logits differ by {d} > 1e-4·std");
        assert_eq!(same, rows, "{label}: arg-max differs");
    } else {
        assert!(quantile_abs_diff(lg, lc, 0.99) <= 1e-2 * sd, "{label}: p99 |Δ| over 1e-2·std");
        assert!(same as f64 >= 0.95 * rows as f64, "{label}: arg-max agrees at {same}/{rows}");
    }
}

#[test]
fn tiny_f32_plain_on_cuda_matches_reference_plain() {
    plain_parity("tiny-f32");
}
#[test]
fn tiny_f32_ds4_graph_on_cuda_matches_reference() {
    full_parity("tiny-f32");
}
#[test]
fn tiny_q2_plain_on_cuda_matches_reference_plain() {
    plain_parity("tiny-q2");
}
#[test]
fn tiny_q2_ds4_graph_on_cuda_matches_reference() {
    full_parity("tiny-q2");
}
#[test]
fn tiny_q4_plain_on_cuda_matches_reference_plain() {
    plain_parity("tiny-q4");
}
#[test]
fn tiny_q4_ds4_graph_on_cuda_matches_reference() {
    full_parity("tiny-q4");
}

#[test]
fn cpu_and_cuda_logits_agree_on_the_tiny_models() {
    if skip() {
        return;
    }
    for name in ["tiny-f32", "tiny-q2", "tiny-q4"] {
        cpu_vs_cuda(&load(name), name);
    }
}

/// Decode steps one token at a time on CPU and CUDA, within `assert_cpu_and_cuda_agree`,
/// of the synthetic model `cfg` quantized by `recipe`, plain and not: 16 tokens of prefill,
/// then 8 fed one at a time.
fn decode_agrees(cfg: ds4_model::synthetic::SynthConfig, recipe: ds4_model::quantize::Recipe) {
    use ds4_model::gguf::GgufFile;
    use ds4_model::quantize::quantize_file;
    use ds4_model::synthetic::build;
    let name = cfg.name.clone();
    let dir = std::env::temp_dir().join(format!("ds4-cuda-golden-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, quant) = (dir.join(format!("{name}.gguf")), dir.join(format!("{name}-quant.gguf")));
    std::fs::write(&src, build(&cfg).unwrap()).unwrap();
    quantize_file(&GgufFile::open(&src).unwrap(), recipe, &quant, &mut |_, _, _| {}).unwrap();
    let model = Model::load(&quant).unwrap();
    let b = CudaBackend::new(&model, &CudaOptions::default()).unwrap();
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 37 + 1) % cfg.vocab as u32).collect();
    for plain in [true, false] {
        let opts = SessionOptions { plain, ..Default::default() };
        let mut c: Session<f32> = Session::new(&model, opts.clone());
        let mut g = CudaSession::new(b.clone(), opts);
        c.prefill(&ids[..16], 16).unwrap();
        g.prefill(&ids[..16], 16).unwrap();
        let (mut lc, mut lg) = (Vec::new(), Vec::new());
        for &t in &ids[16..] {
            lc.extend(c.feed(&[t]).unwrap().iter().map(|&v| v as f64));
            lg.extend(g.feed(&[t]).unwrap().iter().map(|&v| v as f64));
        }
        assert_cpu_and_cuda_agree(&lg, &lc, model.hp.vocab, plain, &format!("{name} decode"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A q2 model whose routed experts fit `matvec_digits_iq2_xxs` (IQ2_XXS rows of whole
/// 256-blocks, 256 rows, as the golden tiny-q2's)
/// and whose 256-value Q8_0 rows (`q_lora` 256: `attn_q_a`, `attn_q_b`, `attn_kv`, the
/// shared expert's gate and up) are Q8_0_R on the device and take `matvec_digits_q8_0_r`
/// (the tiny models' 64- and 128-value rows stay Q8_0).
#[test]
fn cpu_and_cuda_decode_agree_on_a_q2_model_with_whole_blocks() {
    if skip() {
        return;
    }
    use ds4_model::synthetic::SynthConfig;
    decode_agrees(SynthConfig { d: 256, ff: 256, q_lora: 256, vocab: 512, name: "synthetic-256".into(), ..SynthConfig::tiny_default() }, ds4_model::quantize::Recipe::Q2);
}

/// A model whose `attn_q_a` (1024 rows of 1280 values) takes the dense mat-vec's four-row
/// form, which then takes the attention's Sinkhorn in a block of its own (rows of at most
/// 1024 values take the sixteen-row form, which would need 4096 rows), and whose
/// `attn_q_b` rows (1024 values) take the integer mat-vec with digits made by
/// `rms_norm_digits`: three layers (no compression, CSA, HCA), q4 (its experts quantize in
/// seconds where IQ2_XXS takes a minute).
#[test]
fn cpu_and_cuda_decode_agree_where_the_attention_sinkhorn_rides_the_dense_mat_vec() {
    if skip() {
        return;
    }
    use ds4_model::synthetic::SynthConfig;
    let cfg = SynthConfig { d: 1280, ff: 256, q_lora: 1024, vocab: 512, n_layer: 3, ratios: vec![0, 4, 8], name: "synthetic-1280".into(), ..SynthConfig::tiny_default() };
    decode_agrees(cfg, ds4_model::quantize::Recipe::Q4);
}

#[test]
fn cuda_backend_builds_or_says_why_not() {
    // Runs everywhere: either a device answers, or the reason is printed.
    match ds4_runtime::cuda::probe() {
        Ok(dev) => println!("cuda device: {dev}"),
        Err(why) => say(&format!("skipped: no CUDA device ({why})")),
    }
}

/// Decode steps submitted as CUDA graphs (the default) give the same logits, bit for bit,
/// as the same steps launched one by one, and the graphs were really used.
#[test]
fn decode_steps_as_cuda_graphs_match_direct_launches() {
    if skip() {
        return;
    }
    let model = load("tiny-q2");
    let b = CudaBackend::new(&model, &CudaOptions::default()).unwrap();
    let run = |graphs: bool| -> Vec<f32> {
        use_graphs(graphs);
        let mut s = CudaSession::new(b.clone(), SessionOptions::default());
        let mut out = s.feed(&[1, 5, 9, 2]).unwrap();
        let mut tok = 7u32;
        for _ in 0..12 {
            let l = s.feed(&[tok]).unwrap();
            tok = ds4_runtime::sample::argmax(&l) as u32;
            out.extend(l);
        }
        out
    };
    let direct = run(false);
    let before = b.dev.graph_stats();
    let graphed = run(true);
    let after = b.dev.graph_stats();
    assert!(after.0 >= before.0 + 12, "12 decode steps launched {} graphs", after.0 - before.0);
    assert_eq!(direct.len(), graphed.len());
    let differ = direct.iter().zip(&graphed).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "{differ} logits differ between graph and direct decode");
}

/// Greedy decoding with the picks on the device (`decode_greedy`) gives the tokens of
/// `feed` and `argmax` a step at a time, with the decode graphs and without, and leaves the
/// session where feeding them would (the next logits the same bits); a first token outside
/// the vocabulary is an error, not a launch.
#[test]
fn greedy_decode_on_the_device_matches_feed_and_argmax() {
    if skip() {
        return;
    }
    let model = load("tiny-q2");
    let b = CudaBackend::new(&model, &CudaOptions::default()).unwrap();
    let vocab = model.hp.vocab as u32;
    for graphs in [true, false] {
        use_graphs(graphs);
        let mut s = CudaSession::new(b.clone(), SessionOptions::default());
        s.feed(&[1, 5, 9, 2]).unwrap();
        let (mut want, mut tok) = (Vec::new(), 7u32);
        for _ in 0..20 {
            tok = ds4_runtime::sample::argmax(&s.feed(&[tok]).unwrap()) as u32;
            want.push(tok);
        }
        let after = s.feed(&[tok]).unwrap();
        let mut d = CudaSession::new(b.clone(), SessionOptions::default());
        d.feed(&[1, 5, 9, 2]).unwrap();
        let got = d.decode_greedy(7, 20, |_| true).unwrap();
        assert_eq!(got, want, "graphs {graphs}");
        assert_eq!(d.pos(), s.pos() - 1);
        let next = d.feed(&[*got.last().unwrap()]).unwrap();
        assert!(next.iter().zip(&after).all(|(a, b)| a.to_bits() == b.to_bits()), "graphs {graphs}: the logits after differ");
        assert!(d.decode_greedy(vocab, 3, |_| true).is_err());
        assert_eq!(d.decode_greedy(1, 0, |_| true).unwrap(), Vec::<u32>::new());
        // Stopped by the caller at the 6th pick (a stop token, a stop string): six picks,
        // the session fed 7 and the first five (the step queued with the 6th undone), so
        // feeding the 6th gives what a step at a time gives; at the last pick nothing is
        // undone.
        for stop in [6usize, 20] {
            let mut e = CudaSession::new(b.clone(), SessionOptions::default());
            e.feed(&[1, 5, 9, 2]).unwrap();
            let mut seen = 0;
            let got = e
                .decode_greedy(7, 20, |_| {
                    seen += 1;
                    seen < stop
                })
                .unwrap();
            assert_eq!(got, want[..stop], "graphs {graphs}, stopped at {stop}");
            assert_eq!(e.pos(), 4 + stop);
            let next = e.feed(&[want[stop - 1]]).unwrap();
            // The same feeds a token at a time (a batch of several rounds otherwise).
            let mut f = CudaSession::new(b.clone(), SessionOptions::default());
            f.feed(&[1, 5, 9, 2]).unwrap();
            for &t in [7].iter().chain(&want[..stop - 1]) {
                f.feed(&[t]).unwrap();
            }
            let plain = f.feed(&[want[stop - 1]]).unwrap();
            assert!(next.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "graphs {graphs}, stopped at {stop}: the logits after differ");
        }
        // A session that keeps no position to rewind cannot run a step ahead: an error.
        let mut g = CudaSession::new(b.clone(), SessionOptions { max_rewind: 0, ..Default::default() });
        g.feed(&[1, 5, 9, 2]).unwrap();
        assert!(g.decode_greedy(7, 3, |_| true).is_err());
    }
    use_graphs(true);
}

/// Two sessions decoding at once on one backend (a server's requests) give each the
/// logits of a session alone, bit for bit: their steps share the device's graph queue,
/// and a side branch (the shared expert, the query) opens only while one run records.
#[test]
fn sessions_decoding_at_once_match_one_alone() {
    if skip() {
        return;
    }
    let model = load("tiny-q2");
    let b = CudaBackend::new(&model, &CudaOptions::default()).unwrap();
    let run = |prompt: &[u32]| -> Vec<f32> {
        let mut s = CudaSession::new(b.clone(), SessionOptions::default());
        let mut out = s.feed(prompt).unwrap();
        let mut tok = prompt[0];
        for _ in 0..24 {
            let l = s.feed(&[tok]).unwrap();
            tok = ds4_runtime::sample::argmax(&l) as u32;
            out.extend(l);
        }
        out
    };
    let prompts: [&[u32]; 2] = [&[1, 5, 9, 2], &[7, 3]];
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| run(p)).collect();
    let together: Vec<Vec<f32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(|| run(p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        let differ = a.iter().zip(t).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "session {i}: {differ} logits differ decoding beside another");
    }
}
