//! `hc_mix_warp`: `hc_mix` for CUDA, written as CUDA text, one warp per token, with the
//! same parameters and output and the same operations in the same order (so the same
//! floats, bit for bit, as the generated `hc_mix`).
//!
//! The mix's Sinkhorn normalization runs `2·iters` dependent passes over an nh × nh
//! matrix (DS4: 4 × 4, 20 iterations). The generated kernel gives each pass's rows or
//! columns to nh threads, which read, divide and write their nh entries one after another
//! (the compiler cannot tell the loads from the stores apart) between block barriers, 86
//! calls a decode step. Here lane `i·nh + j` holds entry (i, j) in a register: a pass is
//! nh shuffles, the same left-to-right sum, and one division per lane, with no barrier
//! and no memory (H200: 17.6 → 11.9 µs a call as Nsight Compute times kernels alone;
//! decode 47.2 → 48.3 t/s with `top_k`'s scan change). It needs nh² ≤ 32 ([`fits`]); the
//! runtime runs the generated kernel otherwise.

use crate::Target;
use ds4_ir::kir::Kernel;

/// The kernel's entry point.
pub const NAME: &str = "hc_mix_warp";
/// Threads per block: one warp, a block per token.
pub const THREADS: u32 = 32;

/// The most streams whose nh × nh matrix fits a warp, a lane per entry.
pub const MAX_NH: usize = 5;
const _: () = assert!(MAX_NH * MAX_NH <= THREADS as usize && (MAX_NH + 1) * (MAX_NH + 1) > THREADS as usize);

/// Whether a mix of `nh` streams fits a warp.
pub fn fits(nh: usize) -> bool {
    (1..=MAX_NH).contains(&nh)
}

/// The IR kernel whose parameters and output layout `hc_mix_warp` shares.
pub fn contract() -> Kernel {
    ds4_ir::kernels::hc::hc_mix_kir()
}

/// The kernel's CUDA source for a CUDA target (`None` for the others).
pub fn source(target: Target) -> Option<String> {
    let helpers = format!("\n#define DS4_MAX_NH {MAX_NH}u{HELPERS}");
    crate::cuda::text_kernel(target, NAME, "codegen/src/cuda_hc_mix.rs", &helpers, &THREADS.to_string(), &contract(), BODY)
}

/// The mix of one token by one warp, and its helpers (also `cuda_hc_pre.rs`'s).
pub(crate) const HELPERS: &str = r#"
__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// Σ over q < nh of lane (first + q·step)'s v, added left to right (the reference's order).
// The shuffles all go out before the first addition: a pass waits for one shuffle's
// latency, not nh of them.
__device__ __forceinline__ float ds4_lane_sum(const float v, const unsigned int first, const unsigned int step, const unsigned int nh) {
    float t[DS4_MAX_NH];
    #pragma unroll
    for (unsigned int q = 0; q < DS4_MAX_NH; q++) {
        t[q] = __shfl_sync(0xffffffffu, v, (first + q * step) & 31u);
    }
    float s = 0.0f;
    #pragma unroll
    for (unsigned int q = 0; q < DS4_MAX_NH; q++) {
        if (q < nh) {
            s += t[q];
        }
    }
    return s;
}
// Entry r < 2·nh of `hc_mix` from its projection p: a pre weight (r < nh), else a post one.
__device__ __forceinline__ float ds4_hc_pre_post_entry(const float p, const float* __restrict__ scale, const float* __restrict__ base, const unsigned int h, const float eps, const unsigned int r) {
    return r < h ? sigmoid(p * scale[0] + base[r]) + eps : 2.0f * sigmoid(p * scale[1] + base[r]);
}
// The pre and post weights of `hc_mix` (its first 2·nh outputs), lanes below nh.
__device__ __forceinline__ void ds4_hc_pre_post_lane(float* const o, const float* const m, const float* __restrict__ scale, const float* __restrict__ base, const unsigned int h, const float eps, const unsigned int lane) {
    if (lane < h) {
        o[lane] = ds4_hc_pre_post_entry(m[lane], scale, base, h, eps, lane);
        o[h + lane] = ds4_hc_pre_post_entry(m[h + lane], scale, base, h, eps, h + lane);
    }
}
// `hc_mix`'s combination matrix (outputs 2·nh ..), Sinkhorn-normalized by one warp
// (`lane` 0..32): lane i·nh + j holds entry (i, j).
__device__ __forceinline__ void ds4_hc_comb_lane(float* const o, const float* const m, const float* __restrict__ scale, const float* __restrict__ base, const unsigned int h, const unsigned long long iters, const float eps, const unsigned int lane) {
    // This lane's entry (i, j) of comb. Lanes past nh² compute on a logit of 0 and write
    // nothing: no entry's row or column sum reads them, and finite values keep the warp's
    // divisions on their fast path (on -inf those lanes were NaN, and at each of the 40
    // passes the whole warp waited on the division's slow path: `hc_pre` 13.3 -> 10.0 µs
    // on the H200).
    const bool on = lane < h * h;
    const unsigned int i = lane / h;
    const unsigned int j = lane % h;
    const unsigned int k = 2 * h + lane;
    const float logit = on ? m[k] * scale[2] + base[k] : 0.0f;
    // Softmax over row i, plus eps.
    float mx = __int_as_float(0xff800000);
    #pragma unroll
    for (unsigned int q = 0; q < DS4_MAX_NH; q++) {
        const float t = __shfl_sync(0xffffffffu, logit, (i * h + q) & 31u);
        if (q < h) {
            mx = fmaxf(mx, t);
        }
    }
    const float e = expf(logit - mx);
    float v = e / ds4_lane_sum(e, i * h, 1u, h) + eps;
    // Columns first, then iters - 1 rounds of rows then columns.
    v = v / (ds4_lane_sum(v, j, h, h) + eps);
    for (unsigned long long it = 1; it < iters; it++) {
        v = v / (ds4_lane_sum(v, i * h, 1u, h) + eps);
        v = v / (ds4_lane_sum(v, j, h, h) + eps);
    }
    if (on) {
        o[k] = v;
    }
}
// `hc_mix` of one token whose 2·nh + nh² projections are `m`, into `o`, by one warp.
__device__ __forceinline__ void ds4_hc_mix_lane(float* const o, const float* const m, const float* __restrict__ scale, const float* __restrict__ base, const unsigned int h, const unsigned long long iters, const float eps, const unsigned int lane) {
    ds4_hc_pre_post_lane(o, m, scale, base, h, eps, lane);
    ds4_hc_comb_lane(o, m, scale, base, h, iters, eps, lane);
}
"#;

const BODY: &str = r#"    const usize item = blockIdx.x;
    const usize mw = 2 * nh + nh * nh;
    ds4_hc_mix_lane(out + item * mw, m + item * mw, scale, base, (unsigned int)nh, iters, eps, threadIdx.x);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_up_to_a_warp_of_entries() {
        assert!(fits(1) && fits(4) && fits(5));
        assert!(!fits(0) && !fits(6));
    }
}
