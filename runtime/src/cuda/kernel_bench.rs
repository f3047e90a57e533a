//! `ds4 bench --matvec --backend cuda`: the quant kernels alone, at DeepSeek-V4-Flash's
//! shapes, in GB/s of weight bytes read (decode mat-vecs) and TFLOP/s (prefill matmuls).
//!
//! Weights are random bytes (timing does not depend on the values) in buffers much larger
//! than the L2 cache; each call reads a different copy (plain matrices) or different
//! experts (routed), so every call streams its weights from memory as a decode step does.

use super::compile::Kernels;
use super::device::{launch, Arg, CudaError, Device, DeviceBuf};
use super::exec::{expert_groups, matvec_row_blocks};
use super::x_parts::{self, XParts};
use ds4_codegen::manifest::KernelSet;
use ds4_codegen::quant::{kernel_name, QuantKernelKind, MMA_ROWS, MMA_TOKENS, TOKENS};
use ds4_ir::GgmlType;
use std::sync::Arc;
use std::time::Instant;

/// One measured shape.
#[derive(Clone, Debug)]
pub struct BenchCase {
    /// What it stands for in the model.
    pub what: &'static str,
    pub ty: GgmlType,
    /// Output rows and row length.
    pub n: usize,
    pub k: usize,
    /// Tokens (1: the mat-vec).
    pub m: usize,
    /// Routed experts: (experts in the tensor, picks per token); the mat-vec reads
    /// `picks` experts' rows, the matmul groups `m · picks` rows by expert.
    pub experts: Option<(usize, usize)>,
}

/// DeepSeek-V4-Flash's decode mat-vecs and prefill matmuls (q2 recipe).
pub fn ds4_flash_cases(prefill: usize) -> Vec<BenchCase> {
    use GgmlType::*;
    let c = |what, ty, n, k, m, experts| BenchCase { what, ty, n, k, m, experts };
    let mut v = vec![
        c("attn_q_a", Q8_0, 1024, 4096, 1, None),
        c("attn_q_b", Q8_0, 32768, 1024, 1, None),
        c("attn_kv", Q8_0, 512, 4096, 1, None),
        c("attn_output_b", Q8_0, 4096, 8192, 1, None),
        c("shexp gate/up", Q8_0, 2048, 4096, 1, None),
        c("shexp down", Q8_0, 4096, 2048, 1, None),
        c("output", Q8_0, 129280, 4096, 1, None),
        c("compressor kv", F16, 1024, 4096, 1, None),
        c("indexer q_b", F16, 8192, 1024, 1, None),
        c("hc proj", F16, 24, 16384, 1, None),
        c("router", F16, 256, 4096, 1, None),
        c("exps gate/up", Iq2Xxs, 2048, 4096, 1, Some((256, 6))),
        c("exps down", Q2K, 4096, 2048, 1, Some((256, 6))),
    ];
    if prefill > 1 {
        v.extend([
            c("attn_q_b", Q8_0, 32768, 1024, prefill, None),
            c("shexp gate/up", Q8_0, 2048, 4096, prefill, None),
            c("compressor kv", F16, 1024, 4096, prefill, None),
            c("exps gate/up", Iq2Xxs, 2048, 4096, prefill, Some((256, 6))),
            c("exps down", Q2K, 4096, 2048, prefill, Some((256, 6))),
        ]);
    }
    v
}

/// One result row.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub case: BenchCase,
    pub kernel: String,
    pub micros: f64,
    /// Weight bytes read per call over the time.
    pub gbs: f64,
    pub tflops: f64,
    /// The kernel's registers per thread and resident blocks per SM (its occupancy).
    pub regs: i32,
    pub blocks_per_sm: u32,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn random_bytes(dev: &Arc<Device>, bytes: usize, r: &mut Rng) -> Result<DeviceBuf, CudaError> {
    let words: Vec<u64> = (0..bytes.div_ceil(8)).map(|_| r.next()).collect();
    let b = dev.alloc_owned(words.len() * 8)?;
    b.write(0, &words)?;
    Ok(b)
}

