//! Every generated CUDA kernel against its float64 reference on fresh random inputs:
//! the op kernels (NVRTC-compiled from `ds4_codegen`) against the kernel IR run in f64
//! (`kir_eval`, proven equal to the Rust bodies by ir/tests/kir_matches_rust.rs), and the
//! quant kernels against the CPU code generated from the same `QuantSpec`.
//!
//! Without a CUDA device or driver every test prints "skipped: no CUDA device" and passes.
//! Set DS4_CUDA_SEED to vary the inputs (default: the time).

mod op_cases;

use ds4_ir::kir::{Elem, Kernel, ParamKind, Ty};
use ds4_ir::kir_eval;
use op_cases::*;
use ds4_runtime::cuda::{cuda_argmax, cuda_attention, cuda_copy, cuda_matvec_dense, cuda_attention_merge, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix, launch, quant_kernel_name as kernel_name, skip_reason, x_parts, Arg, Device, KernelSet, Kernels, Loaded, MappedI32, Marker, QuantKernelKind};
use ds4_ir::rng::Rng;
use std::sync::Arc;

/// Every kernel, compiled once for the tests that use them all (NVRTC is most of a run;
/// the device's primary context is shared, so the modules serve every test).
fn everything(dev: &Arc<Device>) -> &'static Kernels {
    static KS: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    KS.get_or_init(|| Kernels::compile(dev, &KernelSet::everything()).expect("every kernel compiles with NVRTC"))
}

/// The shortest of `reps` host-timed runs of `launch` (seconds), each between two device
/// synchronizations: a launch's time with its launch and wait overhead.
fn best_time(dev: &Arc<Device>, reps: usize, launch: impl Fn()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        dev.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        launch();
        dev.synchronize().unwrap();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    best
}

/// The tensor-core matmul `mm`'s trailing arguments for x at `x` (`len` floats read): x's
/// bf16 parts made by the split kernel, as the runtime makes them (returned too: they must
/// live until the matmul has run), or placeholders for a kernel on the TF32 path.
fn x_parts_args(dev: &Arc<Device>, ks: &Kernels, mm: &Loaded, x: u64, len: usize, dummy: u64) -> (Vec<Arg>, Option<x_parts::XParts>) {
    if !mm.reads_x_parts {
        return (x_parts::mma_args(None, dummy).map(|(_, a)| a).to_vec(), None);
    }
    let parts = x_parts::XParts::alloc(dev, len).unwrap();
    parts.split(dev, ks.get(x_parts::SPLIT_KERNEL).unwrap(), x).unwrap();
    (x_parts::mma_args(Some(&parts), dummy).map(|(_, a)| a).to_vec(), Some(parts))
}

fn device() -> Option<Arc<Device>> {
    if let Some(why) = skip_reason() {
        say(&why);
        return None;
    }
    Some(Device::open().expect("probe said yes"))
}


/// Runs one case on the GPU and in f64; returns (compared values, mismatches, worst error:
/// `op_cases::compare`).
fn run_case(dev: &Arc<Device>, ks: &Kernels, k: &Kernel, items: usize, args: &[A]) -> (usize, usize, f64) {
    run_case_on(dev, ks.get(&k.name).unwrap(), items, k, items, args)
}

/// `run_case` with `gpu`, launched over `blocks` blocks, for kernel `k`'s reference: a
/// kernel with `k`'s parameters and output but its own launch.
/// `k`'s inputs on the device, in parameter order (f64 buffers as f32), and the buffers
/// to keep until the launches that read them are done.
fn device_args(dev: &Arc<Device>, k: &Kernel, args: &[A]) -> (Vec<Arg>, Vec<ds4_runtime::cuda::DeviceBuf>) {
    let mut bufs = Vec::new();
    let mut dargs = Vec::new();
    for (a, p) in args.iter().zip(k.inputs()) {
        dargs.push(match (a, p.kind) {
            (A::F(v), _) => {
                let b = dev.upload(&v.iter().map(|&x| x as f32).collect::<Vec<f32>>()).unwrap();
                let ptr = b.ptr;
                bufs.push(b);
                Arg::Ptr(ptr)
            }
            (A::I(v), _) => {
                let b = dev.upload(v).unwrap();
                let ptr = b.ptr;
                bufs.push(b);
                Arg::Ptr(ptr)
            }
            (A::U(v), _) => Arg::U64(*v as u64),
            (A::S(v), ParamKind::Scalar { ty: Ty::F }) => Arg::F32(*v as f32),
            (A::S(v), _) => Arg::I32(*v as i32),
            (A::B(v), _) => Arg::Bool(*v),
        });
    }
    (dargs, bufs)
}

fn run_case_on(dev: &Arc<Device>, gpu: &Loaded, blocks: usize, k: &Kernel, items: usize, args: &[A]) -> (usize, usize, f64) {
    let kargs = kargs_of(args);
    let len = kir_eval::out_len(k, &kargs);
    let n_out = items * len;
    // Device side, in param order: output, then each argument.
    let out = dev.alloc(n_out.max(1) * 4).unwrap();
    let (ins, _bufs) = device_args(dev, k, args);
    let mut dargs = vec![Arg::Ptr(out.ptr)];
    dargs.extend(ins);
    // Kernels that may spread an item over several blocks run with 1 to 3 of them (the
    // item count decides, so that cases vary).
    let splits = if gpu.splits_items { 1 + items % 3 } else { 1 };
    // Kernels that stage their item's output in shared memory run with the room for it
    // (as the executor gives it) in every other case, in global memory in the others.
    let shared = if items.is_multiple_of(2) { gpu.shared_for(len) } else { gpu.dyn_shared };
    // Op kernels stride their loops by the block, and the executor gives a prefill's
    // launches other blocks than the kernel's own: some cases run with 32 to 128 threads,
    // or the most the kernel allows (a generated op kernel; a CUDA-text one keeps its own).
    let threads = if gpu.any_block { [gpu.threads, 32, 64, 128, gpu.max_threads][items % 5].min(gpu.max_threads) } else { gpu.threads };
    launch(dev, &gpu.func, (blocks as u32, splits as u32, 1), (threads, 1, 1), shared, &dargs).unwrap();
    dev.synchronize().unwrap();
    match k.out().1 {
        Elem::F => compare(k, items, args, Got::F(&out.read::<f32>(n_out).unwrap())),
        Elem::I32 => compare(k, items, args, Got::I(&out.read::<i32>(n_out).unwrap())),
    }
}

#[test]
fn every_op_kernel_matches_its_f64_reference() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let seed = seed();
    println!("op kernel parity on {} (seed {seed}):", dev.name);
    let failures = every_op_kernel(&mut Rng(seed), |k, items, args| run_case(&dev, ks, k, items, args));
    assert!(failures.is_empty(), "kernels off their f64 reference: {failures:?}");
}

/// `attention_tiled` (16 heads per block) against the f64 `attention_partial` whose
/// contract it shares: random cases (head counts not multiples of 16, widths from 1 to
/// 512, lists long enough for several tiles and ring refills, every comp mode, -1 picks,
/// several chunks), then the full-size shape. Both forms: `attention_tiled` and
/// `attention_tiled_one` (one block an SM), each case on the same arguments; the two
/// compute the same floats in the same order, so they must agree bit for bit too.
#[test]
fn attention_tiled_matches_the_attention_partial_reference() {
    let Some(dev) = device() else { return };
    let set = KernelSet { cuda: [(cuda_attention::NAME, Default::default()), (cuda_attention::ONE_NAME, Default::default())].into(), ..Default::default() };
    let ks = Kernels::compile(&dev, &set).expect("attention_tiled compiles with NVRTC");
    let forms = [cuda_attention::NAME, cuda_attention::ONE_NAME].map(|n| (n, ks.get(n).unwrap()));
    let k = ds4_ir::kernels::attention::attention_partial_kir();
    let seed = seed();
    let mut r = Rng(seed);
    for (name, tiled) in forms {
        let f = &tiled.func;
        let (regs, local, shared) = (f.num_regs().unwrap(), f.local_size_bytes().unwrap(), f.shared_size_bytes().unwrap());
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(tiled.threads, 0, None).unwrap();
        println!("{name} on {} (seed {seed}): {regs} registers, {local} bytes of local memory (spills), {shared} bytes shared, {per_sm} blocks per SM", dev.name);
    }
    let mut failures = Vec::new();
    let mut check = |label: String, s: &AttnShape, r: &mut Rng| {
        let (items, args) = attention_args(r, s);
        let blocks = cuda_attention::blocks(s.t, s.heads, s.nc);
        for (name, tiled) in forms {
            let (n, bad, worst) = run_case_on(&dev, tiled, blocks, &k, items, &args);
            println!("{name:<20} {label:<44} {n:>9} values {bad:>5} mismatches, worst rel {worst:.2e}{}", if bad > 0 { "  FAIL" } else { "" });
            if bad > 0 {
                failures.push(format!("{name}: {label}"));
            }
        }
        if !same_bits(&dev, forms.map(|f| f.1), &k, blocks, items * kir_eval::out_len(&k, &kargs_of(&args)), &args) {
            failures.push(format!("the two forms differ: {label}"));
        }
    };
    for _ in 0..40 {
        let hd = [1, 5, 16, 64, 300, 512][r.range(0, 6)];
        let rows = if hd >= 300 { r.range(10, 60) } else { r.range(10, 400) };
        let (t, heads, nc) = (r.range(1, 5), r.range(1, 40), r.range(1, 6));
        let s = AttnShape::random(&mut r, t, heads, hd, rows, nc);
        check(format!("t {} heads {} hd {} mode {} nc {} ({} rows)", s.t, s.heads, s.hd, s.comp_mode, s.nc, rows), &s, &mut r);
    }
    // DS4-Flash: 64 heads of 512, 128 window rows and 512 compressed rows per token.
    for (comp_mode, nc) in [(2, 1), (1, 1), (2, 3)] {
        let s = AttnShape { t: 3, heads: 64, hd: 512, pos0: 2045, win_pos0: 1918, window: 128, n_comp: 512, comp_mode, ratio: 4, k_sel: 512, nc };
        check(format!("full size: mode {comp_mode} nc {nc}"), &s, &mut r);
    }
    assert!(failures.is_empty(), "attention_tiled off the reference: {failures:?}");
}

