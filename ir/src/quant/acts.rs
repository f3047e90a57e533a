//! The fast path: activations quantized to int8, and integer dot products against them.
//!
//! `quantize_activations(x)` quantizes a row of activations once (per token and matmul):
//! blocks of 32 values, each an f32 scale `d = max|x| / 127` and int8 values
//! `q = round(x / d)`, plus the de-quantized sum `d · Σ q` of every 16 values (the term
//! that the offsets of types with mins, Q4_K's `- dmin · m`, multiply). `dot_row_fast`
//! then computes, for types whose element term is a small integer, every sub-block's
//! `Σ e·q` in integers (AVX2: `vpmaddubsw`), scaled by the sub-block's scale and the
//! activation block's `d`, as llama.cpp and ds4 do with their Q8 activation blocks.
//!
//! What it computes is the exact dot product of the de-quantized weights with the
//! de-quantized activations `d · q`; its error against the exact path (`dot_row` with the
//! f32 activations) is the activation rounding, about 1/254 of each block's largest value
//! per value (measured: docs and bench/RESULTS.md). Types without an integer kernel
//! (F32, F16, BF16, or activations whose length is not a whole number of 32-value blocks)
//! use the exact path: `QuantActs` keeps the f32 activations for them.

use super::api::{dot_row, find, row_blocks, QuantError};
use crate::GgmlType;

/// Values per activation block (one f32 scale each), and per precomputed sum.
pub const ACT_BLOCK: usize = 32;
const ACT_SUM: usize = 16;

/// A row of activations, quantized for `dot_row_fast` (and kept exact for the types that
/// have no integer kernel).
#[derive(Clone, Debug, Default)]
pub struct QuantActs {
    x: Vec<f32>,
    q: Vec<i8>,
    d: Vec<f32>,
    s16: Vec<f32>,
}

impl QuantActs {
    /// Quantize `x`, reusing this value's buffers (no allocation once they are large
    /// enough).
    pub fn set(&mut self, x: &[f32]) {
        self.x.clear();
        self.x.extend_from_slice(x);
        self.q.clear();
        self.d.clear();
        self.s16.clear();
        if !x.len().is_multiple_of(ACT_BLOCK) {
            return; // only the exact path
        }
        self.q.resize(x.len(), 0);
        for (xb, qb) in x
            .chunks_exact(ACT_BLOCK)
            .zip(self.q.chunks_exact_mut(ACT_BLOCK))
        {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                // round() is half away from zero; |v·id| <= 127 up to rounding of id.
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            }
            self.d.push(d);
            for half in qb.chunks_exact(ACT_SUM) {
                let sum: i32 = half.iter().map(|&q| q as i32).sum();
                self.s16.push(d * sum as f32);
            }
        }
    }

    /// Number of activations.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// The exact activations.
    pub fn exact(&self) -> &[f32] {
        &self.x
    }

    /// The de-quantized activations `d · q` (what the fast path multiplies the weights
    /// with); the exact ones if they were not quantized.
    pub fn dequantized(&self) -> Vec<f32> {
        if self.q.is_empty() {
            return self.x.clone();
        }
        self.q
            .iter()
            .enumerate()
            .map(|(i, &q)| self.d[i / ACT_BLOCK] * q as f32)
            .collect()
    }

    /// Whether the values are quantized (their count is a whole number of blocks).
    pub fn is_quantized(&self) -> bool {
        !self.q.is_empty() || self.x.is_empty()
    }
}

/// Quantize a row of activations for [`dot_row_fast`].
pub fn quantize_activations(x: &[f32]) -> QuantActs {
    let mut a = QuantActs::default();
    a.set(x);
    a
}

/// `dequantize(src) · x` on the fast path: the integer kernel of `t` against the quantized
/// activations where `t` has one, else the exact [`dot_row`]. Lengths are checked as for
/// `dot_row`.
pub fn dot_row_fast(t: GgmlType, src: &[u8], a: &QuantActs) -> Result<f32, QuantError> {
    let q = find(t)?;
    match q.dot_row_q8 {
        Some(dot) if !a.q.is_empty() => {
            row_blocks(q, src.len(), a.x.len())?;
            Ok(dot(src, &a.q, &a.d, &a.s16))
        }
        _ => dot_row(t, src, &a.x),
    }
}

