//! `matmul_mma_<type>`: the prefill matmul on tensor cores (CUDA, sm_80 and later).
//!
//! Same contract as the SIMT `matmul_<type>` (see `QuantKernelKind::MatMul`), with tiles
//! of [`MMA_ROWS`] weight rows × [`MMA_TOKENS`] tokens per block of 4 warps. Each step of
//! 32 columns:
//! 1. the block de-quantizes its 64 × 32 weight tile into shared memory (16 elements per
//!    thread, the declaration's expression through `Lower::value_runs`: the same values,
//!    bit for bit, as every other de-quantization) and stages the tokens' 64 × 32 x tile;
//! 2. each warp multiplies its 32 × 32 quarter with `mma.sync.m16n8k8` on TF32.
//!
//! TF32 keeps 10 bits of mantissa, so every operand is split in two TF32 numbers
//! (`big = tf32(v)`, `small = tf32(v − big)`) and three products are accumulated in f32:
//! `big·big + big·small + small·big` (the dropped `small·small` is below 2^-22 of the
//! product). The result matches an f32 dot product to about f32 rounding, which is what
//! the kernel parity test holds it to (the same bound as the SIMT kernel).
//!
//! A tile must not straddle two row groups of a grouped matmul: the runtime uses this
//! kernel when `groups == 1` or `ng` is a multiple of [`MMA_ROWS`], the SIMT one otherwise.

use super::{Lower, QuantGenError};
use std::fmt::Write;

/// Weight rows per block.
pub const MMA_ROWS: u64 = 64;
/// Tokens per block (and rows per expert group when the rows are listed).
pub const MMA_TOKENS: u64 = 64;
/// Shared memory: the weight and x tiles (64 × 36 floats each, padded against bank
/// conflicts) and the tokens' x offsets and output rows.
pub const MMA_SHARED_BYTES: u32 = 2 * 64 * 36 * 4 + 64 * 8 + 64 * 8;

/// Helpers placed before the kernel: the TF32 split and one MMA.
const MMA_HELPERS: &str = r#"// v = big + small, both TF32 (round to nearest): 21 of f32's 24 bits survive.
__device__ __forceinline__ void ds4_split_tf32(const float v, unsigned int& big, unsigned int& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(v));
    const float rest = v - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
}