/// Two kernels of contract `k` (a CUDA-text kernel and the generated one it stands for),
/// each in its own block size, on the same arguments over `items` items: whether their
/// `len` output floats are equal bit for bit (each with its dynamic shared memory).
fn same_bits(dev: &Arc<Device>, kernels: [&Loaded; 2], k: &Kernel, items: usize, len: usize, args: &[A]) -> bool {
    let (ins, _bufs) = device_args(dev, k, args);
    let outs: Vec<Vec<f32>> = kernels
        .iter()
        .map(|gpu| {
            let out = dev.alloc(len * 4).unwrap();
            let mut all = vec![Arg::Ptr(out.ptr)];
            all.extend(ins.iter().copied());
            launch(dev, &gpu.func, (items as u32, 1, 1), (gpu.threads, 1, 1), gpu.dyn_shared, &all).unwrap();
            out.read::<f32>(len).unwrap()
        })
        .collect();
    outs[0].iter().zip(&outs[1]).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// `hc_mix_warp` (a warp per token) against the f64 `hc_mix` whose contract it shares, and
/// bit for bit against the generated `hc_mix` (the same f32 operations in the same order):
/// every nh that fits a warp, 1 to 25 Sinkhorn iterations.
#[test]
fn hc_mix_warp_matches_hc_mix() {
    let Some(dev) = device() else { return };
    let set = KernelSet { ops: [("hc_mix".to_string(), Default::default())].into(), cuda: [(cuda_hc_mix::NAME, Default::default())].into(), ..Default::default() };
    let ks = Kernels::compile(&dev, &set).expect("hc_mix_warp compiles with NVRTC");
    let (warp, generic) = (ks.get(cuda_hc_mix::NAME).unwrap(), ks.get("hc_mix").unwrap());
    let k = cuda_hc_mix::contract();
    let mut r = Rng(seed());
    for nh in 1..=5 {
        assert!(cuda_hc_mix::fits(nh));
        let t = r.range(1, 40);
        let mw = 2 * nh + nh * nh;
        let args = vec![A::F(r.f32_floats(t * mw, -2.0, 2.0)), A::F(r.f32_floats(3, 0.5, 2.0)), A::F(r.f32_floats(mw, -1.0, 1.0)), A::U(nh), A::U(r.range(1, 26)), A::S(1e-6)];
        let (n, bad, worst) = run_case_on(&dev, warp, t, &k, t, &args);
        println!("hc_mix_warp nh {nh}, {t} tokens: {n} values, {bad} mismatches, worst rel {worst:.2e}");
        assert_eq!(bad, 0, "hc_mix_warp off the f64 reference (nh {nh})");
        assert!(same_bits(&dev, [warp, generic], &k, t, t * mw, &args), "hc_mix_warp differs from the generated hc_mix (nh {nh})");
    }
}

/// The digits of `len` values (`x_digits`' outputs): the digit planes, the scales and the
/// sums.
type Digits = (ds4_runtime::cuda::DeviceBuf, ds4_runtime::cuda::DeviceBuf, ds4_runtime::cuda::DeviceBuf);

/// Buffers for the digits of `len` values.
fn alloc_digits(dev: &Arc<Device>, len: usize) -> Digits {
    (dev.alloc(cuda_digits::digit_bytes(len)).unwrap(), dev.alloc(len / cuda_digits::X_BLOCK * 4).unwrap(), dev.alloc(len / cuda_digits::SUM_SPAN * 4).unwrap())
}

/// `len` floats of a device buffer as their bits (comparisons bit for bit).
fn f32_bits(b: &ds4_runtime::cuda::DeviceBuf, len: usize) -> Vec<u32> {
    b.read::<f32>(len).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Asserts `got`, the digits of `len` values a fused launch made, bit for bit `want`
/// (`x_digits`' of the same values): planes, scales and sums.
fn assert_same_digits(what: &str, got: &Digits, want: &Digits, len: usize) {
    let planes = |d: &Digits| d.0.read::<u8>(cuda_digits::digit_bytes(len)).unwrap();
    assert_eq!(planes(got), planes(want), "{what}: digit planes ({len})");
    assert_eq!(f32_bits(&got.1, len / cuda_digits::X_BLOCK), f32_bits(&want.1, len / cuda_digits::X_BLOCK), "{what}: scales ({len})");
    assert_eq!(f32_bits(&got.2, len / cuda_digits::SUM_SPAN), f32_bits(&want.2, len / cuda_digits::SUM_SPAN), "{what}: sums ({len})");
}

/// `x_digits` on `len` floats at `x` (with `swiglu`'s clamp: of the clamped SwiGLU of the
/// gate rows `x` and the up rows `u`), as the runtime launches it.
fn x_digits_on(dev: &Arc<Device>, xk: &Loaded, x: u64, u: u64, len: usize, swiglu: Option<f32>) -> Digits {
    let (xd, xs, xsum) = alloc_digits(dev, len);
    let args = [Arg::Ptr(xd.ptr), Arg::Ptr(xs.ptr), Arg::Ptr(xsum.ptr), Arg::Ptr(x), Arg::Ptr(u), Arg::U64(len as u64), Arg::F32(swiglu.unwrap_or(0.0)), Arg::U64(swiglu.is_some() as u64)];
    launch(dev, &xk.func, (cuda_digits::x_digits_blocks(len) as u32, 1, 1), (xk.threads, 1, 1), 0, &args).unwrap();
    (xd, xs, xsum)
}

/// x for the digit kernels' tests: 32-value blocks of 1e-6 to 1e3, every seventh a block
/// of zeros and another with a lone value.
fn mixed_blocks(r: &mut Rng, len: usize) -> Vec<f32> {
    let mut x: Vec<f32> = Vec::with_capacity(len);
    for b in 0..len / 32 {
        let mag = 10f64.powf(r.uniform(-6.0, 3.0));
        for j in 0..32 {
            x.push(match b % 7 {
                3 => 0.0,
                5 if j != 9 => 0.0,
                _ => r.uniform(-mag, mag) as f32,
            });
        }
    }
    x
}

/// |got − w·x| / Σ|w·x| for one row of `ty` bytes against x, in f64 (the mat-vec bound's
/// measure).
fn row_error(ty: ds4_ir::GgmlType, row: &[u8], x: &[f32], got: f32) -> f64 {
    let mut w = vec![0f32; x.len()];
    ds4_ir::quant::dequantize_row(ty, row, &mut w).unwrap();
    let (want, norm) = w.iter().zip(x).fold((0f64, 0f64), |(a, m), (&wv, &xv)| (a + wv as f64 * xv as f64, m + (wv as f64 * xv as f64).abs()));
    (got as f64 - want).abs() / norm.max(1e-30)
}

/// `x_digits` and `matvec_digits_iq2_xxs` (a decode token's IQ2_XXS expert gate and up in
/// dp4a against x split into int8 digits): the digits give back every value truncated
/// toward zero to within 2^(E-7·DIGITS) (|x| < 2^E in its block), and the
/// mat-vec is the f64 product of the de-quantized rows with x to 1e-5 of Σ|w·x|, the bound
/// of every mat-vec; on x blocks of mixed magnitudes, zeros included, and unused picks (-1).
/// `matvec_digits_iq2_xxs_swiglu` makes the digits of those rows' SwiGLU as `x_digits` does.
#[test]
fn digits_experts_match_the_f64_product() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (xk, mk) = (ks.get(cuda_digits::X_DIGITS).unwrap(), ks.get(cuda_digits::MATVEC_IQ2_XXS).unwrap());
    let sk = ks.get(cuda_digits::MATVEC_IQ2_XXS_SWIGLU).unwrap();
    let mut swiglu_cases = 0;
    let ty = ds4_ir::GgmlType::Iq2Xxs;
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for (case, &(n, k)) in [(16, 256), (32, 512), (48, 4096), (2048, 4096)].iter().enumerate() {
        let (experts, picks) = (3, 1 + case % 3);
        let rb = ty.bytes_for(k as u64).unwrap() as usize;
        // Random grid indices, signs and scales; d a small positive f16.
        let mut bytes: Vec<u8> = (0..2 * experts * n * rb).map(|_| r.range(0, 256) as u8).collect();
        for b in bytes.chunks_exact_mut(66) {
            let d = ds4_ir::quant::rt::f16::from_f32(r.uniform(0.001, 0.02) as f32).to_bits().to_le_bytes();
            b[..2].copy_from_slice(&d);
        }
        let (wg, wu) = bytes.split_at(experts * n * rb);
        // On the device as IQ2_XXS_R, as the upload regroups them (checked against the
        // IQ2_XXS rows below: the same numbers).
        let rrb = ds4_ir::GgmlType::Iq2XxsR.bytes_for(k as u64).unwrap() as usize;
        let regrouped = |w: &[u8]| {
            let mut out = vec![0u8; w.len() / rb * rrb];
            ds4_ir::quant::regroup_iq2_xxs(w, &mut out).unwrap();
            out
        };
        let x = mixed_blocks(&mut r, k);
        let sel: Vec<i32> = (0..picks).map(|p| if p == 1 { -1 } else { r.range(0, experts) as i32 }).collect();
        let (gb, ub) = (dev.alloc(picks * n * 4).unwrap(), dev.alloc(picks * n * 4).unwrap());
        let (wgb, wub, xb, sb) = (dev.upload(&regrouped(wg)).unwrap(), dev.upload(&regrouped(wu)).unwrap(), dev.upload(&x).unwrap(), dev.upload(&sel).unwrap());
        let (xd, xs, xsum) = x_digits_on(&dev, xk, xb.ptr, xb.ptr, k, None);
        let args_inputs = [Arg::Ptr(wgb.ptr), Arg::Ptr(wub.ptr), Arg::Ptr(xd.ptr), Arg::Ptr(xs.ptr), Arg::Ptr(sb.ptr), u(n), u(k), u(rrb), u(picks)];
        let mut args = vec![Arg::Ptr(gb.ptr), Arg::Ptr(ub.ptr)];
        args.extend_from_slice(&args_inputs);
        launch(&dev, &mk.func, ((n / cuda_digits::ROWS_PER_BLOCK) as u32, 2 * picks as u32, 1), (mk.threads, 1, 1), 0, &args).unwrap();
        // The digits give x back.
        let digits: Vec<u8> = xd.read(cuda_digits::digit_bytes(k)).unwrap();
        let scales: Vec<f32> = xs.read(k / 32).unwrap();
        for b in 0..k / 32 {
            let amax = x[b * 32..(b + 1) * 32].iter().fold(0f32, |m, v| m.max(v.abs()));
            for j in b * 32..(b + 1) * 32 {
                let back: f64 = (0..cuda_digits::DIGITS).map(|p| digits[cuda_digits::digit_at(k, p, j)] as i8 as f64 * 128f64.powi(-(p as i32))).sum::<f64>() * scales[b] as f64;
                let bound = scales[b] as f64 * 2f64.powi(7 - 7 * cuda_digits::DIGITS as i32);
                assert!((back - x[j] as f64).abs() <= bound, "x[{j}] = {} comes back as {back}", x[j]);
                assert!(back.abs() <= (x[j] as f64).abs() && back * x[j] as f64 >= 0.0, "x[{j}] = {} comes back as {back}, not truncated", x[j]);
                assert!(amax == 0.0 || (amax as f64) < scales[b] as f64 * 128.0, "2^E exceeds the block's values");
            }
        }
        let sums: Vec<f32> = xsum.read(k / 16).unwrap();
        for (i, s) in sums.iter().enumerate() {
            let (want, norm) = x[i * 16..(i + 1) * 16].iter().fold((0f64, 0f64), |(a, n), &v| (a + v as f64, n + (v as f64).abs()));
            assert!((*s as f64 - want).abs() <= 1e-6 * norm, "sum {i} of x: {s}, want {want}");
        }
        let mut worst = 0f64;
        for (out, w) in [(&gb, wg), (&ub, wu)] {
            let got: Vec<f32> = out.read(picks * n).unwrap();
            for p in 0..picks {
                for row in 0..n {
                    let g = got[p * n + row];
                    // An unused pick's row is 0 against nothing (checked below).
                    worst = worst.max(if sel[p] >= 0 { row_error(ty, &w[(sel[p] as usize * n + row) * rb..][..rb], &x, g) } else { g.abs() as f64 / 1e-30 });
                    if sel[p] < 0 {
                        assert_eq!(got[p * n + row], 0.0, "an unused pick's rows are zero");
                    }
                }
            }
        }
        println!("{}: {n} rows × {k}, {picks} picks: worst |Δ|/Σ|w·x| {worst:.2e}", cuda_digits::MATVEC_IQ2_XXS);
        assert!(worst < 1e-5, "{}: off by {worst}", cuda_digits::MATVEC_IQ2_XXS);
        // The launch that makes the digits of the SwiGLU for the down instead of the rows:
        // bit for bit `x_digits` of the SwiGLU of the rows above, clamped or not.
        if cuda_digits::swiglu_fits(n) {
            for clamp in [1e4f32, 0.05] {
                let h = alloc_digits(&dev, picks * n);
                let mut args = vec![Arg::Ptr(h.0.ptr), Arg::Ptr(h.1.ptr), Arg::Ptr(h.2.ptr)];
                args.extend_from_slice(&args_inputs);
                args.push(Arg::F32(clamp));
                launch(&dev, &sk.func, ((n / cuda_digits::X_BLOCK) as u32, picks as u32, 1), (sk.threads, 1, 1), 0, &args).unwrap();
                let want = x_digits_on(&dev, xk, gb.ptr, ub.ptr, picks * n, Some(clamp));
                assert_same_digits(&format!("{} ({n} rows × {k}, {picks} picks, clamp {clamp})", cuda_digits::MATVEC_IQ2_XXS_SWIGLU), &h, &want, picks * n);
                println!("{}: {n} rows × {k}, {picks} picks, clamp {clamp}: the digits of gate and up then x_digits, bit for bit", cuda_digits::MATVEC_IQ2_XXS_SWIGLU);
                swiglu_cases += 1;
            }
        }
    }
    assert_eq!(swiglu_cases, 4, "{} ran on two shapes", cuda_digits::MATVEC_IQ2_XXS_SWIGLU);
}

/// `norm_rope` (a row's RMS norm, RoPE and FP8 round trip in one launch) against the
/// generated kernels it stands for, launched one after another with the norm's threads,
/// bit for bit: query-like rows (plain norm, several heads, no round trip) and KV-like rows
/// (weighted norm, one head, the round trip), at token and compressed positions, forward
/// and inverse, with 64 to 1024 threads, and with a thread per value (a decode's launch:
/// the kernel's register path, cases 8 and on).
#[test]
fn norm_rope_matches_the_chain_it_fuses() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let fused = ks.get(cuda_norm_rope::NAME).unwrap();
    for case in 0..14 {
        let weighted = case % 2 == 1;
        let heads = if weighted { 1 } else { [1, 4, 8][case % 3] };
        let n = [64, 128, 512, 1024][r.range(0, 4)];
        let n_rot = 2 * r.range(1, n / 4 + 1);
        let tokens = r.range(1, 6);
        let rows = tokens * heads;
        let threads = if case >= 8 { n as u32 } else { [64u32, 128, 256, 512, 1024][r.range(0, 5)] };
        let (pos_base, pos_mult) = if case % 4 == 3 { (r.range(0, 1000), 4) } else { (r.range(0, 100000), 1) };
        let sign = if case == 6 || case == 12 { -1.0f32 } else { 1.0 };
        let fp8 = weighted && case != 7;
        let n_nope = n - n_rot;
        let (x, w, freq) = (f32s(&mut r, rows * n, -40.0, 40.0), f32s(&mut r, n, 0.5, 1.5), f32s(&mut r, n_rot / 2, 1e-4, 1.0));
        let (xb, wb, fb) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap(), dev.upload(&freq).unwrap());
        let eps = 1e-6f32;
        // The chain.
        let normed = dev.alloc(rows * n * 4).unwrap();
        if weighted {
            let k = ks.get("rms_norm").unwrap();
            launch(&dev, &k.func, (rows as u32, 1, 1), (threads, 1, 1), 0, &[Arg::Ptr(normed.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(wb.ptr), u(n), Arg::F32(eps)]).unwrap();
        } else {
            let k = ks.get("rms_norm_plain").unwrap();
            launch(&dev, &k.func, (rows as u32, 1, 1), (threads, 1, 1), 0, &[Arg::Ptr(normed.ptr), Arg::Ptr(xb.ptr), u(n), Arg::F32(eps)]).unwrap();
        }
        let roped = dev.alloc(rows * n * 4).unwrap();
        let k = ks.get("rope").unwrap();
        launch(&dev, &k.func, (rows as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(roped.ptr), Arg::Ptr(normed.ptr), Arg::Ptr(fb.ptr), u(heads), u(n), u(n_rot), u(pos_base), u(pos_mult), Arg::F32(sign)]).unwrap();
        let want: Vec<f32> = if fp8 {
            let out = dev.alloc(rows * n * 4).unwrap();
            let k = ks.get("fp8_roundtrip").unwrap();
            launch(&dev, &k.func, (rows as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(out.ptr), Arg::Ptr(roped.ptr), u(n), u(n_nope)]).unwrap();
            out.read(rows * n).unwrap()
        } else {
            roped.read(rows * n).unwrap()
        };
        // The one launch.
        let out = dev.alloc(rows * n * 4).unwrap();
        let args = [
            Arg::Ptr(out.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(fb.ptr), u(n), u(heads), u(n_rot), u(pos_base), u(pos_mult),
            Arg::F32(eps), Arg::F32(sign), u(weighted as usize), u(fp8 as usize), u(n_nope),
        ];
        launch(&dev, &fused.func, (rows as u32, 1, 1), (threads, 1, 1), cuda_norm_rope::shared_bytes(n), &args).unwrap();
        let got: Vec<f32> = out.read(rows * n).unwrap();
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        println!("norm_rope: {rows} rows of {n} ({heads} heads, n_rot {n_rot}, {threads} threads, weighted {weighted}, fp8 {fp8}, sign {sign}): {differ} values differ");
        assert_eq!(differ, 0, "norm_rope is not the chain's floats");
    }
}

/// `rope_hadamard_fp4` (the indexer query's RoPE and Hadamard transform, one launch): bit
/// for bit `rope` then `hadamard_fp4` (the op kernels, with and without the FP4 round trip),
/// rows of 128 with 2 to 128 values rotated, 1 to 6 tokens of 1 to 64 heads (a partial last
/// block), positions up to 100,000 and the inverse's sign.
#[test]
fn rope_hadamard_matches_rope_then_hadamard() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let (fused, rope, had) = (ks.get(cuda_norm_rope::ROPE_HADAMARD).unwrap(), ks.get("rope").unwrap(), ks.get("hadamard_fp4").unwrap());
    let n = cuda_norm_rope::HADAMARD_N;
    for case in 0..8 {
        let heads = [1, 3, 64, 64][case % 4];
        let tokens = r.range(1, 7);
        let rows = tokens * heads;
        let n_rot = if case == 1 { n } else { 2 * r.range(1, n / 2 + 1) };
        let (pos_base, pos_mult) = if case % 4 == 3 { (r.range(0, 1000), 4) } else { (r.range(0, 100000), 1) };
        let sign = if case == 5 { -1.0f32 } else { 1.0 };
        let fp4 = case != 2;
        let (x, freq) = (f32s(&mut r, rows * n, -8.0, 8.0), f32s(&mut r, n_rot / 2, 1e-4, 1.0));
        let (xb, fb) = (dev.upload(&x).unwrap(), dev.upload(&freq).unwrap());
        let roped = dev.alloc(rows * n * 4).unwrap();
        launch(&dev, &rope.func, (rows as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(roped.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(fb.ptr), u(heads), u(n), u(n_rot), u(pos_base), u(pos_mult), Arg::F32(sign)]).unwrap();
        let want_b = dev.alloc(rows * n * 4).unwrap();
        launch(&dev, &had.func, (rows as u32, 1, 1), (128, 1, 1), (n * 4) as u32, &[Arg::Ptr(want_b.ptr), Arg::Ptr(roped.ptr), Arg::Bool(fp4)]).unwrap();
        let out = dev.alloc(rows * n * 4).unwrap();
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(fb.ptr), u(rows), u(heads), u(n_rot), u(pos_base), u(pos_mult), Arg::F32(sign), u(fp4 as usize)];
        launch(&dev, &fused.func, (cuda_norm_rope::rope_hadamard_blocks(rows), 1, 1), (cuda_norm_rope::ROPE_HADAMARD_THREADS, 1, 1), 0, &args).unwrap();
        let (got, want): (Vec<f32>, Vec<f32>) = (out.read(rows * n).unwrap(), want_b.read(rows * n).unwrap());
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        println!("rope_hadamard_fp4: {rows} rows ({heads} heads, n_rot {n_rot}, fp4 {fp4}, sign {sign}): {differ} values differ");
        assert_eq!(differ, 0, "rope_hadamard_fp4 is not rope then hadamard_fp4");
    }
}

