//! The kernel IR that `#[kernel]` extracts computes exactly what the Rust body computes.
//!
//! For every kernel in `kernels::all()`, on random inputs of many sizes, the body runs
//! with F = f64 and the IR runs in `kir_eval` with F = f64; the outputs must be equal to
//! the bit. This is what lets the GPU renderers trust the IR: any construct the macro
//! lowered wrongly shows up here as a differing bit.

use ds4_ir::kernels::{self, attention, compress, hc, moe, norm, rope, roundtrip};
use ds4_ir::kir::Kernel;
use ds4_ir::kir_eval::{self, Arg, Out};
use ds4_ir::rng::Rng;
use std::collections::BTreeSet;

/// An owned argument.
enum A {
    F(Vec<f64>),
    I(Vec<i32>),
    U(usize),
    S(f64),
    B(bool),
}

impl A {
    fn arg(&self) -> Arg<'_, f64> {
        match self {
            A::F(v) => Arg::Buf(v),
            A::I(v) => Arg::IntBuf(v),
            A::U(v) => Arg::Usize(*v),
            A::S(v) => Arg::F(*v),
            A::B(v) => Arg::Bool(*v),
        }
    }
}

fn f(a: &A) -> &[f64] {
    match a {
        A::F(v) => v,
        _ => panic!("not a float buffer"),
    }
}
fn i(a: &A) -> &[i32] {
    match a {
        A::I(v) => v,
        _ => panic!("not an i32 buffer"),
    }
}
fn u(a: &A) -> usize {
    match a {
        A::U(v) => *v,
        _ => panic!("not a usize"),
    }
}
fn s(a: &A) -> f64 {
    match a {
        A::S(v) => *v,
        _ => panic!("not a float"),
    }
}
fn b(a: &A) -> bool {
    match a {
        A::B(v) => *v,
        _ => panic!("not a bool"),
    }
}

/// The Rust body, called for one item on that item's output slice.
enum Body {
    F(fn(usize, &mut [f64], &[A])),
    I(fn(usize, &mut [i32], &[A])),
}

struct Case {
    kernel: Kernel,
    items: usize,
    args: Vec<A>,
    body: Body,
}

fn case(kernel: Kernel, items: usize, args: Vec<A>, body: Body) -> Case {
    Case { kernel, items, args, body }
}

