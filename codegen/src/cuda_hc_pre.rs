//! `hc_pre`: a decode token's hyper-connection "pre" chain in one launch, CUDA text.
//!
//! Before each attention and each FFN, the graph (`model/src/builder.rs`, `hc_mix`) runs
//! four ops on one token: a plain RMS norm of the flattened streams (nh·d values), their
//! projection to 2·nh + nh² mixing weights (an F16 mat-vec), the mix (`hc_mix`, Sinkhorn)
//! and the collapse (`hc_collapse`, the pre-weighted sum of the streams), then the
//! sublayer's weighted RMS norm of the collapse. At decode each is a kernel of a few µs
//! that mostly waits (H200, Nsight Compute: norm 7.0 µs in one block, projection 10.7 µs
//! in 24 blocks, mix 8.7, collapse 3.3, weighted norm 3.9-5.0), 86 times a step.
//!
//! Here block r of token t (1024 threads) reads the token's streams once, four floats a
//! load, for both the norm's Σ x² and projection row r's Σ w·x, and stores Σ w·x / rms
//! (the normed streams' projection, scaled once instead of per element); the last of
//! the token's blocks to finish (a ticket from `counters`, which it resets) runs the mix
//! in one warp (`cuda_hc_mix`'s lanes, the same floats as `hc_mix` given the
//! projections): its pre and post weights first, then its Sinkhorn matrix, which only
//! `hc_expand` reads after the sublayer, while the other 31 warps make the collapse
//! (`hc_collapse`'s order, from the pre weights alone) and, where the graph norms the
//! collapse (`has_norm`), that norm (`rms_norm`'s arithmetic, its sum in another order).
//! (The Sinkhorn is ~7 µs of the kernel's ~15 on the H200, the collapse and norm ~2.4;
//! the Sinkhorn as a launch beside the sublayer's, a side branch of the step's graph,
//! measured no faster: RESULTS.md, ninth stop.) The
//! projections differ from the four kernels' in the last bits (other orders of the
//! sums, one scaling); `cuda_kernels` holds them to 2e-5. The runtime uses it for the
//! decode's few tokens (`MAX_TOKENS`), F16 projections and nh ≤ `cuda_hc_mix::MAX_NH`;
//! prefills keep the four kernels (their projection is a tensor-core matmul).

use crate::cuda_hc_mix;
use crate::quant::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "hc_pre";
/// Threads per block.
pub const THREADS: u32 = 1024;
/// The most tokens a launch takes (one ticket counter each).
pub const MAX_TOKENS: usize = 8;

/// Parameters in launch order. `eps_norm`, `eps_mix` and `eps_a` are f32 bit patterns;
/// `a` and `norm_w` are read and written only when `has_norm` is 1.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "mix", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "y", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "a", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "proj", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "counters", elem: BufElem::I32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "w", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "scale", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "base", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "norm_w", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "nh" },
        QParam::Scalar { name: "d" },
        QParam::Scalar { name: "iters" },
        QParam::Scalar { name: "eps_norm" },
        QParam::Scalar { name: "eps_mix" },
        QParam::Scalar { name: "has_norm" },
        QParam::Scalar { name: "eps_a" },
    ]
}

/// Whether a chain of `nh` streams of `d` values and `tokens` tokens can take the fused
/// kernel (it reads the streams four floats at a time: `d` a multiple of 4, and the
/// streams 16-byte aligned, which the runtime checks).
pub fn fits(nh: usize, d: usize, tokens: usize) -> bool {
    cuda_hc_mix::fits(nh) && d.is_multiple_of(4) && (1..=MAX_TOKENS).contains(&tokens)
}