/// `matvec_f16_vec` (a decode token's F16 mat-vec in 16-byte loads) against the f64
/// product, to 1e-5 of Σ|w·x| as every mat-vec: one group (an odd row count: the last
/// block's second row clamped, not written), row groups reading their own x, and the
/// shapes it runs at in DeepSeek-V4-Flash (the router, the compressor, the indexer's q_b).
#[test]
fn matvec_f16_vec_matches_the_f64_product() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let kl = ks.get(cuda_f16_vec::NAME).unwrap();
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for &(n, k, ng) in &[(7, 64, 7), (12, 128, 4), (256, 4096, 256), (2048, 4096, 2048), (8192, 1024, 8192)] {
        assert!(cuda_f16_vec::fits(n, k, ng, 1, false));
        let w: Vec<u16> = (0..n * k).map(|_| ds4_ir::quant::rt::f16::from_f32(r.uniform(-1.0, 1.0) as f32).to_bits()).collect();
        let x: Vec<f32> = f32s(&mut r, (n / ng) * k, -4.0, 4.0);
        let (wb, xb, out) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap(), dev.alloc(n * 4).unwrap());
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xb.ptr), u(n), u(k), u(ng)];
        launch(&dev, &kl.func, (cuda_f16_vec::blocks(n), 1, 1), (kl.threads, 1, 1), 0, &args).unwrap();
        let got: Vec<f32> = out.read(n).unwrap();
        let mut worst = 0f64;
        for row in 0..n {
            let xr = &x[(row / ng) * k..][..k];
            let (want, norm) = w[row * k..][..k].iter().zip(xr).fold((0f64, 0f64), |(a, m), (&h, &v)| {
                let p = ds4_ir::quant::rt::f16::from_bits(h).to_f32() as f64 * v as f64;
                (a + p, m + p.abs())
            });
            worst = worst.max((got[row] as f64 - want).abs() / norm.max(1e-30));
        }
        println!("{}: {n} rows × {k}, groups of {ng}: worst |Δ|/Σ|w·x| {worst:.2e}", cuda_f16_vec::NAME);
        assert!(worst < 1e-5, "{}: off by {worst}", cuda_f16_vec::NAME);
    }
}

/// The inputs of an `hc_expand` of `tokens` tokens of n channels and nh streams: the old
/// streams and the mix (post weights in 0..2 and comb entries in 0..1, as the mix makes).
fn expand_inputs(r: &mut Rng, tokens: usize, n: usize, nh: usize) -> (Vec<f32>, Vec<f32>) {
    let mw = 2 * nh + nh * nh;
    let streams = f32s(r, tokens * nh * n, -3.0, 3.0);
    let mix: Vec<f32> = (0..tokens * mw).map(|i| if i % mw < 2 * nh { r.uniform(0.0, 2.0) as f32 } else { r.uniform(0.0, 1.0) as f32 }).collect();
    (streams, mix)
}

/// A launch's expand (`cuda_hc_expand.rs`) against the IR's `hc_expand` in f32 (the CPU
/// backend's op) of the y the launch stored, bit for bit.
#[allow(clippy::too_many_arguments)]
fn assert_expand_is_the_ops(kernel: &str, got: &[f32], y: &[f32], streams: &[f32], mix: &[f32], tokens: usize, n: usize, nh: usize) {
    let mut want = vec![0f32; tokens * nh * n];
    for t in 0..tokens {
        ds4_ir::kernels::hc::hc_expand::<f32>(t, &mut want[t * nh * n..][..nh * n], y, streams, mix, nh, n);
    }
    let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    println!("{kernel}: the expand of {tokens} token(s), {n} channels, {nh} streams: {differ} values differ from hc_expand's");
    assert_eq!(differ, 0, "{kernel}: the expand is not hc_expand's floats");
}

