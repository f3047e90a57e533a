//! Whole-model parity against the golden references (HuggingFace transformers
//! DeepseekV4, float32) for the tiny models. Bounds are the issue's; they are never loosened.

use ds4_golden::*;
use ds4_runtime::Model;

fn load(name: &str) -> Model {
    let p = model_path(name);
    Model::load(&p).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

/// Plain graph vs `reference_plain`, within `assert_plain_parity`'s bounds.
fn plain_parity(name: &str) {
    let model = load(name);
    let r = load_reference(name, true).unwrap();
    assert_plain_parity(name, &r, model.hp.vocab, |tokens, greedy| run_prompt(&model, tokens, greedy, true).unwrap());
}

/// Full DS4 graph (FP8 KV and indexer FP4 round trips) vs `reference`, within
/// `assert_full_parity`'s statistical bounds.
fn full_parity(name: &str) {
    let model = load(name);
    let r = load_reference(name, false).unwrap();
    assert_full_parity(name, &r, model.hp.vocab, |tokens, greedy| run_prompt(&model, tokens, greedy, false).unwrap());
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
