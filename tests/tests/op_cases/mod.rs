//! The op kernels' random cases and their f64 reference, shared by the targets' parity
//! tests (`cuda_kernels.rs` on a CUDA device, `wgsl_kernels.rs` on a Vulkan device, a
//! software one in CI): each op kernel of the IR on fresh random inputs, its output held
//! to the kernel IR run in f64 (`kir_eval`, proven equal to the Rust bodies by
//! ir/tests/kir_matches_rust.rs).
#![allow(dead_code)]

use ds4_ir::kir::{Elem, Kernel};
use ds4_ir::kir_eval::{self, Arg as KArg, Out};
use ds4_ir::rng::Rng;

/// A line that shows even under the test harness's output capture (which only takes
/// `print!`/`eprint!`), so a CI log says which device tests were skipped.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `n` floats drawn uniformly from lo..hi (`Rng::f32_floats`, as f32).
pub fn f32s(r: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    r.f32_floats(n, lo, hi).iter().map(|&v| v as f32).collect()
}

pub fn seed() -> u64 {
    std::env::var("DS4_CUDA_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    })
}

/// An owned argument, in kernel param order after the output.
#[derive(Clone)]
pub enum A {
    F(Vec<f64>),
    I(Vec<i32>),
    U(usize),
    S(f64),
    B(bool),
}

/// Items and arguments for one random case of kernel `name`.
pub fn case(name: &str, r: &mut Rng) -> (usize, Vec<A>) {
    use A::*;
    let t = r.range(1, 6);
    let n = r.range(1, 64);
    match name {
        "rms_norm" => (t, vec![F(r.f32_floats(t * n, -3.0, 3.0)), F(r.f32_floats(n, -2.0, 2.0)), U(n), S(1e-6)]),
        "rms_norm_plain" => (t, vec![F(r.f32_floats(t * n, -3.0, 3.0)), U(n), S(1e-6)]),
        "add" => (t, vec![F(r.f32_floats(t * n, -3.0, 3.0)), F(r.f32_floats(t * n, -3.0, 3.0)), U(n)]),
        "rope" => {
            let (heads, n_rot) = (r.range(1, 4), 2 * r.range(0, 9));
            let hd = n_rot + r.range(0, 8);
            let sign = if r.next().is_multiple_of(2) { 1.0 } else { -1.0 };
            (t * heads, vec![F(r.f32_floats(t * heads * hd, -3.0, 3.0)), F(r.f32_floats(n_rot / 2, 0.0, 1.0)), U(heads), U(hd), U(n_rot), U(r.range(0, 100)), U(r.range(1, 5)), S(sign)])
        }
        "attention_partial" => {
            let (heads, hd, nc) = (r.range(1, 4), r.range(1, 17), r.range(1, 6));
            let shape = AttnShape::random(r, t, heads, hd, 10, nc);
            attention_args(r, &shape)
        }
        "attention_merge" => {
            let (heads, hd, nc) = (r.range(1, 4), r.range(1, 17), r.range(1, 6));
            // Chunk 0 always saw the sink (finite max); later chunks may have seen nothing.
            let part: Vec<f64> = (0..t * heads * nc * (hd + 2)).map(|i| if i % (hd + 2) == hd && (i / (hd + 2)) % nc != 0 && i % 3 == 0 { f64::NEG_INFINITY } else { r.uniform(0.0, 2.0) as f32 as f64 }).collect();
            (t * heads, vec![F(part), U(hd), U(nc)])
        }
        "compress_pool" => {
            let (slots, w) = (r.range(1, 9), r.range(1, 16));
            let gate: Vec<f64> = (0..t * slots * w).map(|i| if i % 7 == 3 { f64::NEG_INFINITY } else { r.uniform(-2.0, 2.0) as f32 as f64 }).collect();
            // Keep at least one live slot per channel: slot 0 always finite.
            let gate: Vec<f64> = gate.iter().enumerate().map(|(i, &g)| if (i / w) % slots == 0 && g.is_infinite() { 0.5 } else { g }).collect();
            (t, vec![F(r.f32_floats(t * slots * w, -2.0, 2.0)), F(gate), U(slots), U(w)])
        }
        "compress_gather" => {
            // HCA or CSA logs of tokens `first ..`; new rows from row 0 or later.
            let (ratio, n_rows, w) = (r.range(1, 6), r.range(1, 5), r.range(1, 16));
            let overlap = r.next().is_multiple_of(2);
            let slots = if overlap { 2 * ratio } else { ratio };
            let first_row = if r.next().is_multiple_of(3) { 0 } else { r.range(1, 9) };
            let lowest = if overlap { first_row.saturating_sub(1) * ratio } else { first_row * ratio };
            let first = lowest - r.range(0, 4).min(lowest);
            let cw = slots / ratio * w;
            let tokens = (first_row + n_rows) * ratio - first;
            let args = vec![F(r.f32_floats(tokens * cw, -2.0, 2.0)), F(r.f32_floats(tokens * cw, -2.0, 2.0)), F(r.f32_floats(ratio * cw, -1.0, 1.0)), U(n_rows), U(first_row), U(first), U(ratio), U(slots), U(w)];
            (2 * n_rows, args)
        }
        "indexer_head_dots" => {
            let (heads, dk, rows) = (r.range(1, 4), r.range(1, 16), r.range(0, 10));
            (t * heads, vec![F(r.f32_floats(t * heads * dk, -1.0, 1.0)), F(r.f32_floats(rows.max(1) * dk, -1.0, 1.0)), U(rows), U(heads), U(dk), U(r.range(0, 20)), U(r.range(1, 5))])
        }
        "indexer_combine" => {
            let (heads, dk, rows) = (r.range(1, 4), r.range(1, 16), r.range(0, 10));
            (t, vec![F(r.f32_floats(t * heads * rows.max(1), 0.0, 1.0)), F(r.f32_floats(t * heads, -1.0, 1.0)), U(rows), U(heads), U(dk), U(r.range(0, 20)), U(r.range(1, 5))])
        }
        "moe_combine" => {
            let (k, d) = (r.range(1, 7), r.range(1, 24));
            (t, vec![F(r.f32_floats(t * k * d, -2.0, 2.0)), F(r.f32_floats(t * k, 0.0, 1.0)), U(k), U(d)])
        }
        "top_k" => {
            let n = r.range(1, 20);
            let scores: Vec<f64> = (0..t * n).map(|i| if i % 5 == 4 { f64::NEG_INFINITY } else { r.uniform(-2.0, 2.0) as f32 as f64 }).collect();
            (t, vec![F(scores), U(n), U(r.range(1, n + 3))])
        }
        "hc_mix" | "hc_head_mix" | "hc_collapse" | "hc_expand" | "hc_broadcast" => {
            let (nh, d) = (r.range(1, 5), r.range(1, 24));
            let mw = 2 * nh + nh * nh;
            let args = match name {
                "hc_mix" => vec![F(r.f32_floats(t * mw, -2.0, 2.0)), F(r.f32_floats(3, 0.5, 2.0)), F(r.f32_floats(mw, -1.0, 1.0)), U(nh), U(r.range(1, 5)), S(1e-6)],
                "hc_head_mix" => vec![F(r.f32_floats(t * nh, -2.0, 2.0)), F(r.f32_floats(1, 0.5, 2.0)), F(r.f32_floats(nh, -1.0, 1.0)), U(nh), S(1e-6)],
                "hc_collapse" => vec![F(r.f32_floats(t * nh * d, -2.0, 2.0)), F(r.f32_floats(t * mw, 0.0, 1.0)), U(nh), U(d), U(mw)],
                "hc_expand" => vec![F(r.f32_floats(t * d, -2.0, 2.0)), F(r.f32_floats(t * nh * d, -2.0, 2.0)), F(r.f32_floats(t * mw, 0.0, 1.0)), U(nh), U(d)],
                _ => vec![F(r.f32_floats(t * d, -2.0, 2.0)), U(nh), U(d)],
            };
            (t, args)
        }
        "router_scores" => (t, vec![F(r.f32_floats(t * n, -30.0, 30.0)), U(n)]),
        "router_biased" => (t, vec![F(r.f32_floats(t * n, 0.0, 3.0)), F(r.f32_floats(n, -1.0, 1.0)), U(n)]),
        "router_hash" => {
            let (vocab, k) = (r.range(1, 40), r.range(1, 8));
            let ids = (0..t).map(|_| r.range(0, vocab) as i32).collect();
            let table = (0..vocab * k).map(|_| r.range(0, 256) as i32).collect();
            (t, vec![I(ids), I(table), U(k)])
        }
        "router_weights" => {
            let k = r.range(1, n + 1);
            let sel = (0..t * k).map(|_| r.range(0, n) as i32).collect();
            (t, vec![F(r.f32_floats(t * n, 0.0, 3.0)), I(sel), U(n), U(k), S(r.uniform(0.5, 3.0) as f32 as f64), B(r.next().is_multiple_of(2))])
        }
        "swiglu" => (t, vec![F(r.f32_floats(t * n, -20.0, 20.0)), F(r.f32_floats(t * n, -20.0, 20.0)), U(n), S(7.0)]),
        "fp8_roundtrip" => {
            let nb = r.range(0, 4);
            let w = 64 * nb + r.range(0, 70);
            let mag = 10f64.powf(r.uniform(-4.0, 4.0));
            (t, vec![F(r.f32_floats(t * w.max(1), -mag, mag)), U(w), U(64 * r.range(0, nb + 1))])
        }
        "hadamard_fp4" => {
            let mag = 10f64.powf(r.uniform(-4.0, 4.0));
            (t, vec![F(r.f32_floats(t * 128, -mag, mag)), B(r.next() % 10 < 7)])
        }
        other => panic!("no random case for kernel {other}: add one"),
    }
}

/// The shape of an `attention_partial` case (the kernel's scalar parameters).
pub struct AttnShape {
    pub t: usize,
    pub heads: usize,
    pub hd: usize,
    pub pos0: usize,
    pub win_pos0: usize,
    pub window: usize,
    pub n_comp: usize,
    pub comp_mode: usize,
    pub ratio: usize,
    pub k_sel: usize,
    pub nc: usize,
}

impl AttnShape {
    /// A random shape whose row lists grow with `rows`: positions below 2·rows, windows
    /// below rows, up to 2/3·rows compressed rows and rows/2 picks, any comp mode.
    pub fn random(r: &mut Rng, t: usize, heads: usize, hd: usize, rows: usize, nc: usize) -> AttnShape {
        let pos0 = r.range(0, 2 * rows);
        AttnShape {
            t,
            heads,
            hd,
            pos0,
            win_pos0: r.range(0, pos0 + 1),
            window: r.range(1, rows),
            n_comp: r.range(0, rows * 2 / 3 + 1),
            comp_mode: r.range(0, 3),
            ratio: r.range(1, 5),
            k_sel: r.range(1, rows / 2),
            nc,
        }
    }
}

/// Random inputs of shape `s`: queries, window rows (positions `win_pos0 .. pos0 + t`),
/// compressed rows, picks (a quarter of them -1, unused) and sinks. Returns (items, args).
pub fn attention_args(r: &mut Rng, s: &AttnShape) -> (usize, Vec<A>) {
    use A::*;
    let n_win = s.pos0 + s.t - s.win_pos0;
    let sel: Vec<i32> = (0..s.t * s.k_sel).map(|_| if s.n_comp == 0 || r.next().is_multiple_of(4) { -1 } else { r.range(0, s.n_comp) as i32 }).collect();
    let args = vec![
        F(r.f32_floats(s.t * s.heads * s.hd, -1.0, 1.0)),
        F(r.f32_floats(n_win.max(1) * s.hd, -1.0, 1.0)),
        F(r.f32_floats(s.n_comp.max(1) * s.hd, -1.0, 1.0)),
        I(sel),
        F(r.f32_floats(s.heads, -1.0, 1.0)),
        U(s.heads),
        U(s.hd),
        U(s.pos0),
        U(s.win_pos0),
        U(n_win),
        U(s.window),
        U(s.n_comp),
        U(s.comp_mode),
        U(s.ratio),
        U(s.k_sel),
        // About 1/√hd, as the model's: logits of a few units, whatever hd.
        S((r.uniform(0.5, 2.0) / (s.hd as f64).sqrt()) as f32 as f64),
        U(s.nc),
    ];
    (s.t * s.heads * s.nc, args)
}

/// How far an f32 GPU value may be from the f64 one: |g - w| ≤ 1e-4 · max(|w|, floor),
/// with `floor` a fraction of the output's largest magnitude.
pub fn error_floor(kernel: &str) -> f64 {
    match kernel {
        // A rotation: its error follows the size of the rotated pair, not of each
        // component. The angle pos·inv_freq is rounded to f32 before sin/cos (as on the
        // CPU), ~1e-5 rad at positions of a few hundred.
        "rope" => 1.0,
        _ => 1e-3,
    }
}

/// For a kernel whose outputs are sums of terms of either sign, its arguments with the
/// signs taken off, so that the f64 reference of those gives Σ|term| per output: the scale
/// of the f32 sum's rounding, which a result that cancels to near zero does not show (the
/// same measure as the mat-vecs' |Δ| / Σ|w·x|). `indexer_combine`: Σ_h relu(dot) · scale ·
/// w_h, its head weights signed.
pub fn magnitude_args(kernel: &str, args: &[A]) -> Option<Vec<A>> {
    match kernel {
        "indexer_combine" => {
            let mut a = args.to_vec();
            if let A::F(w) = &a[1] {
                a[1] = A::F(w.iter().map(|v| v.abs()).collect());
            }
            Some(a)
        }
        _ => None,
    }
}

/// The arguments as the f64 evaluator takes them.
pub fn kargs_of(args: &[A]) -> Vec<KArg<'_, f64>> {
    args.iter()
        .map(|a| match a {
            A::F(v) => KArg::Buf(v),
            A::I(v) => KArg::IntBuf(v),
            A::U(v) => KArg::Usize(*v),
            A::S(v) => KArg::F(*v),
            A::B(v) => KArg::Bool(*v),
        })
        .collect()
}