/// `matvec_dense_q8_0_r` and its short-row form (every row of Q8_0_R for each token,
/// quant/cuda_matvec_dense.rs) against the f64 product of the de-quantized rows, to 1e-5 of Σ|w·x| as every mat-vec,
/// and, where the generated `matvec_q8_0_r` takes a block per group of four rows (the
/// same lanes over the same runs), bit for bit against it: a row count that leaves the
/// last block short (its rows clamped, not written), row groups reading their own x, two
/// tokens, and DeepSeek-V4-Flash's shapes at a shorter row. Where a launch can take the
/// `hc_expand` of its output (one row group), again with it: the same output, and the
/// expand bit for bit the op's (1 to 5 streams).
#[test]
fn matvec_dense_matches_the_f64_product_and_the_generated_kernel() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let generated = ks.get(&kernel_name(QuantKernelKind::MatVec, ds4_ir::GgmlType::Q8_0R)).unwrap();
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let (four, sixteen) = (&cuda_matvec_dense::DENSE, &cuda_matvec_dense::SHORT);
    let cases = [(four, 1023usize, 256usize, 1usize, 1usize), (four, 1536, 1024, 1, 1), (four, 4096, 512, 1, 2), (four, 8192, 768, 8, 1), (four, 32768, 256, 1, 1), (sixteen, 32768, 1024, 1, 1), (sixteen, 4099, 768, 1, 2), (sixteen, 8192, 512, 8, 1)];
    for &(form, n, k, groups, tokens) in &cases {
        let dense = ks.get(form.name).unwrap();
        let ng = n.div_ceil(groups);
        assert!(cuda_matvec_dense::fits(form, ds4_ir::GgmlType::Q8_0R, n, k, tokens, groups, ng, 1, 1, false, false), "{n} × {k}");
        let rb = ds4_ir::GgmlType::Q8_0R.bytes_for(k as u64).unwrap() as usize;
        let src = f32s(&mut r, n * k, -2.0, 2.0);
        let (mut q8, mut bytes) = (vec![0u8; n * rb], vec![0u8; n * rb]);
        for i in 0..n {
            ds4_ir::quant::quantize_row(ds4_ir::GgmlType::Q8_0, &src[i * k..][..k], &mut q8[i * rb..][..rb]).unwrap();
        }
        ds4_ir::quant::regroup_q8_0(&q8, &mut bytes).unwrap();
        let mut wrows = vec![0f32; n * k];
        ds4_ir::quant::dequantize_row(ds4_ir::GgmlType::Q8_0R, &bytes, &mut wrows).unwrap();
        let x = f32s(&mut r, tokens * groups * k, -1.0, 1.0);
        let (wb, xb, out, out_gen, dummy) = (dev.upload(&bytes).unwrap(), dev.upload(&x).unwrap(), dev.alloc(tokens * n * 4).unwrap(), dev.alloc(tokens * n * 4).unwrap(), dev.alloc(256).unwrap());
        let (gx, gy) = cuda_matvec_dense::grid(form, n, tokens, false);
        let no_ride = [Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(0), u(0), Arg::F32(0.0)];
        let args = [&[Arg::Ptr(out.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xb.ptr), u(n), u(k), u(rb), u(groups), u(ng), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(0)][..], &no_ride].concat();
        launch(&dev, &dense.func, (gx, gy, 1), (dense.threads, 1, 1), 0, &args).unwrap();
        let got: Vec<f32> = out.read(tokens * n).unwrap();
        let nh = 1 + r.range(0, cuda_hc_mix::MAX_NH);
        if cuda_matvec_dense::expand_fits(form, groups, nh) {
            let (streams, mix) = expand_inputs(&mut r, tokens, n, nh);
            let (sb, mb, eout, out2) = (dev.upload(&streams).unwrap(), dev.upload(&mix).unwrap(), dev.alloc(tokens * nh * n * 4).unwrap(), dev.alloc(tokens * n * 4).unwrap());
            let args = [&[Arg::Ptr(out2.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xb.ptr), u(n), u(k), u(rb), u(groups), u(ng), Arg::Ptr(eout.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(mb.ptr), u(nh)][..], &no_ride].concat();
            launch(&dev, &dense.func, (gx, gy, 1), (dense.threads, 1, 1), 0, &args).unwrap();
            assert!(out2.read::<f32>(tokens * n).unwrap().iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: the expand changed the output", form.name);
            assert_expand_is_the_ops(form.name, &eout.read::<f32>(tokens * nh * n).unwrap(), &got, &streams, &mix, tokens, n, nh);
        }
        // With an `hc_pre`'s Sinkhorn riding in a block of its own: the same output, and
        // the mix's entries bit for bit those of an `hc_comb` launch on the same projections.
        {
            let (mw, iters) = (2 * nh + nh * nh, 1 + r.range(0, 20));
            let (proj, scale, base) = (f32s(&mut r, tokens * mw, -2.0, 2.0), f32s(&mut r, 3, 0.5, 2.0), f32s(&mut r, mw, -1.0, 1.0));
            let (pb, sb, bb) = (dev.upload(&proj).unwrap(), dev.upload(&scale).unwrap(), dev.upload(&base).unwrap());
            let zeros = vec![0f32; tokens * mw];
            let (mix_ride, mix_comb, out3) = (dev.upload(&zeros).unwrap(), dev.upload(&zeros).unwrap(), dev.alloc(tokens * n * 4).unwrap());
            let ride = [Arg::Ptr(mix_ride.ptr), Arg::Ptr(pb.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(bb.ptr), u(nh), u(iters), Arg::F32(1e-6)];
            let args = [&[Arg::Ptr(out3.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xb.ptr), u(n), u(k), u(rb), u(groups), u(ng), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(0)][..], &ride].concat();
            let (rx, ry) = cuda_matvec_dense::grid(form, n, tokens, true);
            assert_eq!((rx, ry), (gx + 1, gy));
            launch(&dev, &dense.func, (rx, ry, 1), (dense.threads, 1, 1), 0, &args).unwrap();
            let comb = ks.get(cuda_hc_pre::HC_COMB).unwrap();
            launch(&dev, &comb.func, (tokens as u32, 1, 1), (32, 1, 1), 0, &[Arg::Ptr(mix_comb.ptr), Arg::Ptr(pb.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(bb.ptr), u(nh), u(iters), Arg::F32(1e-6)]).unwrap();
            assert!(out3.read::<f32>(tokens * n).unwrap().iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: the riding Sinkhorn changed the output", form.name);
            assert_eq!(f32_bits(&mix_ride, tokens * mw), f32_bits(&mix_comb, tokens * mw), "{}: the riding Sinkhorn's entries differ from hc_comb's (nh {nh}, {tokens} tokens)", form.name);
        }
        let mut worst = 0f64;
        for t in 0..tokens {
            for row in 0..n {
                let xr = &x[(t * groups + row / ng) * k..][..k];
                let (want, norm) = wrows[row * k..][..k].iter().zip(xr).fold((0f64, 0f64), |(a, m), (&w, &v)| (a + w as f64 * v as f64, m + (w as f64 * v as f64).abs()));
                worst = worst.max((got[t * n + row] as f64 - want).abs() / norm.max(1e-30));
            }
        }
        // The generated kernel on its block-per-group path, where it takes it.
        let path = ds4_runtime::cuda::matvec_block_rows(ds4_ir::GgmlType::Q8_0R, n as u64, tokens as u64, groups as u64, ng as u64);
        let same = if path == 4 {
            let row_blocks = n.div_ceil(4);
            let gargs = [Arg::Ptr(out_gen.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(n), u(k), u(rb), u(1), u(1), u(groups), u(ng), u(0), u(0), u(row_blocks)];
            launch(&dev, &generated.func, (row_blocks as u32, tokens as u32, 1), (generated.threads, 1, 1), generated.dyn_shared, &gargs).unwrap();
            let want: Vec<f32> = out_gen.read(tokens * n).unwrap();
            Some(got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count())
        } else {
            None
        };
        println!("{}: {n} rows × {k} in {groups} groups, {tokens} tokens: worst |Δ|/Σ|w·x| {worst:.2e}; {}", form.name, match same { Some(d) => format!("{d} values differ from the generated kernel's"), None => "the generated kernel takes another path".into() });
        assert!(worst < 1e-5, "{}: off by {worst}", form.name);
        assert_eq!(same.unwrap_or(0), 0, "{}: not the generated block-per-group sums", form.name);
    }
}

/// `matvec_digits_q8_0_r` (a decode token's short Q8_0_R rows, `attn_q_b`'s, in dp4a
/// against x's digits) against the f64 product of the de-quantized rows with x, to 1e-5
/// of Σ|w·x| as every mat-vec; random scales and quants, x blocks of mixed magnitudes with
/// zeros and a lone value, rows of 64 to the longest it takes.
#[test]
fn digits_dense_matches_the_f64_product() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (xk, mk) = (ks.get(cuda_digits::X_DIGITS).unwrap(), ks.get(cuda_digits::MATVEC_Q8_0_R).unwrap());
    let ty = ds4_ir::GgmlType::Q8_0R;
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for &(n, k) in &[(16, 64), (48, 512), (2048, cuda_digits::DENSE_MAX_K)] {
        let fits = |n, k| cuda_digits::dense_fits(ty, n, k, 1, 1, 1, 1, false, false);
        assert!(fits(n, k) && !fits(n, 2 * cuda_digits::DENSE_MAX_K) && !fits(n + 8, k));
        let rb = ty.bytes_for(k as u64).unwrap() as usize;
        let mut w: Vec<u8> = (0..n * rb).map(|_| r.range(0, 256) as u8).collect();
        for b in w.chunks_exact_mut(68) {
            for s in 0..2 {
                let d = ds4_ir::quant::rt::f16::from_f32(r.uniform(-0.02, 0.02) as f32).to_bits().to_le_bytes();
                b[2 * s..2 * s + 2].copy_from_slice(&d);
            }
        }
        let x = mixed_blocks(&mut r, k);
        let out = dev.alloc(n * 4).unwrap();
        let (wb, xb) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap());
        let (xd, xs, _xsum) = x_digits_on(&dev, xk, xb.ptr, xb.ptr, k, None);
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xd.ptr), Arg::Ptr(xs.ptr), u(n), u(k), u(rb)];
        launch(&dev, &mk.func, ((n / cuda_digits::ROWS_PER_BLOCK) as u32, 1, 1), (mk.threads, 1, 1), 0, &args).unwrap();
        let got: Vec<f32> = out.read(n).unwrap();
        let worst = (0..n).map(|row| row_error(ty, &w[row * rb..][..rb], &x, got[row])).fold(0f64, f64::max);
        println!("{}: {n} rows × {k}: worst |Δ|/Σ|w·x| {worst:.2e}", cuda_digits::MATVEC_Q8_0_R);
        assert!(worst < 1e-5, "{}: off by {worst}", cuda_digits::MATVEC_Q8_0_R);
    }
}

/// `rms_norm_digits` (a decode token's weighted RMS norm and its output's digits, one
/// launch) against the two launches it stands for, `rms_norm` at a thread a value (the
/// runtime's launch of a decode token's row) then `x_digits` of its output: the same
/// floats, digit planes, scales and sums, bit for bit; rows of 32 to the longest it takes,
/// blocks of mixed magnitudes with zeros and a lone value.
#[test]
fn norm_digits_matches_the_norm_then_x_digits() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (nk, norm, xk) = (ks.get(cuda_digits::NORM_DIGITS).unwrap(), ks.get("rms_norm").unwrap(), ks.get(cuda_digits::X_DIGITS).unwrap());
    let mut r = Rng(seed());
    for k in [32, 96, 512, cuda_digits::NORM_DIGITS_MAX_K] {
        assert!(cuda_digits::norm_digits_fits(1, k) && !cuda_digits::norm_digits_fits(2, k) && !cuda_digits::norm_digits_fits(1, k + 16));
        let eps = 1e-6f32;
        let (x, w) = (mixed_blocks(&mut r, k), f32s(&mut r, k, -2.0, 2.0));
        let (xb, wb) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
        let out = dev.alloc(k * 4).unwrap();
        let digits = alloc_digits(&dev, k);
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(digits.0.ptr), Arg::Ptr(digits.1.ptr), Arg::Ptr(digits.2.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(wb.ptr), Arg::U64(k as u64), Arg::F32(eps)];
        launch(&dev, &nk.func, (1, 1, 1), (k as u32, 1, 1), 0, &args).unwrap();
        let want = dev.alloc(k * 4).unwrap();
        launch(&dev, &norm.func, (1, 1, 1), (k as u32, 1, 1), 0, &[Arg::Ptr(want.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(wb.ptr), Arg::U64(k as u64), Arg::F32(eps)]).unwrap();
        assert_eq!(f32_bits(&out, k), f32_bits(&want, k), "{}: the norm ({k})", cuda_digits::NORM_DIGITS);
        assert_same_digits(cuda_digits::NORM_DIGITS, &digits, &x_digits_on(&dev, xk, want.ptr, want.ptr, k, None), k);
        println!("{}: {k} values: rms_norm then x_digits, bit for bit", cuda_digits::NORM_DIGITS);
    }
}

/// `matvec_digits_q2_k` (a decode token's Q2_K expert down in dp4a against the picks' x
/// rows as digits, summed over the picks with their weights) against the f64 product of
/// the de-quantized rows, to 1e-5 of Σ|w·x|; random blocks (scales, mins, planes, d and
/// dmin), x rows of mixed magnitudes, an unused pick (-1). With the addend, also the
/// `hc_expand` of the output (1 to 5 streams), bit for bit the op's.
#[test]
fn digits_down_matches_the_f64_product() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (xk, mk) = (ks.get(cuda_digits::X_DIGITS).unwrap(), ks.get(cuda_digits::MATVEC_Q2_K).unwrap());
    let ty = ds4_ir::GgmlType::Q2K;
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for (case, &(n, k)) in [(16, 256), (32, 512), (64, 2048), (4096, 2048)].iter().enumerate() {
        let (experts, picks) = (4, [1, 2, 3, cuda_digits::MAX_PICKS][case]);
        let rb = ty.bytes_for(k as u64).unwrap() as usize;
        let mut bytes: Vec<u8> = (0..experts * n * rb).map(|_| r.range(0, 256) as u8).collect();
        for b in bytes.chunks_exact_mut(84) {
            let d = ds4_ir::quant::rt::f16::from_f32(r.uniform(0.001, 0.02) as f32).to_bits().to_le_bytes();
            let dmin = ds4_ir::quant::rt::f16::from_f32(r.uniform(0.0, 0.01) as f32).to_bits().to_le_bytes();
            b[80..82].copy_from_slice(&d);
            b[82..84].copy_from_slice(&dmin);
        }
        let mut x: Vec<f32> = Vec::with_capacity(picks * k);
        for b in 0..picks * k / 32 {
            let mag = 10f64.powf(r.uniform(-4.0, 2.0));
            for _ in 0..32 {
                x.push(if b % 5 == 2 { 0.0 } else { r.uniform(-mag, mag) as f32 });
            }
        }
        let sel: Vec<i32> = (0..picks).map(|p| if p == 1 { -1 } else { r.range(0, experts) as i32 }).collect();
        let wts: Vec<f32> = f32s(&mut r, picks, 0.1, 1.5);
        let len = picks * k;
        let (wb, xb, sb, wtb, out) = (dev.upload(&bytes).unwrap(), dev.upload(&x).unwrap(), dev.upload(&sel).unwrap(), dev.upload(&wts).unwrap(), dev.alloc(n * 4).unwrap());
        let (xd, xs, xsum) = x_digits_on(&dev, xk, xb.ptr, xb.ptr, len, None);
        // The digits of a SwiGLU made by `x_digits` from gate and up rows (`swiglu` 1): the
        // same bytes and floats as the `swiglu` op kernel's output taken apart.
        {
            let (g, up): (Vec<f32>, Vec<f32>) = (f32s(&mut r, len, -12.0, 12.0), f32s(&mut r, len, -12.0, 12.0));
            let (gb, ub, clamp) = (dev.upload(&g).unwrap(), dev.upload(&up).unwrap(), 7.0f32);
            let h = dev.alloc(len * 4).unwrap();
            let sk = ks.get("swiglu").unwrap();
            launch(&dev, &sk.func, (1, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(h.ptr), Arg::Ptr(gb.ptr), Arg::Ptr(ub.ptr), u(len), Arg::F32(clamp)]).unwrap();
            let digits = |x: u64, u_rows: u64, on: bool| {
                let (d, sc, sm) = x_digits_on(&dev, xk, x, u_rows, len, on.then_some(clamp));
                let (sc, sm): (Vec<f32>, Vec<f32>) = (sc.read(len / 32).unwrap(), sm.read(len / 16).unwrap());
                (d.read::<u8>(cuda_digits::digit_bytes(len)).unwrap(), sc.iter().chain(&sm).map(|v| v.to_bits()).collect::<Vec<u32>>())
            };
            assert!(digits(h.ptr, h.ptr, false) == digits(gb.ptr, ub.ptr, true), "x_digits of the SwiGLU of gate and up rows differ from those of the swiglu kernel's output");
        }
        // Odd cases add an addend (the shared expert's output) after the sum: the same
        // floats as the sum alone plus it, one f32 addition.
        let addend: Vec<f32> = f32s(&mut r, n, -1.0, 1.0);
        let (ab, has_addend) = (dev.upload(&addend).unwrap(), case % 2 == 1);
        let nh = 1 + r.range(0, cuda_hc_mix::MAX_NH);
        let (streams, mix) = expand_inputs(&mut r, 1, n, nh);
        let (stb, mb, eout) = (dev.upload(&streams).unwrap(), dev.upload(&mix).unwrap(), dev.alloc(nh * n * 4).unwrap());
        let run = |out: &ds4_runtime::cuda::DeviceBuf, with: bool, expand: bool| {
            let e = if expand { [Arg::Ptr(eout.ptr), Arg::Ptr(stb.ptr), Arg::Ptr(mb.ptr), u(nh)] } else { [Arg::Ptr(eout.ptr), Arg::Ptr(eout.ptr), Arg::Ptr(eout.ptr), u(0)] };
            let args = [Arg::Ptr(out.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(xd.ptr), Arg::Ptr(xs.ptr), Arg::Ptr(xsum.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(wtb.ptr), Arg::Ptr(ab.ptr), u(n), u(k), u(rb), u(picks), u(with as usize), e[0], e[1], e[2], e[3]];
            launch(&dev, &mk.func, ((n / cuda_digits::DOWN_ROWS_PER_BLOCK) as u32, 1, 1), (cuda_digits::down_threads(picks), 1, 1), 0, &args).unwrap();
            out.read::<f32>(n).unwrap()
        };
        let got = run(&out, false, false);
        if has_addend {
            let summed = run(&dev.alloc(n * 4).unwrap(), true, false);
            let same = summed.iter().zip(&got).zip(&addend).all(|((s, g), a)| s.to_bits() == (g + a).to_bits());
            assert!(same, "{}: the addend is not one f32 addition after the sum", cuda_digits::MATVEC_Q2_K);
            assert!(cuda_digits::down_expand_fits(nh));
            let expanded = run(&dev.alloc(n * 4).unwrap(), true, true);
            assert!(expanded.iter().zip(&summed).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: the expand changed the output", cuda_digits::MATVEC_Q2_K);
            assert_expand_is_the_ops(cuda_digits::MATVEC_Q2_K, &eout.read::<f32>(nh * n).unwrap(), &expanded, &streams, &mix, 1, n, nh);
        }
        let mut worst = 0f64;
        let mut wrow = vec![0f32; k];
        for row in 0..n {
            let (mut want, mut norm) = (0f64, 0f64);
            for p in (0..picks).filter(|&p| sel[p] >= 0) {
                ds4_ir::quant::dequantize_row(ty, &bytes[(sel[p] as usize * n + row) * rb..][..rb], &mut wrow).unwrap();
                for (a, b) in wrow.iter().zip(&x[p * k..(p + 1) * k]) {
                    want += wts[p] as f64 * *a as f64 * *b as f64;
                    norm += (wts[p] as f64 * *a as f64 * *b as f64).abs();
                }
            }
            worst = worst.max((got[row] as f64 - want).abs() / norm.max(1e-30));
        }
        println!("{}: {n} rows × {k}, {picks} picks: worst |Δ|/Σ|w·x| {worst:.2e}", cuda_digits::MATVEC_Q2_K);
        assert!(worst < 1e-5, "{}: off by {worst}", cuda_digits::MATVEC_Q2_K);
    }
}

/// `router_select` (a token's routing in one launch) against the four generated kernels it
/// replaces, launched one after another on the same logits and bias (`router_weights` by
/// one warp, as the runtime runs it for k ≤ 32): the same picks and the same weights, bit
/// for bit; 1 to 3 tokens, 8 to 2000 experts (up to `SELECT_MAX_N` selected by one warp:
/// 8 and 256 from keys in its registers, 300 on shared memory; 2000 sorted by the block),
/// 1 to 32 picks, normalized or not; `router_select_digits` against it and `x_digits`.
#[test]
fn router_select_matches_the_chain_it_fuses() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (fused, with_digits, x_digits) = (ks.get(cuda_router::NAME).unwrap(), ks.get(cuda_router::WITH_DIGITS).unwrap(), ks.get(cuda_digits::X_DIGITS).unwrap());
    let [scores_k, biased_k, top_k_k, weights_k] = ["router_scores", "router_biased", "top_k", "router_weights"].map(|n| ks.get(n).unwrap());
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for (case, &(n, k)) in [(8, 1), (256, 6), (300, 32), (256, 8), (2000, 8)].iter().enumerate() {
        let tokens = 1 + case % 3;
        let normalize = case % 2 == 1;
        let scale = r.uniform(0.5, 3.0) as f32;
        let logits: Vec<f32> = f32s(&mut r, tokens * n, -30.0, 30.0);
        let bias: Vec<f32> = f32s(&mut r, n, -1.0, 1.0);
        let (lb, bb) = (dev.upload(&logits).unwrap(), dev.upload(&bias).unwrap());
        // The fused launch on the logits at `logits`, or on `hc_pre`'s parts (`p`: the
        // parts, the mix, the norm's scale, nh and the mix's width; nh 0: none): its picks
        // and its weights' bits.
        let run = |logits: u64, p: [Arg; 5]| {
            let (sel, wts) = (dev.alloc(tokens * k * 4).unwrap(), dev.alloc(tokens * k * 4).unwrap());
            let args = [[Arg::Ptr(sel.ptr), Arg::Ptr(wts.ptr), Arg::Ptr(logits), Arg::Ptr(bb.ptr), u(n), u(k), Arg::F32(scale), u(normalize as usize)].as_slice(), &p].concat();
            launch(&dev, &fused.func, (tokens as u32, 1, 1), (cuda_router::threads(n), 1, 1), cuda_router::shared_bytes(n), &args).unwrap();
            (sel.read::<i32>(tokens * k).unwrap(), f32_bits(&wts, tokens * k))
        };
        let no_parts = [Arg::Ptr(lb.ptr), Arg::Ptr(lb.ptr), Arg::Ptr(lb.ptr), u(0), u(0)];
        let (got_sel, got_w) = run(lb.ptr, no_parts);
        // The four kernels.
        let (sc, bi, tk, wt) = (dev.alloc(tokens * n * 4).unwrap(), dev.alloc(tokens * n * 4).unwrap(), dev.alloc(tokens * k * 4).unwrap(), dev.alloc(tokens * k * 4).unwrap());
        let t = (tokens as u32, 1, 1);
        launch(&dev, &scores_k.func, t, (256, 1, 1), 0, &[Arg::Ptr(sc.ptr), Arg::Ptr(lb.ptr), u(n)]).unwrap();
        launch(&dev, &biased_k.func, t, (256, 1, 1), 0, &[Arg::Ptr(bi.ptr), Arg::Ptr(sc.ptr), Arg::Ptr(bb.ptr), u(n)]).unwrap();
        launch(&dev, &top_k_k.func, t, (512, 1, 1), 0, &[Arg::Ptr(tk.ptr), Arg::Ptr(bi.ptr), u(n), u(k)]).unwrap();
        launch(&dev, &weights_k.func, t, (32, 1, 1), 0, &[Arg::Ptr(wt.ptr), Arg::Ptr(sc.ptr), Arg::Ptr(tk.ptr), u(n), u(k), Arg::F32(scale), Arg::Bool(normalize)]).unwrap();
        let (want_sel, want_w): (Vec<i32>, Vec<u32>) = (tk.read(tokens * k).unwrap(), f32_bits(&wt, tokens * k));
        assert_eq!(got_sel, want_sel, "router_select picks ({tokens} tokens, {n} experts, k {k})");
        assert!(got_w == want_w, "router_select weights differ ({tokens} tokens, {n} experts, k {k}): {:?} vs {:?}", got_w.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>(), want_w.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>());
        // With x's digits in the blocks after the routing's: the same picks and weights,
        // and x_digits' planes, scales and sums, bit for bit (x of 4096 or 96 values, a
        // block of zeros and an infinity among them).
        let xlen = if case % 2 == 0 { 4096 } else { 96 };
        let mut x: Vec<f32> = f32s(&mut r, xlen, -40.0, 40.0);
        x[32..64].fill(0.0);
        x[70] = f32::INFINITY;
        let xb = dev.upload(&x).unwrap();
        let digits = alloc_digits(&dev, xlen);
        let (sel2, wts2) = (dev.alloc(tokens * k * 4).unwrap(), dev.alloc(tokens * k * 4).unwrap());
        let mut args2 = vec![Arg::Ptr(sel2.ptr), Arg::Ptr(wts2.ptr), Arg::Ptr(lb.ptr), Arg::Ptr(bb.ptr), u(n), u(k), Arg::F32(scale), u(normalize as usize)];
        args2.extend(no_parts);
        args2.extend([Arg::Ptr(digits.0.ptr), Arg::Ptr(digits.1.ptr), Arg::Ptr(digits.2.ptr), Arg::Ptr(xb.ptr), u(xlen), u(tokens)]);
        let blocks = tokens + (xlen / 32).div_ceil(cuda_router::threads(n) as usize / 32);
        launch(&dev, &with_digits.func, (blocks as u32, 1, 1), (cuda_router::threads(n), 1, 1), cuda_router::shared_bytes(n), &args2).unwrap();
        assert_eq!(sel2.read::<i32>(tokens * k).unwrap(), want_sel, "router_select_digits picks ({tokens} tokens, {n} experts, k {k})");
        assert_eq!(f32_bits(&wts2, tokens * k), want_w, "router_select_digits weights");
        assert_same_digits("router_select_digits", &digits, &x_digits_on(&dev, x_digits, xb.ptr, xb.ptr, xlen, None), xlen);
        // From `hc_pre`'s parts (nh 4 a logit, the pre weights at the head of a mix of
        // 24, the norm's scale a token): the picks and weights of the logits made from
        // them on the host in the kernel's order (fmaf from zero, then the scale).
        let (nh, mw) = (4, 24);
        let (parts, mixv, inv) = (f32s(&mut r, tokens * n * nh, -8.0, 8.0), f32s(&mut r, tokens * mw, 0.0, 2.0), f32s(&mut r, tokens, 0.5, 2.0));
        let made: Vec<f32> = (0..tokens * n).map(|te| {
            let t = te / n;
            inv[t] * (0..nh).fold(0f32, |acc, i| mixv[t * mw + i].mul_add(parts[te * nh + i], acc))
        }).collect();
        let (pb, mb, ib, mlb) = (dev.upload(&parts).unwrap(), dev.upload(&mixv).unwrap(), dev.upload(&inv).unwrap(), dev.upload(&made).unwrap());
        let from_parts = run(lb.ptr, [Arg::Ptr(pb.ptr), Arg::Ptr(mb.ptr), Arg::Ptr(ib.ptr), u(nh), u(mw)]);
        let from_logits = run(mlb.ptr, [Arg::Ptr(lb.ptr), Arg::Ptr(lb.ptr), Arg::Ptr(lb.ptr), u(0), u(0)]);
        assert_eq!(from_parts, from_logits, "router_select from parts ({tokens} tokens, {n} experts, k {k})");
        println!("router_select: {tokens} tokens, {n} experts, k {k}, normalize {normalize}: the chain's picks and weights; with x's digits ({xlen}): x_digits' too; from parts: the logits' picks and weights");
    }
}

/// `copy_spans` (the decode graphs' log copies, merged): each span's words where they
/// belong, the words around them untouched, spans of 1 to 100,000 words, 1 to all of them.
#[test]
fn copy_spans_copies_each_span() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let k = ks.get(cuda_copy::NAME).unwrap();
    let mut r = Rng(seed());
    for count in [1, 3, cuda_copy::MAX_SPANS] {
        let lens: Vec<usize> = (0..count).map(|i| [1, 37, 512, 100_000][(i + count) % 4]).collect();
        let total: usize = lens.iter().map(|n| n + 8).sum();
        let src: Vec<u32> = (0..total).map(|_| r.range(0, u32::MAX as usize) as u32).collect();
        let (sb, db) = (dev.upload(&src).unwrap(), dev.upload(&vec![7u32; total]).unwrap());
        let mut args = vec![Arg::U64(count as u64)];
        let mut at = 4;
        let mut want = vec![7u32; total];
        for i in 0..cuda_copy::MAX_SPANS {
            match lens.get(i) {
                Some(&n) => {
                    args.extend([Arg::Ptr(db.ptr + 4 * at as u64), Arg::Ptr(sb.ptr + 4 * at as u64), Arg::U64(n as u64)]);
                    want[at..at + n].copy_from_slice(&src[at..at + n]);
                    at += n + 8;
                }
                None => args.extend([Arg::U64(0), Arg::U64(0), Arg::U64(0)]),
            }
        }
        launch(&dev, &k.func, (cuda_copy::BLOCKS_A_SPAN, count as u32, 1), (cuda_copy::THREADS, 1, 1), 0, &args).unwrap();
        assert!(db.read::<u32>(total).unwrap() == want, "copy_spans: {count} spans of {lens:?} words");
        println!("copy_spans: {count} spans of {lens:?} words");
    }
}

/// `argmax_rows` (greedy decoding's pick on the device) picks what `sample::argmax` picks,
/// on the device and in mapped host memory: rows of 1 to 129,280 logits, with ties (the
/// lowest index wins), NaNs (never picked, also at index 0), ±∞ and rows of nothing above −∞.
#[test]
fn argmax_rows_picks_what_argmax_picks() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let k = ks.get(cuda_argmax::NAME).unwrap();
    let mut r = Rng(seed());
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    for n in [1usize, 2, 31, 1024, 1025, 4099, 33_333, 129_280] {
        let rows = 6;
        let mut x = f32s(&mut r, n * rows, -4.0, 4.0);
        // Row 1: a tie of the largest value, far apart; row 2: NaNs, one at 0; row 3:
        // nothing above -inf; row 4: +inf twice; row 5: small integers (many ties).
        let at = |row: usize, i: usize| row * n + i % n;
        x[at(1, n / 3)] = 9.0;
        x[at(1, n - 1)] = 9.0;
        x[at(2, 0)] = nan;
        x[at(2, n / 2)] = nan;
        x[2 * n + n / 5 + 1..3 * n].iter_mut().step_by(7).for_each(|v| *v = nan);
        x[3 * n..4 * n].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 3 == 0 { nan } else { -inf });
        x[at(4, n / 2)] = inf;
        x[at(4, n - 1)] = inf;
        x[5 * n..6 * n].iter_mut().for_each(|v| *v = v.round());
        let want: Vec<i32> = x.chunks(n).map(|row| ds4_runtime::sample::argmax(row) as i32).collect();
        let (xb, picked) = (dev.upload(&x).unwrap(), dev.upload(&vec![-1i32; rows]).unwrap());
        let host = MappedI32::new(&dev, rows).unwrap();
        let mark = Marker::new(&dev).unwrap();
        let args = [Arg::Ptr(picked.ptr), Arg::Ptr(host.ptr()), Arg::Ptr(xb.ptr), Arg::U64(n as u64)];
        launch(&dev, &k.func, (rows as u32, 1, 1), (cuda_argmax::THREADS, 1, 1), 0, &args).unwrap();
        mark.set().unwrap();
        mark.wait().unwrap();
        let on_host: Vec<i32> = (0..rows).map(|i| host.get(i)).collect();
        assert_eq!(on_host, want, "argmax_rows, rows of {n}: in host memory");
        assert_eq!(picked.read::<i32>(rows).unwrap(), want, "argmax_rows, rows of {n}: on the device");
        println!("argmax_rows: rows of {n}: {want:?}");
    }
}

