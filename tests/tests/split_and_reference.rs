//! A graph over a layer range is a pipeline stage: running [0, s) then [s, n) with the
//! residual handed over gives the logits of the whole graph. And the f32 CPU executor
//! agrees with the float64 reference instantiation of the same kernels.

use ds4_golden::*;
use ds4_model::builder::GraphOptions;
use ds4_runtime::{Model, Session, SessionOptions};
use std::borrow::Cow;

#[test]
fn split_at_every_layer_matches_the_whole_graph() {
    let m = Model::load(&model_path("tiny-f32")).unwrap();
    let r = load_reference("tiny-f32", false).unwrap();
    let ids = r["p2.tokens"].as_ids();
    let whole: Vec<f64> = Session::<f32>::new(&m, SessionOptions::default()).feed(&ids).unwrap().iter().map(|&v| v as f64).collect();
    let n = m.hp.n_layer;
    for s in 1..n {
        let g1 = m.build(&GraphOptions { layers: 0..s, ..GraphOptions::full(&m.hp) }).unwrap();
        let g2 = m.build(&GraphOptions { layers: s..n, ..GraphOptions::full(&m.hp) }).unwrap();
        let mut a = Session::<f32>::with_graph(&m, Cow::Owned(g1), SessionOptions::default());
        let mut b = Session::<f32>::with_graph(&m, Cow::Owned(g2), SessionOptions::default());
        // Two chunks, so both stages carry state across calls.
        let mut got = Vec::new();
        for c in [&ids[..70], &ids[70..]] {
            let res = a.feed_outputs(c).unwrap().remove("residual").unwrap();
            got.extend(b.feed_with_residual(c, Some(&res)).unwrap().remove("logits").unwrap().iter().map(|&v| v as f64));
        }
        let d = max_abs_diff(&got, &whole);
        assert!(d <= 1e-5 * std_dev(&whole), "split at {s}: max |Δ| {d}");
    }
}

#[test]
fn cpu_f32_matches_the_float64_reference() {
    let m = Model::load(&model_path("tiny-f32")).unwrap();
    let r = load_reference("tiny-f32", true).unwrap();
    let ids = r["p1.tokens"].as_ids();
    let opts = SessionOptions { plain: true, ..Default::default() };
    let f32s: Vec<f64> = Session::<f32>::new(&m, opts.clone()).feed(&ids).unwrap().iter().map(|&v| v as f64).collect();
    let f64s = Session::<f64>::new(&m, opts).feed(&ids).unwrap();
    let e = rel_err(&f32s, &f64s);
    println!("tiny-f32 p1: CPU f32 vs float64 reference: relative error {e:.2e}");
    assert!(e <= 1e-5, "f32 vs f64 relative error {e}");
}
