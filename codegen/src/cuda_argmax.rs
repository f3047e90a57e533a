//! `argmax_rows`: the greedy pick of each row of logits on the device, CUDA text.
//!
//! A greedy decode step otherwise ends with the whole logits row read back (129,280 floats,
//! ~0.5 MB on DeepSeek-V4-Flash) and scanned on the host, and the next step starts with
//! the picked id written back: two synchronizations, between which the GPU idles. Here the
//! pick stays on the device, where the next step's embedding reads it, and is also written
//! to host memory the host can read when it likes (page-locked, mapped): the host can queue
//! step k + 1 before it knows token k (`runtime/src/cuda/session.rs`, `decode_greedy`).
//!
//! The pick is `ds4_runtime::sample::argmax`'s: the lowest index of the largest value,
//! NaNs never picked, 0 where nothing beats −∞. Thread t scans indices t, t + T, ... with a
//! strict `>` (so its lowest index of its largest value), [`BATCH`] loads at a time (or,
//! where the row is whole aligned quads, quads 4t.. in [`QUADS`] 16-byte loads), then
//! the block reduces the (value, index) pairs, a larger value or an equal one at a lower
//! index winning.

use crate::quant::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "argmax_rows";
/// Threads a block (a block a row).
pub const THREADS: u32 = 1024;
/// Values a thread loads before it compares them.
const BATCH: u32 = 16;
/// Four-value loads a thread makes before it compares them (rows of whole, aligned quads).
const QUADS: u32 = 8;

/// Parameters in launch order: the picks on the device (`picked`, an i32 a row) and in
/// mapped host memory (`picked_host`, the same), the logits (`x`, rows of `n`).
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "picked", elem: BufElem::I32, mutable: true },
        QParam::Buffer { name: "picked_host", elem: BufElem::I32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
    ]
}

/// The CUDA source. Launch: grid [rows, 1, 1], [`THREADS`] threads.
pub fn source() -> String {
    format!(
        r#"// {NAME}: each row's greedy pick, kept on the device and written to mapped host memory (codegen/src/cuda_argmax.rs).
// The warp's best (value, index) in every lane: a larger value, or the same one at a
// lower index, wins.
__device__ __forceinline__ void ds4_argmax_warp(float& bv, unsigned int& bi) {{
    for (int o = 16; o > 0; o >>= 1) {{
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const unsigned int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {{
            bv = ov;
            bi = oi;
        }}
    }}
}}
// A thread's scan: value v at index i replaces the best only if larger (so, taken in index
// order, the lowest index of the largest value; a NaN never).
__device__ __forceinline__ void ds4_argmax_take(const float v, const unsigned int i, float& bv, unsigned int& bi) {{
    if (v > bv) {{
        bv = v;
        bi = i;
    }}
}}
// The four values of quad q (indices 4q ..), in order.
__device__ __forceinline__ void ds4_argmax_take4(const float4 v, const unsigned int q, float& bv, unsigned int& bi) {{
    ds4_argmax_take(v.x, 4u * q, bv, bi);
    ds4_argmax_take(v.y, 4u * q + 1u, bv, bi);
    ds4_argmax_take(v.z, 4u * q + 2u, bv, bi);
    ds4_argmax_take(v.w, 4u * q + 3u, bv, bi);
}}
{entry}    __shared__ float ds4_best_v[32];
    __shared__ unsigned int ds4_best_i[32];
    const float* const row = ds4_x + (unsigned long long)blockIdx.x * n;
    // Nothing beats -inf: an index past the row stands for "none" (row index 0 then).
    float bv = __int_as_float(0xff800000);
    unsigned int bi = 0xffffffffu;
    // {BATCH} loads in flight a thread, then their values in index order: one scan of the
    // row is otherwise {BATCH} times as many dependent trips to memory (H200, 129,280
    // logits: 49.7 µs a step as one load at a time, 16.0 with these batches; the quads
    // below were not timed apart).
    const unsigned int t = blockDim.x;
    unsigned int i = threadIdx.x;
    if (n % 4ull == 0ull && ((unsigned long long)row & 15ull) == 0ull) {{
        // Four values a load where the row allows: thread t takes quads t, t + T, ...
        const float4* const quads = (const float4*)row;
        const unsigned int nq = (unsigned int)(n / 4ull);
        unsigned int j = threadIdx.x;
        for (; j + ({QUADS}u - 1u) * t < nq; j += {QUADS}u * t) {{
            float4 q[{QUADS}];
            #pragma unroll
            for (unsigned int u = 0; u < {QUADS}u; u++) q[u] = quads[j + u * t];
            #pragma unroll
            for (unsigned int u = 0; u < {QUADS}u; u++) ds4_argmax_take4(q[u], j + u * t, bv, bi);
        }}
        for (; j < nq; j += t) ds4_argmax_take4(quads[j], j, bv, bi);
        i = (unsigned int)n;
    }}
    for (; i + ({BATCH}u - 1u) * t < (unsigned int)n; i += {BATCH}u * t) {{
        float v[{BATCH}];
        #pragma unroll
        for (unsigned int u = 0; u < {BATCH}u; u++) v[u] = row[i + u * t];
        #pragma unroll
        for (unsigned int u = 0; u < {BATCH}u; u++) ds4_argmax_take(v[u], i + u * t, bv, bi);
    }}
    for (; i < (unsigned int)n; i += t) ds4_argmax_take(row[i], i, bv, bi);
    ds4_argmax_warp(bv, bi);
    const unsigned int warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
    if (lane == 0u) {{
        ds4_best_v[warp] = bv;
        ds4_best_i[warp] = bi;
    }}
    __syncthreads();
    if (warp == 0u) {{
        const unsigned int warps = (blockDim.x + 31u) / 32u;
        bv = lane < warps ? ds4_best_v[lane] : __int_as_float(0xff800000);
        bi = lane < warps ? ds4_best_i[lane] : 0xffffffffu;
        ds4_argmax_warp(bv, bi);
        if (lane == 0u) {{
            const int pick = bi == 0xffffffffu ? 0 : (int)bi;
            ds4_picked[blockIdx.x] = pick;
            ds4_picked_host[blockIdx.x] = pick;
        }}
    }}
}}
"#,
        entry = crate::cuda::own_entry(NAME, &THREADS.to_string(), &params())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declares_its_parameters() {
        crate::cuda::assert_declares_params(&source(), NAME, &params());
    }
}