/// `attention_merge_warp` against the f64 `attention_merge` whose contract it shares, and
/// bit for bit against the generated `attention_merge` (the same f32 operations in the same
/// order): 1 to 64 chunks, some that saw no row (max -inf), heads up to 600 wide (wider
/// than the block: dimensions past the first on the strided loop).
#[test]
fn attention_merge_warp_matches_attention_merge() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (warp, generic) = (ks.get(cuda_attention_merge::NAME).unwrap(), ks.get("attention_merge").unwrap());
    let k = cuda_attention_merge::contract();
    let mut r = Rng(seed());
    for (items, hd, nc) in [(1, 4, 1), (3, 17, 5), (2, 40, 8), (5, 512, 9), (3, 17, 12), (2, 600, 16), (4, 40, 17), (2, 600, 31), (64, 512, 32), (3, 64, 33), (2, 512, cuda_attention_merge::MAX_CHUNKS)] {
        assert!(cuda_attention_merge::fits(nc));
        // Chunk 0 always saw the sink (a finite max); later chunks may have seen nothing.
        let part: Vec<f64> = (0..items * nc * (hd + 2)).map(|i| if i % (hd + 2) == hd && (i / (hd + 2)) % nc != 0 && i % 3 == 0 { f64::NEG_INFINITY } else { r.uniform(0.0, 2.0) as f32 as f64 }).collect();
        let args = vec![A::F(part), A::U(hd), A::U(nc)];
        let (n, bad, worst) = run_case_on(&dev, warp, items, &k, items, &args);
        println!("attention_merge_warp: {items} items of {hd}, {nc} chunks: {n} values, {bad} mismatches, worst rel {worst:.2e}");
        assert_eq!(bad, 0, "attention_merge_warp off the f64 reference ({items} × {hd}, {nc} chunks)");
        assert!(same_bits(&dev, [warp, generic], &k, items, items * hd, &args), "attention_merge_warp differs from the generated attention_merge ({items} × {hd}, {nc} chunks)");
    }
}

/// `attention_merge_rope` (the merge and the inverse RoPE of the attention's output in one
/// launch) bit for bit against `attention_merge_warp` then the generated `rope` on its
/// output: heads of 4 to 600 with 2 to all of them rotated, 1 to 64 chunks (some that saw
/// no row), tokens at positions up to 10^5. `attention_merge_rope_early` (the chunks'
/// values loaded before the factors: register arrays of 16 and 32 for 9-16 and 17-32
/// chunks) the same, at and inside its arrays' bounds and outside its range.
#[test]
fn attention_merge_rope_matches_merge_then_rope() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (merge, rope) = (ks.get(cuda_attention_merge::NAME).unwrap(), ks.get("rope").unwrap());
    let fused_kernels = [cuda_attention_merge::ROPE_NAME, cuda_attention_merge::ROPE_EARLY_NAME].map(|n| (n, ks.get(n).unwrap()));
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let cases = [(1, 1, 4, 2, 1), (2, 3, 18, 8, 5), (2, 2, 40, 8, 8), (1, 64, 512, 64, 9), (2, 3, 600, 64, 12), (1, 5, 512, 64, 16), (2, 3, 40, 40, 17), (1, 3, 600, 64, 31), (1, 64, 512, 64, 32), (1, 2, 64, 64, 33), (3, 4, 512, 512, cuda_attention_merge::MAX_CHUNKS)];
    for ((tokens, heads, hd, n_rot, nc), (name, fused)) in cases.into_iter().flat_map(|c| fused_kernels.map(|f| (c, f))) {
        let items = tokens * heads;
        let part: Vec<f32> = (0..items * nc * (hd + 2)).map(|i| if i % (hd + 2) == hd && (i / (hd + 2)) % nc != 0 && i % 3 == 0 { f32::NEG_INFINITY } else { r.uniform(0.0, 2.0) as f32 }).collect();
        let freq: Vec<f32> = f32s(&mut r, n_rot / 2, 1e-4, 1.0);
        let (pb, fb) = (dev.upload(&part).unwrap(), dev.upload(&freq).unwrap());
        let (pos_base, sign) = (r.range(0, 100000), -1.0f32);
        // The merge, then the RoPE.
        let merged = dev.alloc(items * hd * 4).unwrap();
        launch(&dev, &merge.func, (items as u32, 1, 1), (cuda_attention_merge::THREADS, 1, 1), 0, &[Arg::Ptr(merged.ptr), Arg::Ptr(pb.ptr), u(hd), u(nc)]).unwrap();
        let want = dev.alloc(items * hd * 4).unwrap();
        launch(&dev, &rope.func, (items as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(want.ptr), Arg::Ptr(merged.ptr), Arg::Ptr(fb.ptr), u(heads), u(hd), u(n_rot), u(pos_base), u(1), Arg::F32(sign)]).unwrap();
        // The fused launch.
        let got = dev.alloc(items * hd * 4).unwrap();
        let args = [Arg::Ptr(got.ptr), Arg::Ptr(pb.ptr), Arg::Ptr(fb.ptr), u(hd), u(nc), u(heads), u(n_rot), u(pos_base), u(1), Arg::F32(sign)];
        launch(&dev, &fused.func, (items as u32, 1, 1), (cuda_attention_merge::THREADS, 1, 1), cuda_attention_merge::rope_shared_bytes(hd), &args).unwrap();
        let (got, want): (Vec<f32>, Vec<f32>) = (got.read(items * hd).unwrap(), want.read(items * hd).unwrap());
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        println!("{name}: {tokens} tokens × {heads} heads of {hd} ({n_rot} rotated), {nc} chunks: {differ} of {} values differ", got.len());
        assert_eq!(differ, 0, "{name} differs from the merge then the RoPE ({tokens} × {heads} × {hd}, n_rot {n_rot}, {nc} chunks)");
    }
}

