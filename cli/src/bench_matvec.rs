//! `ds4 bench --matvec`: CPU mat-vec throughput per quant type, in GB/s of weight bytes,
//! next to the machine's copy and read bandwidth measured in the same run.
//!
//! What is measured: y = W·x for one activation vector (decode), W of `rows` rows of
//! `cols` values in the type under test, through the same entry points the runtime's
//! matmul uses (`quant::dot_row` per weight row; `--fast`: `quantize_activations` once per
//! mat-vec, then `dot_row_fast` per row). Parallel runs split the rows over rayon's pool.
//!
//! Memory, not cache: each measurement cycles through enough distinct copies of the matrix
//! that the set is several times the last-level cache, so every row comes from DRAM. Rows
//! are quantized from Gaussian data (a few distinct rows, tiled: realistic scales and no
//! NaN/subnormal blocks from random bytes, and no minutes spent in the slower quantizers).
//!
//! Throughput is weight bytes / time, best of `passes` passes (the dev machine is shared,
//! so the best pass is the one least disturbed by other processes). Time is wall time for
//! the parallel runs and the copy; for single-thread runs it is the thread's CPU time
//! (Linux), which does not count time spent descheduled by other processes (it still
//! counts their competition for memory bandwidth).

use anyhow::{anyhow, Result};
use ds4_ir::quant;
use ds4_ir::clock::thread_cpu_seconds;
use ds4_ir::rng::gaussian;
use ds4_ir::GgmlType;
use rayon::prelude::*;
use std::time::Instant;

/// Options of the mat-vec benchmark (from `ds4 bench --matvec ...`).
pub struct MatvecOpts {
    /// Bytes of distinct matrix data cycled through per measurement, in MiB.
    pub set_mib: usize,
    /// Passes per measurement; the best is reported.
    pub passes: usize,
    /// Comma-separated type names, or every supported type.
    pub types: Option<String>,
    /// Also measure the quantized-activation fast path.
    pub fast: bool,
}

/// The shapes measured: (rows, cols, what it is in DS4).
const SHAPES: [(usize, usize, &str); 3] = [
    (4096, 4096, "4096×4096"),
    (2048, 4096, "gate/up 2048×4096"),
    (4096, 2048, "down 4096×2048"),
];