/// `kir_eval` of every item of `out` (`len` values each), the items spread over the
/// host's cores: the full-size attention cases interpret ~10^8 operations.
pub fn eval_on_all_cores(k: &Kernel, len: usize, out: &mut [f64], kargs: &[KArg<'_, f64>]) {
    if len == 0 {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = (out.len() / len).div_ceil(cores).max(1);
    std::thread::scope(|s| {
        for (c, part) in out.chunks_mut(per * len).enumerate() {
            s.spawn(move || {
                for (i, o) in part.chunks_mut(len).enumerate() {
                    kir_eval::eval_item(k, c * per + i, Out::F(o), kargs);
                }
            });
        }
    });
}

/// A device's output of kernel `k` over `items` items on `args`, against the f64
/// reference: (compared values, mismatches, worst error). f32 outputs may be off by
/// 1e-4 · max(|reference|, `error_floor` · the output's largest magnitude, Σ|term| where
/// `magnitude_args` gives it), infinities and NaNs where the reference has them; i32
/// outputs exactly (the worst error is then the mismatch count).
pub fn compare(k: &Kernel, items: usize, args: &[A], got: Got) -> (usize, usize, f64) {
    let kargs = kargs_of(args);
    let len = kir_eval::out_len(k, &kargs);
    let n_out = items * len;
    match (k.out().1, got) {
        (Elem::F, Got::F(gpu)) => {
            assert_eq!(gpu.len(), n_out, "{}: output length", k.name);
            let mut want = vec![0f64; n_out];
            eval_on_all_cores(k, len, &mut want, &kargs);
            let scale = want.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            // Σ|term| per output where the kernel sums signed terms (else nothing).
            let mut magnitude = vec![0f64; n_out];
            if let Some(margs) = magnitude_args(&k.name, args) {
                eval_on_all_cores(k, len, &mut magnitude, &kargs_of(&margs));
            }
            let mut bad = 0;
            let mut worst = 0f64;
            for ((g, w), m) in gpu.iter().zip(&want).zip(&magnitude) {
                let g = *g as f64;
                if w.is_infinite() || g.is_infinite() {
                    bad += (g != *w) as usize;
                    continue;
                }
                let e = (g - w).abs() / (w.abs().max(error_floor(&k.name) * scale).max(if m.is_finite() { *m } else { 0.0 }));
                worst = worst.max(e);
                bad += (e > 1e-4 || g.is_nan() != w.is_nan()) as usize;
            }
            (n_out, bad, worst)
        }
        (Elem::I32, Got::I(gpu)) => {
            assert_eq!(gpu.len(), n_out, "{}: output length", k.name);
            let mut want = vec![0i32; n_out];
            kir_eval::eval::<f64>(k, items, Out::I32(&mut want), &kargs);
            let bad = gpu.iter().zip(&want).filter(|(a, b)| a != b).count();
            (n_out, bad, bad as f64)
        }
        _ => panic!("{}: the output read back is not of the kernel's element type", k.name),
    }
}

/// An output read back from a device.
pub enum Got<'a> {
    F(&'a [f32]),
    I(&'a [i32]),
}

/// The FP8/FP4 round trips are discontinuous: a value that lands within f32 rounding of a
/// code boundary may take the neighbouring code. The mismatches kernel `name` may have of
/// `total` values (1% for those, none for the others).
pub fn allowed_mismatches(name: &str, total: usize) -> usize {
    if name.contains("roundtrip") || name.contains("fp4") {
        total / 100
    } else {
        0
    }
}

/// Every op kernel of the IR on 20 random cases each, run by `run` (a device's launch and
/// `compare`: (compared values, mismatches, worst error)); prints a row a kernel and
/// returns the kernels with more mismatches than `allowed_mismatches`.
pub fn every_op_kernel(r: &mut Rng, mut run: impl FnMut(&Kernel, usize, &[A]) -> (usize, usize, f64)) -> Vec<String> {
    let mut failures = Vec::new();
    println!("{:<20} {:>6} {:>9} {:>10} {:>11}", "kernel", "cases", "values", "mismatch", "worst rel");
    for k in ds4_ir::kernels::all() {
        let (mut total, mut bad, mut worst) = (0, 0, 0f64);
        for _ in 0..20 {
            let (items, args) = case(&k.name, r);
            let (n, b, w) = run(&k, items, &args);
            total += n;
            bad += b;
            worst = worst.max(w);
        }
        let allowed = allowed_mismatches(&k.name, total);
        println!("{:<20} {:>6} {:>9} {:>10} {:>11.2e}{}", k.name, 20, total, bad, worst, if bad > allowed { "  FAIL" } else { "" });
        if bad > allowed {
            failures.push(k.name.clone());
        }
    }
    failures
}

/// Random rows quantized by the CPU code of a quant type's spec, for the quant kernels'
/// tests: their bytes and each row de-quantized again (once).
pub struct QuantRows {
    pub bytes: Vec<u8>,
    pub row_bytes: usize,
    pub rows: Vec<Vec<f32>>,
}

impl QuantRows {
    /// `n` rows of `k` values drawn from -2..2, as type `t`.
    pub fn random(t: ds4_ir::GgmlType, n: usize, k: usize, r: &mut Rng) -> QuantRows {
        let src = f32s(r, n * k, -2.0, 2.0);
        let row_bytes = t.bytes_for(k as u64).unwrap() as usize;
        let mut bytes = vec![0u8; n * row_bytes];
        for (row, out) in src.chunks(k).zip(bytes.chunks_mut(row_bytes)) {
            ds4_ir::quant::quantize_row(t, row, out).unwrap();
        }
        let rows = bytes
            .chunks(row_bytes)
            .map(|b| {
                let mut w = vec![0f32; k];
                ds4_ir::quant::dequantize_row(t, b, &mut w).unwrap();
                w
            })
            .collect();
        QuantRows { bytes, row_bytes, rows }
    }

    /// |got − row·x| / Σ|row·x|: a device's product of row `row` with x against the f64
    /// dot of the de-quantized row (the mat-vecs' error measure).
    pub fn error(&self, got: f32, row: usize, x: &[f32]) -> f64 {
        let w = &self.rows[row];
        let want: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let norm: f64 = w.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        (got as f64 - want).abs() / norm.max(1e-30)
    }
}