/// The CUDA source. Launch: grid (2·nh + nh², tokens), `THREADS` threads.
pub fn source() -> String {
    let mut s = format!("// {NAME}: a token's plain RMS norm, projection, mix and collapse in one launch (codegen/src/cuda_hc_pre.rs).\n\n");
    s.push_str(&format!("#define DS4_MAX_NH {}u\n", cuda_hc_mix::MAX_NH));
    s.push_str(cuda_hc_mix::HELPERS);
    s.push_str(crate::cuda::BLOCK_SUM);
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    s.push_str(&format!(
        r#"
// Four halves (8 bytes) as floats.
__device__ __forceinline__ float4 ds4_half4(const uint2 h) {{
    return make_float4(ds4_f16_to_f32_dot(h.x & 0xffffu), ds4_f16_to_f32_dot(h.x >> 16), ds4_f16_to_f32_dot(h.y & 0xffffu), ds4_f16_to_f32_dot(h.y >> 16));
}}

// Σ of v over the block's threads past warp 0 (warp 0 is elsewhere: named barrier 1).
__device__ float ds4_sum_past_warp0(float v) {{
    __shared__ float ds4_red0[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31u) == 0u) ds4_red0[threadIdx.x >> 5] = v;
    asm volatile("bar.sync 1, %0;" :: "r"(blockDim.x - 32u) : "memory");
    float s = 0.0f;
    for (unsigned w = 1; w < (blockDim.x + 31u) >> 5; w++) s += ds4_red0[w];
    return s;
}}

{entry}    const unsigned int item = blockIdx.y;
    const unsigned int row = blockIdx.x;
    const unsigned int h = (unsigned int)nh;
    const unsigned int mw = 2 * h + h * h;
    const unsigned int n4 = h * (unsigned int)d / 4;
    const float4* const x = (const float4*)(ds4_x + (unsigned long long)item * nh * d);
    const uint2* const wr = (const uint2*)(ds4_w + (unsigned long long)row * nh * d * 2);
    // One pass: Σ x² (the norm) and Σ w·x (the projection row), four values a load.
    float ss_part = 0.0f, dot_part = 0.0f;
    #pragma unroll 4
    for (unsigned int i = threadIdx.x; i < n4; i += blockDim.x) {{
        const float4 v = x[i];
        const float4 w = ds4_half4(wr[i]);
        ss_part += v.x * v.x; ss_part += v.y * v.y; ss_part += v.z * v.z; ss_part += v.w * v.w;
        dot_part = fmaf(w.x, v.x, dot_part); dot_part = fmaf(w.y, v.y, dot_part);
        dot_part = fmaf(w.z, v.z, dot_part); dot_part = fmaf(w.w, v.w, dot_part);
    }}
    const float ss = ds4_block_sum(ss_part);
    const float dot = ds4_block_sum(dot_part);
    // The token's last block to finish goes on: its ticket is mw - 1.
    __shared__ bool last;
    if (threadIdx.x == 0) {{
        // The normed streams' projection: Σ w·x scaled by the norm's 1 / rms.
        const float inv = 1.0f / sqrtf(ss / (float)(4 * n4) + __uint_as_float((unsigned int)eps_norm));
        ds4_proj[item * mw + row] = dot * inv;
        __threadfence();
        last = atomicAdd(&ds4_counters[item], 1) == (int)mw - 1;
    }}
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The projections from L2 (other blocks wrote them), then the mix by warp 0.
    __shared__ float m[2 * DS4_MAX_NH + DS4_MAX_NH * DS4_MAX_NH];
    if (threadIdx.x < mw) m[threadIdx.x] = __ldcg(ds4_proj + item * mw + threadIdx.x);
    if (threadIdx.x == 0) ds4_counters[item] = 0;
    __syncthreads();
    float* const mix = ds4_mix + item * mw;
    if (threadIdx.x < 32) ds4_hc_pre_post_lane(mix, m, ds4_scale, ds4_base, h, __uint_as_float((unsigned int)eps_mix), threadIdx.x);
    __syncthreads();
    // Warp 0 runs the Sinkhorn (read only by `hc_expand`, after the sublayer) while the
    // other warps collapse the streams and norm the collapse, which need the pre weights
    // alone.
    if (threadIdx.x < 32) {{
        ds4_hc_comb_lane(mix, m, ds4_scale, ds4_base, h, iters, __uint_as_float((unsigned int)eps_mix), threadIdx.x);
        return;
    }}
    const unsigned int t = threadIdx.x - 32, nt = blockDim.x - 32;
    // The collapse (`hc_collapse`): the streams weighted by the mix's first nh entries,
    // added left to right, four outputs a thread at a time.
    float pre[DS4_MAX_NH];
    #pragma unroll
    for (unsigned int i = 0; i < DS4_MAX_NH; i++) pre[i] = i < h ? mix[i] : 0.0f;
    const unsigned int d4 = (unsigned int)d / 4;
    float4* const y = (float4*)(ds4_y + (unsigned long long)item * d);
    float yy_part = 0.0f;
    for (unsigned int c = t; c < d4; c += nt) {{
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        #pragma unroll
        for (unsigned int i = 0; i < DS4_MAX_NH; i++) {{
            if (i < h) {{
                const float4 v = x[i * d4 + c];
                acc.x += pre[i] * v.x; acc.y += pre[i] * v.y; acc.z += pre[i] * v.z; acc.w += pre[i] * v.w;
            }}
        }}
        y[c] = acc;
        yy_part += acc.x * acc.x; yy_part += acc.y * acc.y; yy_part += acc.z * acc.z; yy_part += acc.w * acc.w;
    }}
    if (has_norm == 0) return;
    // The collapse's weighted RMS norm (`rms_norm`: y · inv · w), each thread re-reading
    // the outputs it wrote.
    const float yy = ds4_sum_past_warp0(yy_part);
    const float inv_a = 1.0f / sqrtf(yy / (float)d + __uint_as_float((unsigned int)eps_a));
    const float4* const nw = (const float4*)ds4_norm_w;
    float4* const a = (float4*)(ds4_a + (unsigned long long)item * d);
    for (unsigned int c = t; c < d4; c += nt) {{
        const float4 v = y[c];
        const float4 g = nw[c];
        a[c] = make_float4(v.x * inv_a * g.x, v.y * inv_a * g.y, v.z * inv_a * g.z, v.w * inv_a * g.w);
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
    fn fits_decode_tokens_of_a_warp_sized_mix() {
        assert!(fits(4, 4096, 1) && fits(4, 4096, MAX_TOKENS));
        assert!(!fits(4, 4096, 0) && !fits(4, 4096, MAX_TOKENS + 1) && !fits(6, 4096, 1) && !fits(4, 4098, 1));
    }

    #[test]
    fn source_declares_every_parameter_in_order() {
        crate::cuda::assert_declares_params(&source(), NAME, &params());
    }
}