/// Whether `t` has an integer kernel (else `dot_row_fast` is the exact product).
pub fn has_fast_kernel(t: GgmlType) -> bool {
    super::api::cpu(t).is_some_and(|q| q.dot_row_q8.is_some())
}

pub use super::rt::simd_level;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, dot_row, quantize_row, rt, supported};
    use crate::clock::thread_cpu_seconds;
    use crate::rng::gaussian;

    /// Rows of type `t` quantized from Gaussian data, and their de-quantization.
    fn matrix(t: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let rb = t.bytes_for(cols as u64).unwrap() as usize;
        let w = gaussian(rows * cols, seed);
        let mut q = vec![0u8; rows * rb];
        for (src, dst) in w.chunks_exact(cols).zip(q.chunks_exact_mut(rb)) {
            quantize_row(t, src, dst).unwrap();
        }
        let mut deq = vec![0f32; rows * cols];
        dequantize_row(t, &q, &mut deq).unwrap();
        (q, deq)
    }

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum()
    }

    /// Both kernel variants, one after the other.
    fn variants() -> Vec<bool> {
        let mut v = vec![false];
        if rt::select_avx2_fma(true) {
            v.push(true);
        }
        v
    }

    /// The integer kernels compute the de-quantized weights times the de-quantized
    /// activations: equal to an f64 reference of that product up to f32 accumulation.
    #[test]
    fn fast_kernels_compute_the_dequantized_product() {
        let (rows, cols) = (64, 512);
        let mut x = gaussian(cols, 7);
        // Outliers and a zero block: the per-block scales must handle both.
        x[3] = 40.0;
        x[100] = -25.0;
        x[64..96].fill(0.0);
        let a = quantize_activations(&x);
        let xh = a.dequantized();
        for avx2 in variants() {
            rt::select_avx2_fma(avx2);
            for &t in supported() {
                let (q, deq) = matrix(t, rows, cols, 11);
                let rb = q.len() / rows;
                for r in 0..rows {
                    let w = &deq[r * cols..(r + 1) * cols];
                    let want = if has_fast_kernel(t) {
                        dot64(w, &xh)
                    } else {
                        dot64(w, &x)
                    };
                    let scale: f64 = w
                        .iter()
                        .zip(&xh)
                        .map(|(&w, &x)| (w as f64 * x as f64).abs())
                        .sum();
                    let got = dot_row_fast(t, &q[r * rb..(r + 1) * rb], &a).unwrap() as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * scale,
                        "{t} (avx2: {avx2}) row {r}: {got} vs {want} (scale {scale})"
                    );
                }
            }
        }
        rt::select_avx2_fma(true);
    }

    /// The exact kernels of both variants agree with an f64 reference.
    #[test]
    fn exact_kernels_agree_in_both_variants() {
        let (rows, cols) = (16, 512);
        let x = gaussian(cols, 9);
        for avx2 in variants() {
            rt::select_avx2_fma(avx2);
            for &t in supported() {
                let (q, deq) = matrix(t, rows, cols, 13);
                let rb = q.len() / rows;
                for r in 0..rows {
                    let w = &deq[r * cols..(r + 1) * cols];
                    let want = dot64(w, &x);
                    let scale: f64 = w
                        .iter()
                        .zip(&x)
                        .map(|(&w, &x)| (w as f64 * x as f64).abs())
                        .sum();
                    let got = dot_row(t, &q[r * rb..(r + 1) * rb], &x).unwrap() as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * scale,
                        "{t} (avx2: {avx2}) row {r}: {got} vs {want}"
                    );
                }
            }
        }
        rt::select_avx2_fma(true);
    }

    #[test]
    fn lengths_are_checked_and_odd_lengths_fall_back() {
        let x = gaussian(256, 1);
        let a = quantize_activations(&x);
        let (q, _) = matrix(GgmlType::Q4K, 1, 256, 2);
        assert!(dot_row_fast(GgmlType::Q4K, &q[..100], &a).is_err());
        let short = quantize_activations(&x[..255]);
        assert!(!short.is_quantized());
        assert!(dot_row_fast(GgmlType::Q4K, &q, &short).is_err());
        let (f, _) = matrix(GgmlType::F32, 1, 40, 3);
        let odd = quantize_activations(&gaussian(40, 4));
        assert_eq!(
            dot_row_fast(GgmlType::F32, &f, &odd).unwrap(),
            dot_row(GgmlType::F32, &f, odd.exact()).unwrap()
        );
    }

    /// The fast path's error against the exact path on Gaussian data, per type: printed
    /// (it is documented in bench/RESULTS.md), and bounded.
    #[test]
    fn fast_path_error_on_gaussian_data() {
        let (rows, cols) = (256, 4096);
        let x = gaussian(cols, 21);
        let a = quantize_activations(&x);
        for &t in supported() {
            let (q, _) = matrix(t, rows, cols, 23);
            let rb = q.len() / rows;
            let (mut num, mut den, mut worst) = (0f64, 0f64, 0f64);
            let exact: Vec<f64> = (0..rows)
                .map(|r| dot_row(t, &q[r * rb..(r + 1) * rb], &x).unwrap() as f64)
                .collect();
            let ystd = (exact.iter().map(|y| y * y).sum::<f64>() / rows as f64).sqrt();
            for (r, &e) in exact.iter().enumerate() {
                let f = dot_row_fast(t, &q[r * rb..(r + 1) * rb], &a).unwrap() as f64;
                num += (f - e) * (f - e);
                den += e * e;
                worst = worst.max((f - e).abs() / ystd);
            }
            let rel = (num / den).sqrt();
            eprintln!("{t:>8}: fast vs exact: relative RMS error {rel:.2e}, max |Δ| {worst:.2e} of RMS(y)");
            assert!(rel < 1e-2, "{t}: {rel}");
        }
    }

    /// Single-thread kernel throughput (4096 × 4096, in cache for the small types: this is
    /// the kernels' speed, not the memory's; `ds4 bench --matvec` measures the latter),
    /// exact and fast, both variants, in Gweights/s (best of 10, thread CPU time).
    /// `cargo test --release -p ds4-ir --lib -- --ignored --nocapture kernel_speed`
    #[test]
    #[ignore]
    fn kernel_speed() {
        let (rows, cols) = (4096, 4096);
        let x = gaussian(cols, 3);
        let a = quantize_activations(&x);
        for avx2 in variants() {
            rt::select_avx2_fma(avx2);
            eprintln!("{}", rt::simd_level());
            for &t in supported() {
                let (q0, _) = matrix(t, 32, cols, 5);
                let m: Vec<u8> = q0
                    .iter()
                    .copied()
                    .cycle()
                    .take(q0.len() / 32 * rows)
                    .collect();
                let rb = m.len() / rows;
                let time = |f: &dyn Fn(&[u8]) -> f32| {
                    let mut best = f64::INFINITY;
                    for _ in 0..10 {
                        let t0 = thread_cpu_seconds();
                        let mut sink = 0f32;
                        for r in m.chunks_exact(rb) {
                            sink += f(r);
                        }
                        std::hint::black_box(sink);
                        best = best.min(thread_cpu_seconds() - t0);
                    }
                    (rows * cols) as f64 / best / 1e9
                };
                let exact = time(&|r| dot_row(t, r, &x).unwrap());
                let fast = time(&|r| dot_row_fast(t, r, &a).unwrap());
                let gb = m.len() as f64 / (rows * cols) as f64;
                eprintln!(
                    "{:>8}: exact {exact:5.2} Gw/s ({:5.2} GB/s)   fast {fast:5.2} Gw/s ({:5.2} GB/s)",
                    t.name(),
                    exact * gb,
                    fast * gb
                );
            }
        }
        rt::select_avx2_fma(true);
    }
}
