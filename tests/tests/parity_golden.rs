//! Whole-model parity against the golden references (HuggingFace transformers
//! DeepseekV4, float32) for the tiny models. Bounds are the issue's; they are never loosened.

use ds4_golden::*;
use ds4_runtime::Model;

fn load(name: &str) -> Model {
    let p = model_path(name);
    Model::load(&p).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

/// Plain graph vs `reference_plain`: max |Δlogit| ≤ 1e-3·std(ref), arg-max equal at every
/// position, greedy ids identical, every decode step's logits within the same bound.
fn plain_parity(name: &str) {
    let model = load(name);
    let r = load_reference(name, true).unwrap();
    let vocab = model.hp.vocab;
    for p in prompts(&r) {
        let tokens = r[&format!("{p}.tokens")].as_ids();
        let ref_logits = &r[&format!("{p}.logits")].data;
        let ref_greedy = r[&format!("{p}.greedy_tokens")].as_ids();
        let ref_steps = &r[&format!("{p}.greedy_step_logits")].data;
        let run = run_prompt(&model, &tokens, &ref_greedy, true).unwrap();
        let sd = std_dev(ref_logits);
        let d = max_abs_diff(&run.logits, ref_logits);
        let (same, rows) = argmax_agreement(&run.logits, ref_logits, vocab);
        let ds = max_abs_diff(&run.step_logits, ref_steps);
        println!("{name} plain {p}: T={} max|Δ|={d:.3e} ({:.2e}·std) argmax {same}/{rows} steps max|Δ|={ds:.3e} greedy {:?}", tokens.len(), d / sd, run.greedy == ref_greedy);
        assert!(d <= 1e-3 * sd, "{name} {p}: max |Δlogit| {d} > 1e-3·std {}", 1e-3 * sd);
        assert_eq!(same, rows, "{name} {p}: arg-max differs at {} positions", rows - same);
        assert_eq!(run.greedy, ref_greedy, "{name} {p}: greedy ids differ");
        assert!(ds <= 1e-3 * std_dev(ref_steps), "{name} {p}: decode-step max |Δ| {ds} > 1e-3·std");
    }
}

/// Full DS4 graph (FP8 KV and indexer FP4 round trips) vs `reference`: the round trips are
/// discontinuous, so bounds are statistical: arg-max equal at ≥ 99% of positions, p99
/// |Δlogit| ≤ 1e-2·std, greedy ids identical for at least the first 8 steps.
fn full_parity(name: &str) {
    let model = load(name);
    let r = load_reference(name, false).unwrap();
    let vocab = model.hp.vocab;
    let (mut same_all, mut rows_all) = (0, 0);
    for p in prompts(&r) {
        let tokens = r[&format!("{p}.tokens")].as_ids();
        let ref_logits = &r[&format!("{p}.logits")].data;
        let ref_greedy = r[&format!("{p}.greedy_tokens")].as_ids();
        let run = run_prompt(&model, &tokens, &ref_greedy, false).unwrap();
        let sd = std_dev(ref_logits);
        let q99 = quantile_abs_diff(&run.logits, ref_logits, 0.99);
        let d = max_abs_diff(&run.logits, ref_logits);
        let (same, rows) = argmax_agreement(&run.logits, ref_logits, vocab);
        same_all += same;
        rows_all += rows;
        let agree = run.greedy.iter().zip(&ref_greedy).take_while(|(a, b)| a == b).count();
        let ds = max_abs_diff(&run.step_logits, &r[&format!("{p}.greedy_step_logits")].data);
        println!(
            "{name} ds4 {p}: T={} p99|Δ|={q99:.3e} ({:.2e}·std) max|Δ|={d:.3e} argmax {same}/{rows} greedy prefix {agree}/{} decode-steps max|Δ|={ds:.3e}",
            tokens.len(),
            q99 / sd,
            ref_greedy.len()
        );
        assert!(q99 <= 1e-2 * sd, "{name} {p}: p99 |Δlogit| {q99} > 1e-2·std");
        assert!(agree >= 8, "{name} {p}: greedy ids agree for only {agree} steps");
    }
    println!("{name} ds4: arg-max agreement {same_all}/{rows_all}");
    assert!(same_all as f64 >= 0.99 * rows_all as f64, "{name}: arg-max agrees at {same_all}/{rows_all} < 99%");
}

/// The reference's own prefill-vs-decode disagreement for a prompt of the DS4 graph
/// (`hf_prefill_vs_decode_max_abs` in reference.json).
fn reference_self_disagreement(name: &str, prompt: &str) -> f64 {
    let path = golden_dir().join("models").join(name).join("reference.json");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    j["prompts"].as_array().unwrap().iter().find(|p| p["key"] == prompt).and_then(|p| p["hf_prefill_vs_decode_max_abs"].as_f64()).unwrap_or(0.0)
}

/// Per-layer residual (the HC state after each layer) vs the reference's `residual_hc`
/// (only the DS4-graph reference has them). A prompt on which the reference disagrees
/// with itself (prefill vs decode) by more than 1e-4 sits on an FP8 rounding tie (tiny-f32
/// p0: a pre-FP8 KV value of layer 2, token 1 lies 1.5e-8 relative from a rounding
/// midpoint, below f32 resolution), so it cannot be held to 1e-4: it is reported, not
/// asserted. Every other prompt must meet the bound at every layer.
fn residual_parity(name: &str) {
    let model = load(name);
    let r = load_reference(name, false).unwrap();
    let mut checked = 0;
    let graph = model.build(&ds4_model::builder::GraphOptions { residuals: true, ..ds4_model::builder::GraphOptions::full(&model.hp) }).unwrap();
    for p in prompts(&r) {
        if !r.contains_key(&format!("{p}.layer0.residual_hc")) {
            continue;
        }
        let tokens = r[&format!("{p}.tokens")].as_ids();
        let mut s: ds4_runtime::Session<f32> = ds4_runtime::Session::with_graph(&model, std::borrow::Cow::Borrowed(&graph), Default::default());
        let outs = s.feed_outputs(&tokens).unwrap();
        for l in 0..model.hp.n_layer {
            let ours: Vec<f64> = outs[&format!("residual.{l}")].iter().map(|&v| v as f64).collect();
            let want = &r[&format!("{p}.layer{l}.residual_hc")].data;
            let e = rel_err(&ours, want);
            let selfd = reference_self_disagreement(name, &p);
            if selfd > 1e-4 {
                println!("{name} {p} layer {l}: residual rel err {e:.3e} (NOT ASSERTED: the reference disagrees with itself by {selfd:.1e} on this prompt)");
                continue;
            }
            println!("{name} {p} layer {l}: residual rel err {e:.3e}");
            assert!(e <= 1e-4, "{name} {p} layer {l}: residual relative error {e} > 1e-4");
            checked += 1;
        }
    }
    assert!(checked >= model.hp.n_layer, "{name}: residuals of at least one whole prompt must be checked");
}

#[test]
fn tiny_f32_plain_matches_reference_plain() {
    plain_parity("tiny-f32");
}

#[test]
fn tiny_f32_ds4_graph_matches_reference() {
    full_parity("tiny-f32");
}

#[test]
fn tiny_f32_layer_residuals_match_reference() {
    residual_parity("tiny-f32");
}

#[test]
fn tiny_q2_plain_matches_reference_plain() {
    plain_parity("tiny-q2");
}

#[test]
fn tiny_q2_ds4_graph_matches_reference() {
    full_parity("tiny-q2");
}

#[test]
fn tiny_q4_plain_matches_reference_plain() {
    plain_parity("tiny-q4");
}

#[test]
fn tiny_q4_ds4_graph_matches_reference() {
    full_parity("tiny-q4");
}

#[test]
fn tiny_q2_layer_residuals_match_reference() {
    residual_parity("tiny-q2");
}

#[test]
fn tiny_q4_layer_residuals_match_reference() {
    residual_parity("tiny-q4");
}