/// `top_k_sort` (a block sorts its row) and `top_k_radix` (a radix selection, then a sort
/// of the picks) against the reference `top_k` (the Rust body the IR kernel is made from):
/// the same picks, in the same order (`top_k_rows`: in row order), on rows with ties, -inf, NaN and both zeros, from 1
/// to `MAX_N` scores (the router's 6 of 256, the indexer's 512 of 2048) and, for the radix
/// selection, past it (the indexer's rows at ctx 160K), k below and above n, several rows
/// a launch. Then both kernels' times on rows of uniform scores, k = 512.
#[test]
fn top_k_kernels_pick_what_top_k_picks() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let (sort, radix, rows) = (ks.get(cuda_top_k::NAME).unwrap(), ks.get(cuda_top_k_radix::NAME).unwrap(), ks.get(cuda_top_k_radix::ROWS_NAME).unwrap());
    let mut r = Rng(seed());
    let sizes = [1, 2, 5, 31, 256, 300, 1000, 2048, 5000, cuda_top_k::MAX_N, 40_000];
    for (case, &n) in sizes.iter().enumerate() {
        let items = 1 + case % 3;
        for k in [1, 6, 512, n, n + 3].into_iter().filter(|&k| cuda_top_k::fits(n) || cuda_top_k_radix::fits(k)) {
            // Few distinct values (ties), some -inf, NaN, -0.0 and +0.0.
            let scores: Vec<f32> = (0..items * n)
                .map(|_| match r.range(0, 12) {
                    0 => f32::NEG_INFINITY,
                    1 => f32::NAN,
                    2 => -0.0,
                    3 => 0.0,
                    4 => r.range(0, 4) as f32 - 2.0,
                    _ => r.uniform(-3.0, 3.0) as f32,
                })
                .collect();
            let mut want = vec![0i32; items * k];
            for it in 0..items {
                ds4_ir::kernels::compress::top_k(it, &mut want[it * k..(it + 1) * k], &scores, n, k);
            }
            let (s_buf, out) = (dev.upload(&scores).unwrap(), dev.alloc(items * k * 4).unwrap());
            let args = [Arg::Ptr(out.ptr), Arg::Ptr(s_buf.ptr), Arg::U64(n as u64), Arg::U64(k as u64)];
            if cuda_top_k::fits(n) {
                launch(&dev, &sort.func, (items as u32, 1, 1), (cuda_top_k::threads(n), 1, 1), cuda_top_k::shared_bytes(n), &args).unwrap();
                let got: Vec<i32> = out.read(items * k).unwrap();
                assert_eq!(got, want, "top_k_sort: {items} rows of {n}, k {k}");
            }
            if cuda_top_k_radix::fits(k) {
                let out2 = dev.alloc(items * k * 4).unwrap();
                let args = [Arg::Ptr(out2.ptr), Arg::Ptr(s_buf.ptr), Arg::U64(n as u64), Arg::U64(k as u64)];
                launch(&dev, &radix.func, (items as u32, 1, 1), (cuda_top_k_radix::THREADS, 1, 1), cuda_top_k_radix::shared_bytes(n, k), &args).unwrap();
                let got: Vec<i32> = out2.read(items * k).unwrap();
                assert_eq!(got, want, "top_k_radix: {items} rows of {n}, k {k}");
                // top_k_rows: the same picks in row order, then the same -1s.
                launch(&dev, &rows.func, (items as u32, 1, 1), (cuda_top_k_radix::THREADS, 1, 1), 0, &args).unwrap();
                let got: Vec<i32> = out2.read(items * k).unwrap();
                for it in 0..items {
                    let mut w = want[it * k..(it + 1) * k].to_vec();
                    let picks = w.iter().take_while(|&&p| p >= 0).count();
                    w[..picks].sort_unstable();
                    assert_eq!(got[it * k..(it + 1) * k], w[..], "top_k_rows: row {it} of {items}, {n} scores, k {k}");
                }
            }
        }
        println!("top_k_sort, top_k_radix, top_k_rows: {items} rows of {n} scores: the reference's picks");
    }
    // Times (µs a launch of one row, the best of 20) of both on the indexer's rows.
    for n in [528usize, 1024, 2048, 4096, 8192, cuda_top_k::MAX_N, 65_536] {
        let k = 512;
        let scores = f32s(&mut r, n, -3.0, 3.0);
        let (s_buf, out) = (dev.upload(&scores).unwrap(), dev.alloc(k * 4).unwrap());
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(s_buf.ptr), Arg::U64(n as u64), Arg::U64(k as u64)];
        let time = |f: &dyn Fn()| best_time(&dev, 20, f) * 1e6;
        let t_sort = if cuda_top_k::fits(n) { time(&|| launch(&dev, &sort.func, (1, 1, 1), (cuda_top_k::threads(n), 1, 1), cuda_top_k::shared_bytes(n), &args).unwrap()) } else { f64::NAN };
        let t_radix = time(&|| launch(&dev, &radix.func, (1, 1, 1), (cuda_top_k_radix::THREADS, 1, 1), cuda_top_k_radix::shared_bytes(n, k), &args).unwrap());
        let t_rows = time(&|| launch(&dev, &rows.func, (1, 1, 1), (cuda_top_k_radix::THREADS, 1, 1), 0, &args).unwrap());
        println!("top_k of {k} from {n} uniform scores: top_k_sort {t_sort:.1} µs, top_k_radix {t_radix:.1} µs, top_k_rows {t_rows:.1} µs (host-timed, a launch each)");
    }
}

/// `indexer_scores_vec` (a decode token's indexer scores in one launch) against the CPU's
/// f32 `indexer_head_dots` then `indexer_combine`, bit for bit: 1 to `MAX_TOKENS` tokens,
/// the model's 64 heads of 128 and odd sizes, rows the first tokens may not see yet (-inf),
/// a tile's rows cut short. Then its time at the indexer's rows of ctx 8K to 256K.
#[test]
fn indexer_scores_vec_is_the_cpus_floats() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let k = ks.get(cuda_indexer_scores::NAME).unwrap();
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let sms = 132;
    for (case, (heads, dk)) in [(64, 128), (64, 128), (7, 4), (3, 36), (128, 64), (64, 128), (64, 128)].into_iter().enumerate() {
        let tokens = r.range(1, cuda_indexer_scores::MAX_TOKENS + 1);
        let (n_rows, ratio) = (r.range(1, 3000), 4);
        // The last token sees every row but up to 39, the earlier ones one fewer at most.
        let pos0 = ratio * n_rows - tokens - ratio * r.range(0, n_rows.min(40));
        let (q, w, rows) = (f32s(&mut r, tokens * heads * dk, -1.0, 1.0), f32s(&mut r, tokens * heads, -1.0, 1.0), f32s(&mut r, n_rows * dk, -1.0, 1.0));
        let mut dots = vec![0f32; tokens * heads * n_rows];
        for item in 0..tokens * heads {
            ds4_ir::kernels::compress::indexer_head_dots::<f32>(item, &mut dots[item * n_rows..][..n_rows], &q, &rows, n_rows, heads, dk, pos0, ratio);
        }
        let mut want = vec![0f32; tokens * n_rows];
        for t in 0..tokens {
            ds4_ir::kernels::compress::indexer_combine::<f32>(t, &mut want[t * n_rows..][..n_rows], &dots, &w, n_rows, heads, dk, pos0, ratio);
        }
        let (qb, wb, rb, out) = (dev.upload(&q).unwrap(), dev.upload(&w).unwrap(), dev.upload(&rows).unwrap(), dev.alloc(tokens * n_rows * 4).unwrap());
        assert!(cuda_indexer_scores::fits(tokens, heads, dk, n_rows));
        // Every tile size (any serves any row count), and the one the runtime picks.
        let tile = [4, 8, 16, 32].get(case).copied().unwrap_or_else(|| cuda_indexer_scores::tile_rows(n_rows, sms));
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(qb.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(rb.ptr), u(n_rows), u(heads), u(dk), u(pos0), u(ratio), u(tile)];
        let grid = (cuda_indexer_scores::blocks(n_rows, tile, sms), tokens as u32, 1);
        launch(&dev, &k.func, grid, (cuda_indexer_scores::threads(heads), 1, 1), cuda_indexer_scores::shared_bytes(heads, dk), &args).unwrap();
        let got: Vec<f32> = out.read(tokens * n_rows).unwrap();
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let hidden = want.iter().filter(|v| **v == f32::NEG_INFINITY).count();
        println!("indexer_scores_vec: {tokens} tokens × {heads} heads of {dk}, {n_rows} rows in tiles of {tile} ({hidden} scores not visible): {differ} differ");
        assert_eq!(differ, 0, "indexer_scores_vec off the CPU's floats ({tokens} × {heads} × {dk}, {n_rows} rows)");
    }
    // Time (µs a launch, host-timed, the best of 20) at the indexer's shapes.
    let (heads, dk) = (64, 128);
    for n_rows in [513usize, 2048, 8192, 16384, 65536] {
        let (q, w, rows) = (f32s(&mut r, heads * dk, -1.0, 1.0), f32s(&mut r, heads, -1.0, 1.0), f32s(&mut r, n_rows * dk, -1.0, 1.0));
        let (qb, wb, rb, out) = (dev.upload(&q).unwrap(), dev.upload(&w).unwrap(), dev.upload(&rows).unwrap(), dev.alloc(n_rows * 4).unwrap());
        let tile = cuda_indexer_scores::tile_rows(n_rows, sms);
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(qb.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(rb.ptr), u(n_rows), u(heads), u(dk), u(4 * n_rows - 1), u(4), u(tile)];
        let best = 1e6 * best_time(&dev, 20, || launch(&dev, &k.func, (cuda_indexer_scores::blocks(n_rows, tile, sms), 1, 1), (cuda_indexer_scores::threads(heads), 1, 1), cuda_indexer_scores::shared_bytes(heads, dk), &args).unwrap());
        println!("indexer_scores_vec: 64 heads of 128 against {n_rows} rows, tiles of {tile}: {best:.1} µs (host-timed, a launch)");
    }
}

