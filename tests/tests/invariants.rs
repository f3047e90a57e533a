//! Invariants of the runtime on the tiny golden models: chunked prefill, decode after
//! prefill, and rewind all give the logits of one prefill over the whole sequence.

use ds4_golden::*;
use ds4_runtime::{Model, Session, SessionOptions};

fn model(name: &str) -> Model {
    Model::load(&model_path(name)).unwrap()
}

/// The longest golden prompt plus its greedy continuation: crosses the window and many
/// compressed rows.
fn sequence(name: &str) -> Vec<u32> {
    let r = load_reference(name, false).unwrap();
    let p = prompts(&r).into_iter().max_by_key(|p| r[&format!("{p}.tokens")].data.len()).unwrap();
    let mut ids = r[&format!("{p}.tokens")].as_ids();
    ids.extend(r[&format!("{p}.greedy_tokens")].as_ids());
    ids
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn check(name: &str, plain: bool) {
    let m = model(name);
    let ids = sequence(name);
    let opts = SessionOptions { plain, ..Default::default() };
    let whole = f64s(&Session::<f32>::new(&m, opts.clone()).feed(&ids).unwrap());
    let sd = std_dev(&whole);
    let bound = 1e-5 * sd;
    for chunk in [1, 3, 16, ids.len()] {
        let got = f64s(&Session::<f32>::new(&m, opts.clone()).prefill(&ids, chunk).unwrap());
        let d = max_abs_diff(&got, &whole);
        println!("{name} plain={plain} chunk {chunk}: max|Δ| {d:.3e} (bound {bound:.3e})");
        assert!(d <= bound, "{name}: prefill in chunks of {chunk} differs by {d} > {bound}");
    }
    // Decode after a prefill equals the prefill of the whole sequence.
    let split = ids.len() / 2;
    let mut s = Session::<f32>::new(&m, opts.clone());
    let mut got = f64s(&s.feed(&ids[..split]).unwrap());
    for &t in &ids[split..] {
        got.extend(f64s(&s.feed(&[t]).unwrap()));
    }
    let d = max_abs_diff(&got, &whole);
    assert!(d <= bound, "{name}: decode after prefill differs by {d} > {bound}");
    // Last-token logits (the generation path) are the last row of the full logits.
    let last = f64s(&Session::<f32>::new(&m, opts.clone()).prefill_last(&ids, 16).unwrap());
    let d = max_abs_diff(&last, &whole[whole.len() - m.hp.vocab..]);
    assert!(d <= bound, "{name}: last-token logits differ by {d} > {bound}");
    // rewind(n) then feeding the same tokens again gives the same logits.
    let vocab = m.hp.vocab;
    for n in [1, 5, 17, 40] {
        let mut s = Session::<f32>::new(&m, opts.clone());
        s.feed(&ids).unwrap();
        s.rewind(n).unwrap();
        assert_eq!(s.pos(), ids.len() - n);
        let again = f64s(&s.feed(&ids[ids.len() - n..]).unwrap());
        let d = max_abs_diff(&again, &whole[(ids.len() - n) * vocab..]);
        println!("{name} plain={plain} rewind {n}: max|Δ| {d:.3e}");
        assert!(d <= bound, "{name}: rewind({n}) and refeed differs by {d} > {bound}");
    }
}

#[test]
fn tiny_f32_chunking_decode_and_rewind_agree() {
    check("tiny-f32", true);
    check("tiny-f32", false);
}

#[test]
fn rewind_refuses_beyond_what_was_fed_or_kept() {
    let m = model("tiny-f32");
    let mut s = Session::<f32>::new(&m, SessionOptions { plain: true, max_rewind: 4, ..Default::default() });
    s.feed(&[0, 1, 2, 3, 4, 5]).unwrap();
    assert!(s.rewind(7).unwrap_err().to_string().contains("only 6 fed"));
    assert!(s.rewind(5).unwrap_err().to_string().contains("keeps state for 4"));
    s.rewind(4).unwrap();
    assert_eq!(s.pos(), 2);
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let m = model("tiny-f32");
    let mut s = Session::<f32>::new(&m, SessionOptions::default());
    let e = s.feed(&[0, m.hp.vocab as u32]).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    // Nothing was consumed: the session still works.
    assert_eq!(s.pos(), 0);
    s.feed(&[0, 1]).unwrap();
}

/// A prompt longer than everything a session keeps (window + max_rewind), in one batch
/// and in chunks, then decode: the same logits either way.
#[test]
fn long_single_batch_then_decode() {
    let m = model("tiny-f32");
    let ids: Vec<u32> = (0..700u32).map(|i| (i * 7919 + 1) % m.hp.vocab as u32).collect();
    let mut whole = Session::<f32>::new(&m, SessionOptions::default());
    let mut chunked = Session::<f32>::new(&m, SessionOptions::default());
    // The invariants' bound: 1e-5 × std of the logits.
    let a = f64s(&whole.prefill_last(&ids, ids.len()).unwrap());
    let b = f64s(&chunked.prefill_last(&ids, 64).unwrap());
    let bound = 1e-5 * std_dev(&a);
    let d = max_abs_diff(&a, &b);
    println!("700 tokens, one batch vs chunks of 64: max|Δ| {d:.3e} (bound {bound:.3e})");
    assert!(d <= bound, "last-token logits differ by {d} > {bound}");
    let (x, y) = (f64s(&whole.feed(&[5]).unwrap()), f64s(&chunked.feed(&[5]).unwrap()));
    let d = max_abs_diff(&x, &y);
    assert!(d <= bound, "decode after prefill differs by {d} > {bound}");
}