/// Runs every case `reps` times after a warm-up (the mean time per call), and the
/// device's copy bandwidth (GB/s, read + write) to compare with.
pub fn run(cases: &[BenchCase], reps: usize) -> Result<(Vec<BenchRow>, f64, String), CudaError> {
    let dev = Device::open()?;
    let copy_gbs = dev.copy_bandwidth(1 << 30, 5)?;
    // Each weight in the type the CUDA backend uploads it as (Q8_0 rows as Q8_0_R).
    let target = super::compile::target_for(dev.sm);
    let cases: Vec<BenchCase> = cases.iter().map(|c| BenchCase { ty: ds4_codegen::quant::device_type(target, c.ty, c.k as u64), ..c.clone() }).collect();
    let cases = &cases[..];
    let mut set = KernelSet::default();
    for c in cases {
        for kind in kinds(c) {
            set.quant.entry((kind, c.ty)).or_default();
        }
    }
    set.cuda.insert(x_parts::SPLIT_KERNEL, Default::default());
    let kernels = Kernels::compile(&dev, &set)?;
    let split = kernels.get(x_parts::SPLIT_KERNEL)?;
    let dummy = dev.alloc_owned(256)?;
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut rows = Vec::new();
    for (c, kind) in cases.iter().flat_map(|c| kinds(c).into_iter().map(move |k| (c, k))) {
        let row_bytes = c.ty.bytes_for(c.k as u64).ok_or_else(|| CudaError(format!("{}: k = {} is not whole blocks", c.ty, c.k)))? as usize;
        let (n_exp, picks) = c.experts.unwrap_or((1, 1));
        let matrix = c.n * row_bytes * n_exp;
        // Enough copies that the working set is ≥ 1 GiB (far above the L2 cache).
        let copies = (1usize << 30).div_ceil(matrix).max(1);
        let w = random_bytes(&dev, matrix * copies, &mut r)?;
        let x: Vec<f32> = (0..c.m * picks * c.k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let xb = dev.upload(&x)?;
        let out = dev.alloc(c.m * picks * c.n * 4)?;
        let u = |v: usize| Arg::U64(v as u64);
        // Per call: the expert picks (distinct experts per token, as the router gives).
        let sel_sets: Vec<Vec<i32>> = (0..8)
            .map(|_| {
                let mut sel = Vec::with_capacity(c.m * picks);
                for _ in 0..c.m {
                    let mut mine: Vec<i32> = Vec::new();
                    while mine.len() < picks {
                        let e = (r.next() % n_exp as u64) as i32;
                        if !mine.contains(&e) {
                            mine.push(e);
                        }
                    }
                    sel.extend(mine);
                }
                sel
            })
            .collect();
        let wts = dev.upload(&vec![1.0f32 / picks as f32; c.m * picks])?;
        let mut sels = Vec::new();
        let mut groups = Vec::new();
        let tile = if kind == QuantKernelKind::MatMulMma { MMA_TOKENS as usize } else { TOKENS as usize };
        for s in &sel_sets {
            sels.push(dev.upload(s)?);
            let (idx, gexp) = expert_groups(s, n_exp, tile);
            groups.push((dev.upload(&idx)?, dev.upload(&gexp)?, gexp.len()));
        }
        let name = kernel_name(kind, c.ty);
        let blocks_x = if kind == QuantKernelKind::MatMulMma { c.n.div_ceil(MMA_ROWS as usize) } else { c.n } as u32;
        let k = kernels.get(&name)?;
        let rbl = |m: usize| matvec_row_blocks(c.ty, c.n, m, 1, c.n, dev.sms);
        // The floats of x a prefill matmul reads (rows and x_div as the launch below gives
        // them: the experts' rows are (token, pick) rows, gate/up's x one per token).
        let (x_rows, x_div) = match c.experts {
            Some(_) if c.what.contains("down") => (c.m * picks, 1),
            Some(_) => (c.m * picks, picks),
            None => (c.m, 1),
        };
        let parts = if k.reads_x_parts { Some(XParts::alloc(&dev, x_parts::x_len(x_rows, c.k, 1, x_div))?) } else { None };
        let call = |i: usize| -> Result<(), CudaError> {
            let wp = w.ptr + ((i % copies) * matrix) as u64;
            let (args, grid) = match (kind, c.experts) {
                (QuantKernelKind::MatVec, None) => (
                    vec![Arg::Ptr(out.ptr), Arg::Ptr(wp), Arg::Ptr(xb.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(c.n), u(c.k), u(row_bytes), u(1), u(1), u(1), u(c.n), u(0), u(0), u(rbl(1))],
                    (rbl(1) as u32, 1),
                ),
                // The down projection: one output per token, Σ over its picks (weighted).
                (QuantKernelKind::MatVec, Some(_)) if c.what.contains("down") => (
                    vec![Arg::Ptr(out.ptr), Arg::Ptr(wp), Arg::Ptr(xb.ptr), Arg::Ptr(sels[i % 8].ptr), Arg::Ptr(wts.ptr), u(c.n), u(c.k), u(row_bytes), u(picks), u(1), u(1), u(c.n), u(1), u(1), u(rbl(1))],
                    (rbl(1) as u32, 1),
                ),
                // Gate/up: one output row per (token, pick), x shared by a token's picks.
                (QuantKernelKind::MatVec, Some(_)) => (
                    vec![Arg::Ptr(out.ptr), Arg::Ptr(wp), Arg::Ptr(xb.ptr), Arg::Ptr(sels[i % 8].ptr), Arg::Ptr(dummy.ptr), u(c.n), u(c.k), u(row_bytes), u(1), u(picks), u(1), u(c.n), u(1), u(0), u(rbl(picks))],
                    (rbl(picks) as u32, picks as u32),
                ),
                (_, None) => (
                    vec![Arg::Ptr(out.ptr), Arg::Ptr(wp), Arg::Ptr(xb.ptr), Arg::Ptr(dummy.ptr), Arg::Ptr(dummy.ptr), u(c.n), u(c.k), u(row_bytes), u(c.m), u(1), u(c.n), u(1), u(0)],
                    (blocks_x, c.m.div_ceil(tile) as u32),
                ),
                (_, Some(_)) => {
                    let (idx, gexp, ng) = &groups[i % 8];
                    (
                        vec![Arg::Ptr(out.ptr), Arg::Ptr(wp), Arg::Ptr(xb.ptr), Arg::Ptr(idx.ptr), Arg::Ptr(gexp.ptr), u(c.n), u(c.k), u(row_bytes), u(c.m * picks), u(1), u(c.n), u(x_div), u(1)],
                        (blocks_x, *ng as u32),
                    )
                }
            };
            let mut args = args;
            if kind == QuantKernelKind::MatMulMma {
                // One slice over k (no split): k_slice, out_slice; x's bf16 parts, made per
                // call as the runtime makes them (`x_parts.rs`).
                args.extend([u(c.k), u(0)]);
                if let Some(p) = &parts {
                    p.split(&dev, split, xb.ptr)?;
                }
                args.extend(x_parts::mma_args(parts.as_ref(), dummy.ptr).map(|(_, a)| a));
            }
            launch(&dev, &k.func, (grid.0, grid.1, 1), (k.threads, 1, 1), k.dyn_shared, &args)
        };
        call(0)?;
        dev.synchronize()?;
        let reps = if c.m > 1 { reps.div_ceil(10).max(2) } else { reps };
        let t = Instant::now();
        for i in 0..reps {
            call(i + 1)?;
        }
        dev.synchronize()?;
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        // Bytes a call reads: the picked experts' rows (decode), or each expert's rows
        // once per group of TOKENS rows (prefill, grouped).
        let read = match (c.m, c.experts) {
            (1, Some((_, p))) => p * c.n * row_bytes,
            (_, Some(_)) => groups[0].2 * c.n * row_bytes,
            _ if c.m > 1 => c.m.div_ceil(tile) * c.n * row_bytes,
            _ => c.n * row_bytes,
        };
        let flops = 2.0 * (c.m * picks) as f64 * c.n as f64 * c.k as f64;
        let regs = k.func.num_regs().unwrap_or(0);
        let blocks_per_sm = k.func.occupancy_max_active_blocks_per_multiprocessor(k.threads, k.dyn_shared as usize, None).unwrap_or(0);
        rows.push(BenchRow { case: c.clone(), kernel: name, micros: secs * 1e6, gbs: read as f64 / secs / 1e9, tflops: flops / secs / 1e12, regs, blocks_per_sm });
    }
    Ok((rows, copy_gbs, dev.name.clone()))
}

/// The kernels a case measures: the mat-vec, or both prefill matmuls.
fn kinds(c: &BenchCase) -> Vec<QuantKernelKind> {
    if c.m > 1 {
        vec![QuantKernelKind::MatMul, QuantKernelKind::MatMulMma]
    } else {
        vec![QuantKernelKind::MatVec]
    }
}
