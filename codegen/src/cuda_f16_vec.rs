//! `matvec_f16_vec`: a decode token's F16 mat-vec in 16-byte loads, CUDA text.
//!
//! The generated mat-vec (`quant/cuda_matvec.rs`) stages F16 rows through shared memory
//! like every GGUF type, and walks them an element at a time (F16 read in place, a 16-bit
//! load per element, measured slower still). F16 needs neither: a row is 16-byte vectors of
//! eight halves. Here a block of [`WARPS`] warps takes [`ROWS`] rows, its lanes reading
//! consecutive vectors of each (a warp load is 512 contiguous bytes), x's eight floats
//! for a vector loaded once for the rows, four vectors a lane in flight; the warps split
//! the rows' vectors and add their sums through shared memory.
//!
//! H200, back-to-back launches each on a matrix not in L2 (µs; a plain 16-byte read of the
//! same bytes, the generated kernel, this one): the router (256 × 4096) 3.7 / 5.0 / 4.6,
//! the compressor's KV (1024 × 4096) 5.7 / 7.9 / 5.7, its KV and gate (2048 × 4096) 7.5 /
//! 10.6 / 7.4, the indexer's `q_b` (8192 × 1024) 7.5 / 10.7 / 6.9. (One row a block, or
//! four rows, or eight warps: no better across these shapes.)
//!
//! The sums differ from the generated kernel's in order only (`cuda_kernels` holds them to
//! the same bound). The runtime (`runtime/src/cuda/exec/matvec.rs`, `matvec`) uses it for
//! one token's mat-vec over all rows ([`fits`]); `DS4_F16_VEC=0` turns it off.

use crate::quant::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "matvec_f16_vec";
/// Rows a block takes (x's floats are loaded once for them).
pub const ROWS: usize = 2;
/// Warps a block: they split the rows' vectors.
pub const WARPS: usize = 4;
/// Threads a block.
pub const THREADS: u32 = 32 * WARPS as u32;
/// Halves in a 16-byte vector.
const VEC: usize = 8;

/// Parameters in launch order: out (n floats), the weights (n rows of k halves), x (k
/// floats a row group; row r reads x at (r / ng) · k), rows, row length, rows per group.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "w", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "k" },
        QParam::Scalar { name: "ng" },
    ]
}

/// Whether a mat-vec of `n` rows of `k` values in x groups of `ng` rows, for `m` tokens,
/// with or without a row selection, takes this kernel: one token, every row, rows of whole
/// vectors, a block's rows in one group (one group, or groups of whole blocks). (The
/// weights and x must be 16-byte aligned too, which the runtime checks.)
pub fn fits(n: usize, k: usize, ng: usize, m: usize, selected: bool) -> bool {
    m == 1 && !selected && n > 0 && k > 0 && k.is_multiple_of(VEC) && ng > 0 && n.is_multiple_of(ng) && (ng == n || ng.is_multiple_of(ROWS))
}

/// Blocks of a launch over `n` rows.
pub fn blocks(n: usize) -> u32 {
    n.div_ceil(ROWS) as u32
}

/// The CUDA source. Launch: grid [`blocks`], [`THREADS`] threads.
pub fn source() -> String {
    let mut s = format!("// {NAME}: a decode token's F16 mat-vec in 16-byte loads (codegen/src/cuda_f16_vec.rs).\n\n");
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    s.push_str(&format!(
        r#"
// Σ of the eight halves of q times x[0..8], added to s in order.
__device__ __forceinline__ float ds4_dot8(const uint4 q, const float4 a, const float4 b, float s) {{
    s = fmaf(ds4_f16_to_f32_dot(q.x & 0xffffu), a.x, s); s = fmaf(ds4_f16_to_f32_dot(q.x >> 16), a.y, s);
    s = fmaf(ds4_f16_to_f32_dot(q.y & 0xffffu), a.z, s); s = fmaf(ds4_f16_to_f32_dot(q.y >> 16), a.w, s);
    s = fmaf(ds4_f16_to_f32_dot(q.z & 0xffffu), b.x, s); s = fmaf(ds4_f16_to_f32_dot(q.z >> 16), b.y, s);
    s = fmaf(ds4_f16_to_f32_dot(q.w & 0xffffu), b.z, s); s = fmaf(ds4_f16_to_f32_dot(q.w >> 16), b.w, s);
    return s;
}}

{entry}    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned long long r0 = (unsigned long long)blockIdx.x * {ROWS}ull;
    const unsigned int vecs = (unsigned int)(k / {VEC}ull);
    const float* const x = ds4_x + (r0 / ng) * k;
    const uint4* row[{ROWS}];
    float acc[{ROWS}];
    #pragma unroll
    for (int r = 0; r < {ROWS}; r++) {{
        const unsigned long long rr = r0 + r < n ? r0 + r : n - 1ull;
        row[r] = (const uint4*)(ds4_w + rr * k * 2ull);
        acc[r] = 0.0f;
    }}
    #pragma unroll 4
    for (unsigned int v = warp * 32u + lane; v < vecs; v += {THREADS}u) {{
        uint4 q[{ROWS}];
        #pragma unroll
        for (int r = 0; r < {ROWS}; r++) q[r] = __ldg(row[r] + v);
        const float4 a = *(const float4*)(x + {VEC}u * v);
        const float4 b = *(const float4*)(x + {VEC}u * v + 4u);
        #pragma unroll
        for (int r = 0; r < {ROWS}; r++) acc[r] = ds4_dot8(q[r], a, b, acc[r]);
    }}
    // The lanes' sums, then the warps' in order.
    __shared__ float part[{WARPS}][{ROWS}];
    #pragma unroll
    for (int r = 0; r < {ROWS}; r++) {{
        float s = acc[r];
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0u) part[warp][r] = s;
    }}
    __syncthreads();
    if (threadIdx.x < {ROWS}u && r0 + threadIdx.x < n) {{
        float t = 0.0f;
        #pragma unroll
        for (int w = 0; w < {WARPS}; w++) t += part[w][threadIdx.x];
        ds4_out[r0 + threadIdx.x] = t;
    }}
}}
"#,
        entry = crate::cuda::own_entry(NAME, &THREADS.to_string(), &params())
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_one_token_of_whole_vectors_and_grouped_rows() {
        assert!(fits(256, 4096, 256, 1, false) && fits(8192, 1024, 8192, 1, false) && fits(8, 64, 4, 1, false));
        assert!(!fits(256, 4096, 256, 2, false), "one token");
        assert!(!fits(256, 4096, 256, 1, true), "every row");
        assert!(!fits(256, 4092, 256, 1, false), "whole vectors");
        assert!(fits(255, 4096, 255, 1, false), "one group: any rows");
        assert!(!fits(12, 64, 3, 1, false), "a block's rows in one group");
        assert!(!fits(0, 4096, 1, 1, false));
    }

    #[test]
    fn blocks_cover_every_row() {
        assert_eq!(blocks(256), 128);
        assert_eq!(blocks(3), 2);
    }
}