/// Seconds since the first call (monotonic).
fn wall_seconds() -> f64 {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Best wall time of `passes` runs of `f`, in seconds.
fn best_of(passes: usize, mut f: impl FnMut()) -> f64 {
    (0..passes.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Copy bandwidth (STREAM convention: bytes read + bytes written per second) of a large
/// memcpy split over all threads, and read bandwidth (a sum over a large buffer).
/// Returns (copy GB/s, read GB/s).
pub(crate) fn memory_bandwidth(bytes: usize, passes: usize) -> (f64, f64) {
    let threads = rayon::current_num_threads();
    let src: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut dst = vec![0u64; src.len()];
    // One chunk per thread: large copies, so that the C library streams them (no
    // read-for-ownership of the destination, as STREAM's figure assumes).
    let chunk = src.len().div_ceil(threads);
    let t = best_of(passes, || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
    });
    std::hint::black_box(&dst);
    let copy = 2.0 * bytes as f64 / t / 1e9;
    let t = best_of(passes, || {
        let s: u64 = src
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .sum();
        std::hint::black_box(s);
    });
    (copy, bytes as f64 / t / 1e9)
}

/// One type at one shape: its matrices, and the vector.
struct Case {
    ty: GgmlType,
    rows: usize,
    row_bytes: usize,
    /// `copies` matrices back to back.
    data: Vec<u8>,
    copies: usize,
    x: Vec<f32>,
}

impl Case {
    fn new(ty: GgmlType, rows: usize, cols: usize, set_bytes: usize) -> Result<Case> {
        let row_bytes = ty
            .bytes_for(cols as u64)
            .ok_or_else(|| anyhow!("{ty}: {cols} is not a whole number of blocks"))?
            as usize;
        let distinct = 64;
        let w = gaussian(distinct * cols, 5);
        let mut q = vec![0u8; distinct * row_bytes];
        for (src, dst) in w.chunks_exact(cols).zip(q.chunks_exact_mut(row_bytes)) {
            quant::quantize_row(ty, src, dst)?;
        }
        let matrix = rows * row_bytes;
        let copies = set_bytes.div_ceil(matrix).max(2);
        let data: Vec<u8> = q.iter().copied().cycle().take(copies * matrix).collect();
        Ok(Case {
            ty,
            rows,
            row_bytes,
            data,
            copies,
            x: gaussian(cols, 3),
        })
    }

    fn matrix(&self, c: usize) -> &[u8] {
        let m = self.rows * self.row_bytes;
        &self.data[c * m..(c + 1) * m]
    }

    /// Seconds for one y = W·x over every copy, as the runtime computes it.
    fn pass(&self, parallel: bool, fast: bool, y: &mut [f32]) -> f64 {
        let clock = || {
            if parallel {
                wall_seconds()
            } else {
                thread_cpu_seconds()
            }
        };
        let t0 = clock();
        for c in 0..self.copies {
            let w = self.matrix(c);
            let rb = self.row_bytes;
            if fast {
                // Quantizing the activation is part of every mat-vec's cost.
                let qa = quant::quantize_activations(&self.x);
                let dot = |r: &[u8]| quant::dot_row_fast(self.ty, r, &qa).unwrap();
                run_rows(w, rb, y, parallel, dot);
            } else {
                let dot = |r: &[u8]| quant::dot_row(self.ty, r, &self.x).unwrap();
                run_rows(w, rb, y, parallel, dot);
            }
        }
        clock() - t0
    }

    /// Best GB/s of weight bytes over `passes` passes.
    fn gbs(&self, parallel: bool, fast: bool, passes: usize) -> f64 {
        let mut y = vec![0f32; self.rows];
        self.pass(parallel, fast, &mut y); // warm-up: page faults, thread pool
        let t = (0..passes)
            .map(|_| self.pass(parallel, fast, &mut y))
            .fold(f64::INFINITY, f64::min);
        std::hint::black_box(&y);
        self.data.len() as f64 / t / 1e9
    }
}

/// y[r] = dot(row r) for every row, on this thread or split over the pool in chunks of
/// rows (small enough to balance two to many threads, large enough to amortise the task).
fn run_rows(
    w: &[u8],
    row_bytes: usize,
    y: &mut [f32],
    parallel: bool,
    dot: impl Fn(&[u8]) -> f32 + Sync,
) {
    const CHUNK: usize = 64;
    if parallel {
        y.par_chunks_mut(CHUNK)
            .zip(w.par_chunks(CHUNK * row_bytes))
            .for_each(|(ys, ws)| {
                for (o, r) in ys.iter_mut().zip(ws.chunks_exact(row_bytes)) {
                    *o = dot(r);
                }
            });
    } else {
        for (o, r) in y.iter_mut().zip(w.chunks_exact(row_bytes)) {
            *o = dot(r);
        }
    }
}

fn selected_types(types: Option<&str>) -> Result<Vec<GgmlType>> {
    match types {
        None => Ok(quant::supported().to_vec()),
        Some(list) => list
            .split(',')
            .map(|n| {
                let t =
                    GgmlType::from_name(n.trim()).ok_or_else(|| anyhow!("unknown type '{n}'"))?;
                if quant::supported().contains(&t) {
                    Ok(t)
                } else {
                    Err(anyhow!("{t}: not supported by ds4's CPU code"))
                }
            })
            .collect(),
    }
}

/// Print a Markdown table: per type and shape, GB/s of weight bytes on one thread and on
/// all threads (and the fast path's, with `--fast`), and the all-thread figure as a
/// percentage of the copy bandwidth.
pub fn run(o: MatvecOpts) -> Result<()> {
    let types = selected_types(o.types.as_deref())?;
    let threads = rayon::current_num_threads();
    let set = o.set_mib << 20;
    let (copy, read) = memory_bandwidth(set.max(256 << 20), o.passes.max(5));
    println!(
        "threads: {threads}; distinct matrix data per measurement: {} MiB; best of {} passes; 1T: thread CPU time, {threads}T: wall time",
        o.set_mib, o.passes
    );
    println!("copy bandwidth (all threads, read + write): {copy:.1} GB/s; read bandwidth: {read:.1} GB/s");
    println!(
        "SIMD level of the generated kernels: {}",
        quant::simd_level()
    );
    println!();
    let mut header =
        "| type | shape | bytes/matrix | exact 1T GB/s | exact {T}T GB/s | % of copy |"
            .replace("{T}", &threads.to_string());
    let mut rule = "|---|---|---|---|---|---|".to_string();
    if o.fast {
        header += &format!(" fast 1T GB/s | fast {threads}T GB/s | % of copy |");
        rule += "---|---|---|";
    }
    println!("{header}\n{rule}");
    for &ty in &types {
        for &(rows, cols, what) in &SHAPES {
            let case = Case::new(ty, rows, cols, set)?;
            let one = case.gbs(false, false, o.passes);
            let all = case.gbs(true, false, o.passes);
            let mut line = format!(
                "| {} | {what} | {:.2} MB | {one:.2} | {all:.2} | {:.0}% |",
                ty.name(),
                (rows * case.row_bytes) as f64 / 1e6,
                100.0 * all / copy
            );
            if o.fast {
                let one = case.gbs(false, true, o.passes);
                let all = case.gbs(true, true, o.passes);
                line += &format!(" {one:.2} | {all:.2} | {:.0}% |", 100.0 * all / copy);
            }
            println!("{line}");
        }
    }
    Ok(())
}