/// `hc_pre` (a decode token's norm, projection, mix, collapse and the collapse's weighted
/// norm in one launch) against the kernels it replaces, launched one after another on the
/// same inputs: the mix, the collapse (where the launch writes it) and its norm agree to
/// 2e-5 of their largest value (the norm's and the projection's sums are added in other
/// orders, the projection scaled once), for 1 to `MAX_TOKENS` tokens, streams of
/// DeepSeek-V4-Flash's 4096 values (the collapse from registers) and of other lengths; its
/// ticket counters return to zero, so a second launch gives the same floats bit for bit,
/// and so does a launch that leaves the Sinkhorn to `hc_comb`. With a router part
/// (`cuda_hc_pre::router_blocks`), the logits added from its parts are the router's mat-vec
/// of the collapse's norm to 1e-5 of Σ|w·a|, and the mix, collapse and norm are the same
/// floats as without it. From streams with a shared expert's share pending (`pending`), the
/// same floats as from the streams with it added, and those streams written whole, bit for
/// bit.
#[test]
fn hc_pre_matches_the_chain_it_fuses() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    let counters = dev.upload(&[0i32; cuda_hc_pre::COUNTERS]).unwrap();
    for case in 0..6 {
        let nh = if case == 5 { 5 } else { 4 };
        // Cases 0 and 1 at DeepSeek-V4-Flash's 4096 values a stream: a float4 of each
        // stream a thread, its collapse from the registers of its sums' loads.
        let d = if case < 2 { 4096 } else { 4 * r.range(16, 1025) };
        let (tokens, iters) = (r.range(1, cuda_hc_pre::MAX_TOKENS + 1), r.range(1, 21));
        let (n, mw) = (nh * d, 2 * nh + nh * nh);
        let (xp, wf, scale, base) = (f32s(&mut r, tokens * n, -3.0, 3.0), f32s(&mut r, mw * n, -0.05, 0.05), f32s(&mut r, 3, 0.5, 2.0), f32s(&mut r, mw, -1.0, 1.0));
        // The streams are an expand's with a shared expert's y `sy` left out (`pending`),
        // scaled by the post weights of mix `smix`: the reference's x has it added as the
        // kernel adds it (one fused multiply-add).
        let (sy, smix) = (f32s(&mut r, tokens * d, -2.0, 2.0), f32s(&mut r, tokens * mw, 0.0, 2.0));
        let x: Vec<f32> = (0..tokens * n).map(|i| smix[(i / n) * mw + nh + (i % n) / d].mul_add(sy[(i / n) * d + i % d], xp[i])).collect();
        let (xpb, syb, smixb) = (dev.upload(&xp).unwrap(), dev.upload(&sy).unwrap(), dev.upload(&smix).unwrap());
        let mut w = vec![0u8; mw * n * 2];
        ds4_ir::quant::quantize_row(ds4_ir::GgmlType::F16, &wf, &mut w).unwrap();
        let (xb, wb, sb, bb) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap(), dev.upload(&scale).unwrap(), dev.upload(&base).unwrap());
        let (eps_norm, eps_mix) = (1e-6f32, 1e-6f32);
        // The four kernels.
        let normed = dev.alloc(tokens * n * 4).unwrap();
        let k = ks.get("rms_norm_plain").unwrap();
        launch(&dev, &k.func, (tokens as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(normed.ptr), Arg::Ptr(xb.ptr), u(n), Arg::F32(eps_norm)]).unwrap();
        let m = dev.alloc(tokens * mw * 4).unwrap();
        let k = ks.get(&kernel_name(QuantKernelKind::MatVec, ds4_ir::GgmlType::F16)).unwrap();
        let mv = [Arg::Ptr(m.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(normed.ptr), Arg::Ptr(counters.ptr), Arg::Ptr(counters.ptr), u(mw), u(n), u(2 * n), u(1), u(1), u(1), u(mw), u(0), u(0), u(mw)];
        launch(&dev, &k.func, (mw as u32, tokens as u32, 1), (k.threads, 1, 1), k.dyn_shared, &mv).unwrap();
        let mix_ref = dev.alloc(tokens * mw * 4).unwrap();
        let k = ks.get(cuda_hc_mix::NAME).unwrap();
        launch(&dev, &k.func, (tokens as u32, 1, 1), (k.threads, 1, 1), 0, &[Arg::Ptr(mix_ref.ptr), Arg::Ptr(m.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(bb.ptr), u(nh), u(iters), Arg::F32(eps_mix)]).unwrap();
        let y_ref = dev.alloc(tokens * d * 4).unwrap();
        let k = ks.get("hc_collapse").unwrap();
        launch(&dev, &k.func, (tokens as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(y_ref.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(mix_ref.ptr), u(nh), u(d), u(mw)]).unwrap();
        // The sublayer's weighted norm of the collapse, fused in even cases.
        let has_norm = case % 2 == 0;
        let (gain, eps_a) = (f32s(&mut r, d, 0.5, 1.5), 1e-6f32);
        let gb = dev.upload(&gain).unwrap();
        let a_ref = dev.alloc(tokens * d * 4).unwrap();
        let k = ks.get("rms_norm").unwrap();
        launch(&dev, &k.func, (tokens as u32, 1, 1), (256, 1, 1), 0, &[Arg::Ptr(a_ref.ptr), Arg::Ptr(y_ref.ptr), Arg::Ptr(gb.ptr), u(d), Arg::F32(eps_a)]).unwrap();
        let (want_mix, want_y, want_a) = (mix_ref.read::<f32>(tokens * mw).unwrap(), y_ref.read::<f32>(tokens * d).unwrap(), a_ref.read::<f32>(tokens * d).unwrap());
        // The fused kernel, twice; a third time with the Sinkhorn left to `hc_comb`.
        let k = ks.get(cuda_hc_pre::NAME).unwrap();
        // A router's mat-vec of the normed collapse as parts, in blocks after the mix's
        // (all cases but 1 and 3; rows not a multiple of the blocks' in case 4).
        let r_rows = [256, 0, 64, 0, 13, 40][case];
        let rwf = f32s(&mut r, r_rows * d, -0.5, 0.5);
        let mut rw = vec![0u8; r_rows * d * 2];
        ds4_ir::quant::quantize_row(ds4_ir::GgmlType::F16, &rwf, &mut rw).unwrap();
        let rwb = dev.upload(&rw).unwrap();
        let mut rwf16 = vec![0f32; r_rows * d];
        ds4_ir::quant::dequantize_row(ds4_ir::GgmlType::F16, &rw, &mut rwf16).unwrap();
        let (rparts, ainv) = (dev.alloc((tokens * r_rows * nh * 4).max(4)).unwrap(), dev.alloc(tokens * 4).unwrap());
        let mut runs = Vec::new();
        // Runs 0 and 1 alike, 2 with `hc_comb`, 3 from the streams with the share pending.
        let xo = dev.upload(&vec![f32::NAN; tokens * n]).unwrap();
        for run in 0..4 {
            let (mix, y, a, proj) = (dev.upload(&vec![f32::NAN; tokens * mw]).unwrap(), dev.alloc(tokens * d * 4).unwrap(), dev.alloc(tokens * d * 4).unwrap(), dev.alloc(tokens * mw * 4).unwrap());
            let (comb, pending) = (run != 2, run == 3);
            let rr = if run == 0 || run == 3 { r_rows } else { 0 };
            let args = [
                Arg::Ptr(mix.ptr), Arg::Ptr(y.ptr), Arg::Ptr(a.ptr), Arg::Ptr(proj.ptr), Arg::Ptr(counters.ptr), Arg::Ptr(if pending { xpb.ptr } else { xb.ptr }), Arg::Ptr(wb.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(bb.ptr), Arg::Ptr(gb.ptr),
                u(nh), u(d), u(iters), Arg::F32(eps_norm), Arg::F32(eps_mix), u(has_norm as usize), Arg::F32(eps_a), u(comb as usize),
                Arg::Ptr(rwb.ptr), Arg::Ptr(rparts.ptr), Arg::Ptr(ainv.ptr), u(rr),
                Arg::Ptr(syb.ptr), Arg::Ptr(smixb.ptr), Arg::Ptr(xo.ptr), u(pending as usize),
            ];
            launch(&dev, &k.func, ((mw + cuda_hc_pre::router_blocks(rr)) as u32, tokens as u32, 1), (k.threads, 1, 1), 0, &args).unwrap();
            if rr != 0 {
                // The logits from the parts as `router_select` adds them, against the f64
                // product of the router's rows and the collapse's norm (the four kernels').
                let (parts, inv, mixv) = (rparts.read::<f32>(tokens * rr * nh).unwrap(), ainv.read::<f32>(tokens).unwrap(), mix.read::<f32>(tokens * mw).unwrap());
                let a_in = if has_norm { &want_a } else { &want_y };
                let mut worst = 0f64;
                for t in 0..tokens {
                    for j in 0..rr {
                        let mut acc = 0f32;
                        for i in 0..nh {
                            acc = mixv[t * mw + i].mul_add(parts[(t * rr + j) * nh + i], acc);
                        }
                        let got = (inv[t] * acc) as f64;
                        let wrow = &rwf16[j * d..(j + 1) * d];
                        let want: f64 = wrow.iter().zip(&a_in[t * d..(t + 1) * d]).map(|(w, v)| *w as f64 * *v as f64).sum();
                        let scale: f64 = wrow.iter().zip(&a_in[t * d..(t + 1) * d]).map(|(w, v)| (*w as f64 * *v as f64).abs()).sum();
                        worst = worst.max((got - want).abs() / scale.max(f64::MIN_POSITIVE));
                    }
                }
                println!("hc_pre router part: {rr} rows, nh {nh}, d {d}, {tokens} tokens: logits within {worst:.2e} of Σ|w·a|");
                assert!(worst <= 1e-5, "hc_pre's router part off the router's mat-vec: {worst:e}");
            }
            if !comb {
                let kc = ks.get(cuda_hc_pre::HC_COMB).unwrap();
                let args = [Arg::Ptr(mix.ptr), Arg::Ptr(proj.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(bb.ptr), u(nh), u(iters), Arg::F32(eps_mix)];
                launch(&dev, &kc.func, (tokens as u32, 1, 1), (32, 1, 1), 0, &args).unwrap();
            }
            runs.push((mix.read::<f32>(tokens * mw).unwrap(), y.read::<f32>(tokens * d).unwrap(), a.read::<f32>(tokens * d).unwrap()));
        }
        let worst = |got: &[f32], want: &[f32]| {
            let top = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(f32::MIN_POSITIVE) as f64;
            got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).abs() / top).fold(0f64, f64::max)
        };
        // The collapse is not written where the launch norms it from registers (its norm
        // its only reader: `cuda_hc_pre::params`).
        let y_written = !(has_norm && cuda_hc_pre::held(nh, d));
        let (wm, wy) = (worst(&runs[0].0, &want_mix), if y_written { worst(&runs[0].1, &want_y) } else { 0.0 });
        let wa = if has_norm { worst(&runs[0].2, &want_a) } else { 0.0 };
        println!("hc_pre nh {nh}, d {d}, {tokens} tokens, {iters} iterations: mix {wm:.2e}, collapse {wy:.2e}, its norm {wa:.2e} of the largest value from the kernels it fuses{}", if has_norm { "" } else { " (no norm)" });
        assert!(wm <= 2e-5 && wy <= 2e-5 && wa <= 2e-5, "hc_pre off the kernels it fuses: mix {wm:e}, collapse {wy:e}, norm {wa:e}");
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same(&runs[0].0, &runs[1].0) && (!y_written || same(&runs[0].1, &runs[1].1)) && (!has_norm || same(&runs[0].2, &runs[1].2)), "hc_pre's second launch differs: its counters did not return to zero");
        assert!(same(&runs[0].0, &runs[2].0) && (!y_written || same(&runs[0].1, &runs[2].1)) && (!has_norm || same(&runs[0].2, &runs[2].2)), "hc_pre with hc_comb is not hc_pre's floats");
        assert!(same(&runs[0].0, &runs[3].0) && (!y_written || same(&runs[0].1, &runs[3].1)) && (!has_norm || same(&runs[0].2, &runs[3].2)), "hc_pre with the share pending is not hc_pre's floats on the streams with it added");
        assert!(same(&xo.read::<f32>(tokens * n).unwrap(), &x), "hc_pre's streams made whole are not the streams with the share added");
    }
}

/// One CSA layer of a 2048-token prefill at full size (64 heads of 512; per token up to
/// 128 window rows and the indexer's 512 picks, -1 past the (t + 1) / 4 rows that exist):
/// the time of attention_tiled and of the generated attention_partial (nc = 1, as the
/// runtime launches both at this size), and how far apart their results are.
#[test]
fn attention_tiled_time_at_full_size_prefill() {
    let Some(dev) = device() else { return };
    let set = KernelSet { ops: [("attention_partial".to_string(), Default::default())].into(), cuda: [(cuda_attention::NAME, Default::default())].into(), ..Default::default() };
    let ks = Kernels::compile(&dev, &set).expect("attention kernels compile with NVRTC");
    let (t, heads, hd, window, n_comp, k_sel) = (2048usize, 64usize, 512usize, 128usize, 512usize, 512usize);
    let mut r = Rng(seed());
    let (q, win, comp, sinks) = (f32s(&mut r, t * heads * hd, -1.0, 1.0), f32s(&mut r, t * hd, -1.0, 1.0), f32s(&mut r, n_comp * hd, -1.0, 1.0), f32s(&mut r, heads, -1.0, 1.0));
    let sel: Vec<i32> = (0..t * k_sel).map(|i| if i % k_sel < (i / k_sel + 1) / 4 { r.range(0, (i / k_sel + 1) / 4) as i32 } else { -1 }).collect();
    let (qb, wb, cb, sb, selb) = (dev.upload(&q).unwrap(), dev.upload(&win).unwrap(), dev.upload(&comp).unwrap(), dev.upload(&sinks).unwrap(), dev.upload(&sel).unwrap());
    let rows: usize = (0..t).map(|p| (p + 1).min(window) + ((p + 1) / 4).min(k_sel)).sum();
    let flops = (rows * heads * 4 * hd) as f64;
    let u = |v: usize| Arg::U64(v as u64);
    let mut results = Vec::new();
    for (name, blocks) in [(cuda_attention::NAME, cuda_attention::blocks(t, heads, 1)), ("attention_partial", t * heads)] {
        let k = ks.get(name).unwrap();
        let out = dev.alloc(t * heads * (hd + 2) * 4).unwrap();
        let scale = Arg::F32(1.0 / (hd as f32).sqrt());
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(qb.ptr), Arg::Ptr(wb.ptr), Arg::Ptr(cb.ptr), Arg::Ptr(selb.ptr), Arg::Ptr(sb.ptr), u(heads), u(hd), u(0), u(0), u(t), u(window), u(n_comp), u(2), u(4), u(k_sel), scale, u(1)];
        let best = best_time(&dev, 3, || launch(&dev, &k.func, (blocks as u32, 1, 1), (k.threads, 1, 1), k.dyn_shared, &args).unwrap());
        println!("{name:<18} {:>9.3} ms  {:>6.2} TFLOP/s ({rows} rows × {heads} heads × {hd})", best * 1e3, flops / best / 1e12);
        results.push(out.read::<f32>(t * heads * (hd + 2)).unwrap());
    }
    let scale = results[1].iter().filter(|v| v.is_finite()).fold(0f64, |m, &v| m.max(v.abs() as f64));
    let worst = results[0].iter().zip(&results[1]).filter(|(_, w)| w.is_finite()).map(|(&g, &w)| (g as f64 - w as f64).abs() / (w.abs() as f64).max(1e-3 * scale)).fold(0f64, f64::max);
    println!("attention_tiled vs attention_partial: worst relative difference {worst:.2e}");
    assert!(worst < 1e-3, "the two attention kernels disagree at full size: {worst:.2e}");
}