/// One case of every kernel, with sizes and values drawn from `r`.
fn cases(r: &mut Rng) -> Vec<Case> {
    let mut out = Vec::new();
    let t = r.range(1, 5);

    // norm
    let n = r.range(1, 40);
    let eps = 1e-6;
    out.push(case(
        norm::rms_norm_kir(),
        t,
        vec![A::F(r.floats(t * n, -3.0, 3.0)), A::F(r.floats(n, -2.0, 2.0)), A::U(n), A::S(eps)],
        Body::F(|it, o, a| norm::rms_norm(it, o, f(&a[0]), f(&a[1]), u(&a[2]), s(&a[3]))),
    ));
    out.push(case(
        norm::rms_norm_plain_kir(),
        t,
        vec![A::F(r.floats(t * n, -3.0, 3.0)), A::U(n), A::S(eps)],
        Body::F(|it, o, a| norm::rms_norm_plain(it, o, f(&a[0]), u(&a[1]), s(&a[2]))),
    ));
    out.push(case(
        norm::add_kir(),
        t,
        vec![A::F(r.floats(t * n, -3.0, 3.0)), A::F(r.floats(t * n, -3.0, 3.0)), A::U(n)],
        Body::F(|it, o, a| norm::add(it, o, f(&a[0]), f(&a[1]), u(&a[2]))),
    ));

    // rope
    let heads = r.range(1, 4);
    let n_rot = 2 * r.range(0, 5);
    let hd = n_rot + r.range(0, 6);
    let sign = if r.coin(0.5) { 1.0 } else { -1.0 };
    out.push(case(
        rope::rope_kir(),
        t * heads,
        vec![
            A::F(r.floats(t * heads * hd, -3.0, 3.0)),
            A::F(r.floats(n_rot / 2, 0.0, 1.0)),
            A::U(heads),
            A::U(hd),
            A::U(n_rot),
            A::U(r.range(0, 100)),
            A::U(r.range(1, 5)),
            A::S(sign),
        ],
        Body::F(|it, o, a| {
            rope::rope(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]), u(&a[4]), u(&a[5]), u(&a[6]), s(&a[7]))
        }),
    ));

    // attention: a window holding positions win_pos0 .. pos0 + t, compressed rows, picks.
    let hd = r.range(1, 9);
    let pos0 = r.range(0, 20);
    let win_pos0 = r.range(0, pos0 + 1);
    let n_win = pos0 + t - win_pos0;
    let n_comp = r.range(0, 7);
    let k_sel = r.range(1, 5);

    // The two-step attention of the GPU: chunks of the row list, then the merge.
    let nc = r.range(1, 5);
    let sel: Vec<i32> = (0..t * k_sel).map(|_| r.range(0, n_comp + 1) as i32 - 1).collect();
    out.push(case(
        attention::attention_partial_kir(),
        t * heads * nc,
        vec![
            A::F(r.floats(t * heads * hd, -1.0, 1.0)),
            A::F(r.floats(n_win * hd, -1.0, 1.0)),
            A::F(r.floats(n_comp * hd, -1.0, 1.0)),
            A::I(sel),
            A::F(r.floats(heads, -1.0, 1.0)),
            A::U(heads),
            A::U(hd),
            A::U(pos0),
            A::U(win_pos0),
            A::U(n_win),
            A::U(r.range(1, 10)),
            A::U(n_comp),
            A::U(r.range(0, 3)),
            A::U(r.range(1, 5)),
            A::U(k_sel),
            A::S(r.uniform(0.1, 1.0)),
            A::U(nc),
        ],
        Body::F(|it, o, a| {
            attention::attention_partial(
                it,
                o,
                f(&a[0]),
                f(&a[1]),
                f(&a[2]),
                i(&a[3]),
                f(&a[4]),
                u(&a[5]),
                u(&a[6]),
                u(&a[7]),
                u(&a[8]),
                u(&a[9]),
                u(&a[10]),
                u(&a[11]),
                u(&a[12]),
                u(&a[13]),
                u(&a[14]),
                s(&a[15]),
                u(&a[16]),
            )
        }),
    ));
    let part: Vec<f64> = (0..t * heads * nc * (hd + 2))
        .map(|i| if i % (hd + 2) == hd && !(i / (hd + 2)).is_multiple_of(nc) && r.coin(0.2) { f64::NEG_INFINITY } else { r.uniform(0.0, 2.0) })
        .collect();
    out.push(case(
        attention::attention_merge_kir(),
        t * heads,
        vec![A::F(part), A::U(hd), A::U(nc)],
        Body::F(|it, o, a| attention::attention_merge(it, o, f(&a[0]), u(&a[1]), u(&a[2]))),
    ));

    // compress: some gate slots absent (-inf), ties in the top-k scores.
    let slots = r.range(1, 5);
    let w = r.range(1, 8);
    let gate: Vec<f64> =
        (0..t * slots * w).map(|_| if r.coin(0.2) { f64::NEG_INFINITY } else { r.uniform(-3.0, 3.0) }).collect();
    out.push(case(
        compress::compress_pool_kir(),
        t,
        vec![A::F(r.floats(t * slots * w, -2.0, 2.0)), A::F(gate), A::U(slots), A::U(w)],
        Body::F(|it, o, a| compress::compress_pool(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]))),
    ));
    // compress_gather: HCA or CSA logs of tokens `first ..`, rows from row 0 or later.
    let (ratio, n_new, wd) = (r.range(1, 5), r.range(1, 4), r.range(1, 6));
    let overlap = r.coin(0.5);
    let slots = if overlap { 2 * ratio } else { ratio };
    let first_row = if r.coin(0.3) { 0 } else { r.range(1, 6) };
    let lowest = if overlap { first_row.saturating_sub(1) * ratio } else { first_row * ratio };
    let first = lowest - r.range(0, 3).min(lowest);
    let cw = slots / ratio * wd;
    let tokens = (first_row + n_new) * ratio - first;
    out.push(case(
        compress::compress_gather_kir(),
        2 * n_new,
        vec![
            A::F(r.floats(tokens * cw, -2.0, 2.0)),
            A::F(r.floats(tokens * cw, -2.0, 2.0)),
            A::F(r.floats(ratio * cw, -1.0, 1.0)),
            A::U(n_new),
            A::U(first_row),
            A::U(first),
            A::U(ratio),
            A::U(slots),
            A::U(wd),
        ],
        Body::F(|it, o, a| compress::compress_gather(it, o, f(&a[0]), f(&a[1]), f(&a[2]), u(&a[3]), u(&a[4]), u(&a[5]), u(&a[6]), u(&a[7]), u(&a[8]))),
    ));
    let (iheads, dk, n_rows) = (r.range(1, 4), r.range(1, 8), r.range(0, 8));
    let (pos0, ratio) = (r.range(0, 20), r.range(1, 5));
    out.push(case(
        compress::indexer_head_dots_kir(),
        t * iheads,
        vec![A::F(r.floats(t * iheads * dk, -1.0, 1.0)), A::F(r.floats(n_rows * dk, -1.0, 1.0)), A::U(n_rows), A::U(iheads), A::U(dk), A::U(pos0), A::U(ratio)],
        Body::F(|it, o, a| compress::indexer_head_dots(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]), u(&a[4]), u(&a[5]), u(&a[6]))),
    ));
    out.push(case(
        compress::indexer_combine_kir(),
        t,
        vec![A::F(r.floats(t * iheads * n_rows, 0.0, 1.0)), A::F(r.floats(t * iheads, -1.0, 1.0)), A::U(n_rows), A::U(iheads), A::U(dk), A::U(pos0), A::U(ratio)],
        Body::F(|it, o, a| compress::indexer_combine(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]), u(&a[4]), u(&a[5]), u(&a[6]))),
    ));
    let (mk, md) = (r.range(1, 4), r.range(1, 10));
    out.push(case(
        moe::moe_combine_kir(),
        t,
        vec![A::F(r.floats(t * mk * md, -2.0, 2.0)), A::F(r.floats(t * mk, 0.0, 1.0)), A::U(mk), A::U(md)],
        Body::F(|it, o, a| moe::moe_combine(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]))),
    ));
    let n = r.range(1, 12);
    let palette = [f64::NEG_INFINITY, -1.0, 0.0, 0.5, 1.0, 2.0];
    let scores: Vec<f64> = (0..t * n).map(|_| palette[r.range(0, palette.len())]).collect();
    out.push(case(
        compress::top_k_kir(),
        t,
        vec![A::F(scores), A::U(n), A::U(r.range(1, n + 3))],
        Body::I(|it, o, a| compress::top_k(it, o, f(&a[0]), u(&a[1]), u(&a[2]))),
    ));

    // hc
    let nh = r.range(1, 5);
    let d = r.range(1, 9);
    let mw = 2 * nh + nh * nh;
    out.push(case(
        hc::hc_mix_kir(),
        t,
        vec![
            A::F(r.floats(t * mw, -2.0, 2.0)),
            A::F(r.floats(3, 0.5, 2.0)),
            A::F(r.floats(mw, -1.0, 1.0)),
            A::U(nh),
            A::U(r.range(1, 5)),
            A::S(1e-6),
        ],
        Body::F(|it, o, a| hc::hc_mix(it, o, f(&a[0]), f(&a[1]), f(&a[2]), u(&a[3]), u(&a[4]), s(&a[5]))),
    ));
    out.push(case(
        hc::hc_head_mix_kir(),
        t,
        vec![
            A::F(r.floats(t * nh, -2.0, 2.0)),
            A::F(r.floats(1, 0.5, 2.0)),
            A::F(r.floats(nh, -1.0, 1.0)),
            A::U(nh),
            A::S(1e-6),
        ],
        Body::F(|it, o, a| hc::hc_head_mix(it, o, f(&a[0]), f(&a[1]), f(&a[2]), u(&a[3]), s(&a[4]))),
    ));
    out.push(case(
        hc::hc_collapse_kir(),
        t,
        vec![A::F(r.floats(t * nh * d, -2.0, 2.0)), A::F(r.floats(t * mw, 0.0, 1.0)), A::U(nh), A::U(d), A::U(mw)],
        Body::F(|it, o, a| hc::hc_collapse(it, o, f(&a[0]), f(&a[1]), u(&a[2]), u(&a[3]), u(&a[4]))),
    ));
    out.push(case(
        hc::hc_expand_kir(),
        t,
        vec![
            A::F(r.floats(t * d, -2.0, 2.0)),
            A::F(r.floats(t * nh * d, -2.0, 2.0)),
            A::F(r.floats(t * mw, 0.0, 1.0)),
            A::U(nh),
            A::U(d),
        ],
        Body::F(|it, o, a| hc::hc_expand(it, o, f(&a[0]), f(&a[1]), f(&a[2]), u(&a[3]), u(&a[4]))),
    ));
    out.push(case(
        hc::hc_broadcast_kir(),
        t,
        vec![A::F(r.floats(t * d, -2.0, 2.0)), A::U(nh), A::U(d)],
        Body::F(|it, o, a| hc::hc_broadcast(it, o, f(&a[0]), u(&a[1]), u(&a[2]))),
    ));

    // moe: logits on both sides of softplus's linear cut-off at 20.
    let n = r.range(1, 16);
    let k = r.range(1, n + 1);
    out.push(case(
        moe::router_scores_kir(),
        t,
        vec![A::F(r.floats(t * n, -30.0, 30.0)), A::U(n)],
        Body::F(|it, o, a| moe::router_scores(it, o, f(&a[0]), u(&a[1]))),
    ));
    out.push(case(
        moe::router_biased_kir(),
        t,
        vec![A::F(r.floats(t * n, 0.0, 3.0)), A::F(r.floats(n, -1.0, 1.0)), A::U(n)],
        Body::F(|it, o, a| moe::router_biased(it, o, f(&a[0]), f(&a[1]), u(&a[2]))),
    ));
    let vocab = r.range(1, 20);
    let ids: Vec<i32> = (0..t).map(|_| r.range(0, vocab) as i32).collect();
    let table: Vec<i32> = (0..vocab * k).map(|_| r.range(0, 256) as i32).collect();
    out.push(case(
        moe::router_hash_kir(),
        t,
        vec![A::I(ids), A::I(table), A::U(k)],
        Body::I(|it, o, a| moe::router_hash(it, o, i(&a[0]), i(&a[1]), u(&a[2]))),
    ));
    let sel: Vec<i32> = (0..t * k).map(|_| r.range(0, n) as i32).collect();
    out.push(case(
        moe::router_weights_kir(),
        t,
        vec![
            A::F(r.floats(t * n, 0.0, 3.0)),
            A::I(sel),
            A::U(n),
            A::U(k),
            A::S(r.uniform(0.5, 3.0)),
            A::B(r.coin(0.5)),
        ],
        Body::F(|it, o, a| moe::router_weights(it, o, f(&a[0]), i(&a[1]), u(&a[2]), u(&a[3]), s(&a[4]), b(&a[5]))),
    ));
    out.push(case(
        moe::swiglu_kir(),
        t,
        vec![A::F(r.floats(t * n, -20.0, 20.0)), A::F(r.floats(t * n, -20.0, 20.0)), A::U(n), A::S(7.0)],
        Body::F(|it, o, a| moe::swiglu(it, o, f(&a[0]), f(&a[1]), u(&a[2]), s(&a[3]))),
    ));

    // roundtrip: magnitudes from tiny (subnormal E4M3 range) to large.
    let nb = r.range(0, 3);
    let w = 64 * nb + r.range(0, 70);
    let mag = 10f64.powf(r.uniform(-4.0, 4.0));
    out.push(case(
        roundtrip::fp8_roundtrip_kir(),
        t,
        vec![A::F(r.floats(t * w, -mag, mag)), A::U(w), A::U(64 * r.range(0, nb + 1))],
        Body::F(|it, o, a| roundtrip::fp8_roundtrip(it, o, f(&a[0]), u(&a[1]), u(&a[2]))),
    ));
    out.push(case(
        roundtrip::hadamard_fp4_kir(),
        t,
        vec![A::F(r.floats(t * 128, -mag, mag)), A::B(r.coin(0.7))],
        Body::F(|it, o, a| roundtrip::hadamard_fp4(it, o, f(&a[0]), b(&a[1]))),
    ));
    out
}

fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Runs the body and the IR on one case; panics on the first differing element.
fn check(c: &Case, seed: u64) {
    let args: Vec<Arg<f64>> = c.args.iter().map(A::arg).collect();
    let len = kir_eval::out_len(&c.kernel, &args);
    let name = &c.kernel.name;
    match c.body {
        Body::F(body) => {
            // Same garbage in both, in case a body reads before it writes.
            let mut want = vec![7.25; c.items * len];
            let mut got = want.clone();
            for it in 0..c.items {
                body(it, &mut want[it * len..(it + 1) * len], &c.args);
            }
            kir_eval::eval(&c.kernel, c.items, Out::F(&mut got), &args);
            for (j, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(same(*w, *g), "{name} (seed {seed}): element {j}: body {w:e}, IR {g:e}");
            }
        }
        Body::I(body) => {
            let mut want = vec![-7; c.items * len];
            let mut got = want.clone();
            for it in 0..c.items {
                body(it, &mut want[it * len..(it + 1) * len], &c.args);
            }
            kir_eval::eval(&c.kernel, c.items, Out::I32(&mut got), &args);
            assert_eq!(want, got, "{name} (seed {seed})");
        }
    }
}

#[test]
fn every_kernel_ir_matches_its_rust_body() {
    for seed in 1..=200u64 {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        for c in cases(&mut r) {
            check(&c, seed);
        }
    }
}

#[test]
fn the_cases_cover_every_kernel() {
    let listed: BTreeSet<String> = kernels::all().into_iter().map(|k| k.name).collect();
    let tested: BTreeSet<String> = cases(&mut Rng(1)).into_iter().map(|c| c.kernel.name).collect();
    assert_eq!(listed, tested);
}

#[test]
fn kernel_ir_is_built_the_same_every_time() {
    assert_eq!(kernels::all(), kernels::all());
}