// c (16 × 8, f32) += a (16 × 8, TF32, row-major) · b (8 × 8, TF32, column-major).
__device__ __forceinline__ void ds4_mma_tf32(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

"#;

impl Lower<'_> {
    /// The helpers and the body of `matmul_mma_<type>` (after `kernel_open`).
    pub(super) fn mma_helpers(&self) -> &'static str {
        MMA_HELPERS
    }

    pub(super) fn mma_body(&self) -> Result<String, QuantGenError> {
        let mut o = String::new();
        let w = |o: &mut String, depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        // Tile bookkeeping: which tokens (x offsets, output rows) this block serves.
        for l in [
            "__shared__ float ws[64 * 36];",
            "__shared__ float xs[64 * 36];",
            "__shared__ unsigned long long xrow[64];",
            "__shared__ long long prow[64];",
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);",
            "const unsigned int warp = (unsigned int)(ds4_tid >> 5);",
            "const unsigned int g = lane >> 2;",
            "const unsigned int t4 = lane & 3u;",
            "const unsigned int wm = warp >> 1;",
            "const unsigned int wn = warp & 1u;",
            "const unsigned long long r0 = ds4_bx * 64ull;",
            "const unsigned long long ex = has_idx != 0ull ? (unsigned long long)ds4_gexp[ds4_by] : 0ull;",
            "const unsigned long long xg = r0 / ng;",
            "if (ds4_tid < 64ull) {",
            "    long long p;",
            "    if (has_idx != 0ull) {",
            "        p = (long long)ds4_idx[ds4_by * 64ull + ds4_tid];",
            "    } else {",
            "        const unsigned long long tt = ds4_by * 64ull + ds4_tid;",
            "        p = tt < m ? (long long)tt : -1ll;",
            "    }",
            "    prow[ds4_tid] = p;",
            "    xrow[ds4_tid] = p >= 0 ? (((unsigned long long)p / x_div) * groups + xg) * k : 0ull;",
            "}",
            "__syncthreads();",
            "float c[2][4][4];",
            "for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++) for (int q = 0; q < 4; q++) c[i][j][q] = 0.0f;",
            // Each thread de-quantizes 16 elements of one row and stages 16 x values of
            // one token per step.
            "const unsigned long long trow = ds4_tid >> 1;",
            "const unsigned long long half = (ds4_tid & 1ull) * 16ull;",
            "const unsigned long long wrow = r0 + trow;",
            "const unsigned long long row_base = (ex * n + (wrow < n ? wrow : 0ull)) * row_bytes;",
            "const bool tok_ok = prow[trow] >= 0;",
            "const unsigned long long tok_x = xrow[trow];",
            "for (unsigned long long k0 = 0ull; k0 < k; k0 += 32ull) {",
        ] {
            w(&mut o, 1, l);
        }
        w(&mut o, 2, "const unsigned long long e0 = k0 + half;");
        w(&mut o, 2, "float* wdst = &ws[trow * 36ull + half];");
        w(&mut o, 2, "if (wrow < n) {");
        let store = |i: u64, v: &str| format!("wdst[{i}] = {v};");
        for (d, l) in self.value_runs(16, &store)? {
            w(&mut o, 3 + d, &l);
        }
        w(&mut o, 2, "} else {");
        w(&mut o, 3, "for (int i = 0; i < 16; i++) wdst[i] = 0.0f;");
        w(&mut o, 2, "}");
        for l in [
            "float* xdst = &xs[trow * 36ull + half];",
            "if (tok_ok && e0 + 16ull <= k && (k & 3ull) == 0ull) {",
            "    const float4* src = (const float4*)(&ds4_x[tok_x + e0]);",
            "    for (int q = 0; q < 4; q++) {",
            "        const float4 v = src[q];",
            "        xdst[4 * q] = v.x; xdst[4 * q + 1] = v.y; xdst[4 * q + 2] = v.z; xdst[4 * q + 3] = v.w;",
            "    }",
            "} else {",
            "    for (unsigned long long i = 0ull; i < 16ull; i++) xdst[i] = (tok_ok && e0 + i < k) ? ds4_x[tok_x + e0 + i] : 0.0f;",
            "}",
            "__syncthreads();",
            "for (int kk = 0; kk < 32; kk += 8) {",
            "    unsigned int ab[2][4], as_[2][4], bb[4][2], bs[4][2];",
            "    for (int i = 0; i < 2; i++) {",
            "        const float* a = &ws[(wm * 32u + i * 16u + g) * 36u + kk + t4];",
            "        ds4_split_tf32(a[0], ab[i][0], as_[i][0]);",
            "        ds4_split_tf32(a[8 * 36], ab[i][1], as_[i][1]);",
            "        ds4_split_tf32(a[4], ab[i][2], as_[i][2]);",
            "        ds4_split_tf32(a[8 * 36 + 4], ab[i][3], as_[i][3]);",
            "    }",
            "    for (int j = 0; j < 4; j++) {",
            "        const float* b = &xs[(wn * 32u + j * 8u + g) * 36u + kk + t4];",
            "        ds4_split_tf32(b[0], bb[j][0], bs[j][0]);",
            "        ds4_split_tf32(b[4], bb[j][1], bs[j][1]);",
            "    }",
            "    for (int i = 0; i < 2; i++) {",
            "        for (int j = 0; j < 4; j++) {",
            "            ds4_mma_tf32(c[i][j], as_[i], bb[j]);",
            "            ds4_mma_tf32(c[i][j], ab[i], bs[j]);",
            "            ds4_mma_tf32(c[i][j], ab[i], bb[j]);",
            "        }",
            "    }",
            "}",
            "__syncthreads();",
        ] {
            w(&mut o, 2, l);
        }
        w(&mut o, 1, "}");
        // c[i][j][q]: row g (+8 for q ≥ 2) of the warp's i-th 16 rows, token 2·t4 (+1 for
        // odd q) of its j-th 8 tokens.
        for l in [
            "for (int i = 0; i < 2; i++) {",
            "    for (int j = 0; j < 4; j++) {",
            "        for (int q = 0; q < 4; q++) {",
            "            const unsigned long long row = r0 + wm * 32u + i * 16u + g + (q >> 1) * 8u;",
            "            const long long p = prow[wn * 32u + j * 8u + 2u * t4 + (q & 1)];",
            "            if (p >= 0 && row < n) {",
            "                ds4_out[(unsigned long long)p * n + row] = c[i][j][q];",
            "            }",
            "        }",
            "    }",
            "}",
        ] {
            w(&mut o, 1, l);
        }
        Ok(o)
    }
}