#[test]
fn every_quant_kernel_matches_the_cpu_code_of_its_spec() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let mut r = Rng(seed());
    println!("quant kernel parity on {}:", dev.name);
    for &t in ds4_ir::quant::supported() {
        if !ds4_ir::quant::can_quantize(t) {
            println!("{t}: no quantizer, skipped");
            continue;
        }
        let (rows, m) = (r.range(1, 100), r.range(1, 4));
        let k = t.block_elems() * r.range(1, 5);
        let q = QuantRows::random(t, rows, k, &mut r);
        let rb = q.row_bytes;
        let w = dev.upload(&q.bytes).unwrap();
        // dequant_rows: rows in reverse order, bit-exact.
        let ids: Vec<i32> = (0..rows as i32).rev().collect();
        let idb = dev.upload(&ids).unwrap();
        let out = dev.alloc(rows * k * 4).unwrap();
        let dq = ks.get(&kernel_name(QuantKernelKind::DequantRows, t)).unwrap();
        launch(&dev, &dq.func, (rows as u32, 1, 1), (dq.threads, 1, 1), dq.dyn_shared, &[Arg::Ptr(out.ptr), Arg::Ptr(w.ptr), Arg::Ptr(idb.ptr), Arg::U64(k as u64), Arg::U64(rb as u64)]).unwrap();
        let gpu: Vec<f32> = out.read(rows * k).unwrap();
        let mut exact = true;
        for (j, &row) in ids.iter().enumerate() {
            exact &= gpu[j * k..(j + 1) * k].iter().zip(&q.rows[row as usize]).all(|(a, b)| a.to_bits() == b.to_bits());
        }
        // matvec: m tokens against every row.
        let x = f32s(&mut r, m * k, -1.0, 1.0);
        let xb = dev.upload(&x).unwrap();
        let mv_out = dev.alloc(m * rows * 4).unwrap();
        let mv = ks.get(&kernel_name(QuantKernelKind::MatVec, t)).unwrap();
        let u = |v: usize| Arg::U64(v as u64);
        // Fewer row blocks than rows: each block loops over rows (as with staged tables).
        let row_blocks = r.range(1, rows + 1);
        let args = [Arg::Ptr(mv_out.ptr), Arg::Ptr(w.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(idb.ptr), Arg::Ptr(xb.ptr), u(rows), u(k), u(rb), u(1), u(1), u(1), u(rows), u(0), u(0), u(row_blocks)];
        launch(&dev, &mv.func, (row_blocks as u32, m as u32, 1), (mv.threads, 1, 1), mv.dyn_shared, &args).unwrap();
        let got: Vec<f32> = mv_out.read(m * rows).unwrap();
        // |got − W[row]·xs| / Σ|W[row]·xs|, the f64 dot of the de-quantized row as reference.
        let rel = |got: f32, row: usize, xs: &[f32]| q.error(got, row, xs);
        let mut worst = 0f64;
        for ti in 0..m {
            for j in 0..rows {
                worst = worst.max(rel(got[ti * rows + j], j, &x[ti * k..(ti + 1) * k]));
            }
        }
        // The two prefill matmuls: SIMT (TOKENS tokens per block) and tensor cores
        // (MMA_ROWS × MMA_TOKENS tiles; used only where a tile stays in one row group).
        let m2 = r.range(2, 80);
        let x2 = f32s(&mut r, m2 * 2 * k, -1.0, 1.0);
        let x2b = dev.upload(&x2).unwrap();
        let (mut worst_mm, mut worst_listed, mut max_slices) = ([0f64; 2], 0f64, 1usize);
        for kind in [QuantKernelKind::MatMul, QuantKernelKind::MatMulMma] {
            let mma = kind == QuantKernelKind::MatMulMma;
            let (tile, blocks_x) = if mma { (ds4_runtime::cuda::MMA_TOKENS, rows.div_ceil(ds4_runtime::cuda::MMA_ROWS)) } else { (ds4_runtime::cuda::MATMUL_TOKENS as usize, rows) };
            let mm = ks.get(&kernel_name(kind, t)).unwrap();
            // m2 tokens (not a multiple of the tile); rows in two groups when they split
            // evenly (grouped matmul: group g reads x's g-th slice), SIMT only.
            let groups = if rows % 2 == 0 && !mma { 2 } else { 1 };
            // The tensor-core kernel split over k into its smallest slices (each its own
            // output copy), added here in order as the runtime adds them.
            let (k_slice, slices) = if mma {
                let unit = ds4_runtime::cuda::mma_k_unit(ds4_ir::quant::spec(t).unwrap()) as usize;
                (unit, k.div_ceil(unit))
            } else {
                (k, 1)
            };
            let mm_out = dev.alloc(slices * m2 * rows * 4).unwrap();
            let mut args = vec![Arg::Ptr(mm_out.ptr), Arg::Ptr(w.ptr), Arg::Ptr(x2b.ptr), Arg::Ptr(idb.ptr), Arg::Ptr(idb.ptr), u(rows), u(k), u(rb), u(m2), u(groups), u(rows / groups), u(1), u(0)];
            if mma {
                args.extend([u(k_slice), u(m2 * rows)]);
            }
            // Kept until the results are read (the matmul reads them on the stream).
            let (parts_args, _parts) = if mma { x_parts_args(&dev, ks, mm, x2b.ptr, x_parts::x_len(m2, k, groups, 1), idb.ptr) } else { (Vec::new(), None) };
            if mma {
                args.extend(parts_args);
            }
            launch(&dev, &mm.func, (blocks_x as u32, m2.div_ceil(tile) as u32, slices as u32), (mm.threads, 1, 1), mm.dyn_shared, &args).unwrap();
            let parts: Vec<f32> = mm_out.read(slices * m2 * rows).unwrap();
            let got2: Vec<f32> = (0..m2 * rows).map(|i| (1..slices).fold(parts[i], |acc, z| acc + parts[z * m2 * rows + i])).collect();
            if mma {
                max_slices = max_slices.max(slices);
            }
            for ti in 0..m2 {
                for j in 0..rows {
                    let xo = (ti * groups + j / (rows / groups)) * k;
                    worst_mm[mma as usize] = worst_mm[mma as usize].max(rel(got2[ti * rows + j], j, &x2[xo..xo + k]));
                }
            }
            // Over listed rows (the routed experts grouped by expert): the matrix as `ne`
            // experts of rows / ne rows, row p of x belongs to expert p % ne.
            let ne = if rows % 2 == 0 { 2 } else { 1 };
            let per = rows / ne;
            let sel: Vec<i32> = (0..m2).map(|p| (p % ne) as i32).collect();
            let (idx, gexp) = ds4_runtime::cuda::expert_groups(&sel, ne, tile);
            let (idxb, gexpb) = (dev.upload(&idx).unwrap(), dev.upload(&gexp).unwrap());
            let ml_out = dev.alloc(m2 * per * 4).unwrap();
            let mut args = vec![Arg::Ptr(ml_out.ptr), Arg::Ptr(w.ptr), Arg::Ptr(x2b.ptr), Arg::Ptr(idxb.ptr), Arg::Ptr(gexpb.ptr), u(per), u(k), u(rb), u(m2), u(1), u(per), u(1), u(1)];
            if mma {
                args.extend([u(k), u(0)]);
            }
            let (parts_args, _parts) = if mma { x_parts_args(&dev, ks, mm, x2b.ptr, x_parts::x_len(m2, k, 1, 1), idb.ptr) } else { (Vec::new(), None) };
            if mma {
                args.extend(parts_args);
            }
            let bx = if mma { per.div_ceil(ds4_runtime::cuda::MMA_ROWS) } else { per };
            launch(&dev, &mm.func, (bx as u32, gexp.len() as u32, 1), (mm.threads, 1, 1), mm.dyn_shared, &args).unwrap();
            let got3: Vec<f32> = ml_out.read(m2 * per).unwrap();
            for p in 0..m2 {
                for j in 0..per {
                    worst_listed = worst_listed.max(rel(got3[p * per + j], sel[p] as usize * per + j, &x2[p * k..(p + 1) * k]));
                }
            }
        }
        let groups = if rows % 2 == 0 { 2 } else { 1 };
        let ne = groups;
        println!("{t}: dequant_rows bit-exact {exact}; matvec worst |Δ|/Σ|w·x| {worst:.2e} ({rows} rows × {k}, {m} tokens); matmul {:.2e}, matmul_mma {:.2e} ({m2} tokens, {groups} groups, {max_slices} k-slices), by expert {worst_listed:.2e} ({ne} experts)", worst_mm[0], worst_mm[1]);
        assert!(worst_listed < 1e-5, "{t}: expert-grouped matmul off by {worst_listed}");
        assert!(worst_mm[0] < 1e-5 && worst_mm[1] < 1e-5, "{t}: matmul off by {worst_mm:?} (SIMT, tensor cores)");
        assert!(exact, "{t}: GPU de-quantization differs from the CPU's");
        assert!(worst < 1e-5, "{t}: matvec off by {worst}");
    }
}

/// The mat-vec's pipelined paths (rows 16-byte aligned, several shared-memory chunks per
/// row; a warp's group of rows sharing x, or a block sharing a row) and its gathered form
/// (the routed experts at decode: `picks` experts per token, chosen by `sel`, weighted by
/// `wts`), sometimes grouped (row groups reading their own x, of a size that a warp's
/// rows may straddle), against f64 dots of the de-quantized rows.
#[test]
fn matvec_on_aligned_rows_with_picks() {
    let Some(dev) = device() else { return };
    let ks = everything(&dev);
    let mut r = Rng(seed());
    let u = |v: usize| Arg::U64(v as u64);
    for &t in ds4_ir::quant::supported() {
        if !ds4_ir::quant::can_quantize(t) {
            continue;
        }
        // The fewest blocks whose bytes are a multiple of 16; sometimes rows of more than
        // one 4 KiB chunk.
        let bb = t.bytes_for(t.block_elems() as u64).unwrap() as usize;
        let unit = 16 / gcd(bb, 16);
        // Few rows (a block per row or per group of rows, its warps sharing the chunks) or
        // many (a warp per group of rows): the kernel picks by n · tokens
        // (`matvec_split_below`) and the groups (`matvec_block_rows`).
        let many = r.next().is_multiple_of(2);
        // Few rows: a block per row (up to 69), or per group of rows when there are enough
        // groups (512-1499 rows of 2-3 KiB: two or three chunks a row). The longest rows
        // only with the fewest: the CPU quantizes and checks every row (IQ2_XXS's
        // quantizer is slow), and a case stays seconds.
        let grouped = !many && r.next().is_multiple_of(2);
        let units = if many || (!grouped && r.next().is_multiple_of(2)) {
            r.range(1, 3)
        } else if grouped {
            2048 / (bb * unit) + r.range(1, 3)
        } else {
            4096 / (t.block_elems() * unit) + r.range(1, 3)
        };
        let k = t.block_elems() * unit * units;
        let rb = t.bytes_for(k as u64).unwrap() as usize;
        assert_eq!(rb % 16, 0);
        let groups = if many { r.range(1, 4) } else { 1 };
        let n = if many { (ds4_runtime::cuda::matvec_split_below(t) as usize + r.range(0, 64)).next_multiple_of(groups) } else if grouped { r.range(512, 1500) } else { r.range(1, 70) };
        let ng = n / groups;
        let (experts, tokens, picks) = (if grouped { r.range(1, 3) } else { r.range(1, 5) }, r.range(1, 3), r.range(1, 4));
        let src: Vec<f32> = f32s(&mut r, experts * n * k, -2.0, 2.0);
        let mut bytes = vec![0u8; experts * n * rb];
        for i in 0..experts * n {
            ds4_ir::quant::quantize_row(t, &src[i * k..(i + 1) * k], &mut bytes[i * rb..(i + 1) * rb]).unwrap();
        }
        let mut wrows = vec![0f32; experts * n * k];
        for i in 0..experts * n {
            ds4_ir::quant::dequantize_row(t, &bytes[i * rb..][..rb], &mut wrows[i * k..(i + 1) * k]).unwrap();
        }
        // x has a row per (token, pick) (x_div = 1), as the experts' gate/up mat-vec reads,
        // and per row group.
        let x: Vec<f32> = f32s(&mut r, tokens * picks * groups * k, -1.0, 1.0);
        let sel: Vec<i32> = (0..tokens * picks).map(|_| r.range(0, experts) as i32).collect();
        let wts: Vec<f32> = f32s(&mut r, tokens * picks, 0.1, 1.5);
        let (w, xb, sb, wb) = (dev.upload(&bytes).unwrap(), dev.upload(&x).unwrap(), dev.upload(&sel).unwrap(), dev.upload(&wts).unwrap());
        let out = dev.alloc(tokens * n * 4).unwrap();
        let mv = ks.get(&kernel_name(QuantKernelKind::MatVec, t)).unwrap();
        let row_blocks = r.range(1, n.div_ceil(4) + 1);
        let path = match ds4_runtime::cuda::matvec_block_rows(t, n as u64, tokens as u64, groups as u64, ng as u64) {
            1 => "a block per row",
            r if r < 16 => "a block per row group",
            _ => "a warp per row group",
        };
        // The device layouts are read in place (no staging).
        let path = if ds4_runtime::cuda::matvec_reads_in_place(t) { format!("{path}, read in place") } else { path.to_string() };
        let args = [Arg::Ptr(out.ptr), Arg::Ptr(w.ptr), Arg::Ptr(xb.ptr), Arg::Ptr(sb.ptr), Arg::Ptr(wb.ptr), u(n), u(k), u(rb), u(picks), u(1), u(groups), u(ng), u(1), u(1), u(row_blocks)];
        launch(&dev, &mv.func, (row_blocks as u32, tokens as u32, 1), (mv.threads, 1, 1), mv.dyn_shared, &args).unwrap();
        let got: Vec<f32> = out.read(tokens * n).unwrap();
        let mut worst = 0f64;
        for ti in 0..tokens {
            for row in 0..n {
                let (mut want, mut norm) = (0f64, 0f64);
                for jp in 0..picks {
                    let p = ti * picks + jp;
                    let wr = &wrows[(sel[p] as usize * n + row) * k..][..k];
                    let xr = p * groups + row / ng;
                    for (a, b) in wr.iter().zip(&x[xr * k..(xr + 1) * k]) {
                        want += wts[p] as f64 * *a as f64 * *b as f64;
                        norm += (wts[p] as f64 * *a as f64 * *b as f64).abs();
                    }
                }
                worst = worst.max((got[ti * n + row] as f64 - want).abs() / norm.max(1e-30));
            }
        }
        println!("{t}: aligned matvec worst |Δ|/Σ|w·x| {worst:.2e} ({n} rows × {k} in {groups} groups, {rb} bytes a row, {tokens} tokens × {picks} picks of {experts} experts, {row_blocks} row blocks, {path})");
        assert!(worst < 1e-5, "{t}: aligned matvec off by {worst}");
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A device log through a long batch, the window's trim, the shrink that follows and a
/// run of decode pushes: the rows read back as pushed (`GrowLog`'s arithmetic is checked
/// on the host; this checks the device copies it asks for).
#[test]
fn device_log_keeps_its_rows_through_growth_and_shrink() {
    use ds4_runtime::cuda::{DevSlice, DeviceLog};
    use ds4_runtime::state::LogStore;
    let Some(dev) = device() else { return };
    let w = 3;
    let upload = |v: &[f32]| DevSlice::whole(dev.upload(v).unwrap(), v.len());
    let mut log = DeviceLog::new(w);
    let long: Vec<f32> = (0..4000 * w).map(|v| v as f32).collect();
    log.push(&upload(&long)).unwrap();
    let grown = log.bytes();
    log.trim_front(3900);
    let mut want: Vec<f32> = long[3900 * w..].to_vec();
    for p in 0..300 {
        let row = [-(p as f32), p as f32, 0.5];
        log.push(&upload(&row)).unwrap();
        want.extend(row);
        log.trim_front(log.end() - 100);
        want.drain(..want.len() - 100 * w);
    }
    assert!(log.bytes() * 8 < grown, "the log kept {} of {grown} bytes", log.bytes());
    let got: Vec<f32> = log.rows(log.first(), log.end()).unwrap().read().unwrap();
    assert_eq!(got, want);
}
