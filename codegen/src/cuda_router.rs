//! `router_select`: a token's MoE routing in one launch, CUDA text: the router scores
//! (`router_scores`: √softplus of the logits), the selection scores (`router_biased`: plus
//! the bias), their top k (`top_k_sort`'s keys and sort) and the picks' weights
//! (`router_weights`), four kernels of ~2-5 µs each at decode, 40 layers a step.
//!
//! Block t takes token t: its scores and selection keys into shared memory; then, for rows
//! of up to [`SELECT_MAX_N`] experts, warp 0 takes the k largest keys one at a time (each
//! a warp maximum over the lanes' keys, two `redux.sync` of 32 bits; the keys are held in
//! registers for rows of up to 32 · `LANE_KEYS` experts, scanned in shared memory for
//! longer ones; the keys are distinct, so these are the first k keys of the sorted row),
//! else the whole block sorts the keys (`top_k_sort`'s network); then the warp writes the
//! picks and their weights, lane j pick j. (The sort's 36 barriers for 256 experts made
//! the launch 7.4 µs on the H200.) The floats are the four
//! kernels' (the same expressions; the weights' sum by the same shuffle tree as
//! `router_weights` run by one warp, which is how the runtime launches it for k ≤ 32), so
//! the picks and weights are theirs bit for bit (`cuda_kernels` checks). A place past the
//! chosen scores is -1 with weight 0 (the generated `router_weights` would read outside the
//! row there; the router's scores are finite, so it does not happen).
//!
//! The runtime finds the chain in the graph (`runtime/src/cuda/router.rs`) for rows of up
//! to [`cuda_top_k::MAX_N`] experts and k ≤ [`MAX_K`]; `DS4_ROUTER=0` turns it off.

use crate::quant::{BufElem, QParam};
use crate::{cuda_digits, cuda_top_k, Target};

/// Kernel name.
pub const NAME: &str = "router_select";
/// The kernel that also makes x's digits for the experts (`with_digits_source`).
pub const WITH_DIGITS: &str = "router_select_digits";
/// The most picks (a warp's lanes).
pub const MAX_K: usize = 32;
/// The longest row whose picks one warp selects (32 keys a lane); longer rows are sorted.
pub const SELECT_MAX_N: usize = 1024;
/// Keys a lane of the selecting warp holds in registers (rows of up to 32 × this many
/// experts; longer rows select on shared memory).
const LANE_KEYS: usize = 8;
/// The most tokens the runtime gives it (a decode step's; prefills keep the four kernels,
/// where the launch count matters less and it has not been measured).
pub const MAX_TOKENS: usize = 8;

/// Parameters in launch order. `normalize` is 0 or 1. With `pnh` 0 the logits are read
/// from `logits`; else they are made from the parts an `hc_pre` launch's router blocks
/// wrote (`parts`, `pnh` a row, its pre weights the first of `pmw` in `pmix`, its norm's
/// scale `pinv`: `cuda_hc_pre::router_blocks`).
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "sel", elem: BufElem::I32, mutable: true },
        QParam::Buffer { name: "wts", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "logits", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "bias", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "k" },
        QParam::Float { name: "scale" },
        QParam::Scalar { name: "normalize" },
        QParam::Buffer { name: "parts", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "pmix", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "pinv", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "pnh" },
        QParam::Scalar { name: "pmw" },
    ]
}

/// Whether a router of `n` experts and `k` picks fits the kernel.
pub fn fits(n: usize, k: usize) -> bool {
    (1..=cuda_top_k::MAX_N).contains(&n) && (1..=MAX_K).contains(&k)
}

/// Threads of a launch over `n` experts (as `top_k_sort`'s).
pub fn threads(n: usize) -> u32 {
    cuda_top_k::threads(n)
}

/// Dynamic shared memory of a launch over `n` experts: the keys, then the scores.
pub fn shared_bytes(n: usize) -> u32 {
    cuda_top_k::shared_bytes(n) + (4 * n) as u32
}

/// The most dynamic shared memory a launch asks for.
pub const MAX_SHARED_BYTES: u32 = cuda_top_k::MAX_SHARED_BYTES + (4 * cuda_top_k::MAX_N) as u32;

/// The CUDA source. Launch: grid (tokens), [`threads`]`(n)` threads, [`shared_bytes`]`(n)`.
pub fn source() -> String {
    format!(
        "// {NAME}: a token's router scores, selection, top k and weights in one launch (codegen/src/cuda_router.rs).\n{}{}    ds4_router_block(blockIdx.x, {});\n}}\n",
        router_block(),
        crate::cuda::own_entry(NAME, &cuda_top_k::MAX_THREADS.to_string(), &params()),
        crate::quant::cuda::c_args(&params())
    )
}

/// `router_select` with x's digits ([`WITH_DIGITS`]): blocks 0 .. tokens route token
/// `blockIdx.x` as `router_select` does, the blocks after them make the digits of x (the
/// experts' input, `xk` floats: a decode token's) as `x_digits` does with `blockIdx.x −
/// tokens` (`cuda_digits.rs`). The two are independent and each ~2-5 µs at decode; in one
/// launch the digits' blocks run beside the routing on SMs it leaves idle, and the launch
/// before the experts' gate and up is one, not two. The same floats as the two kernels
/// (`cuda_kernels`). Launch: grid (tokens + `x_digits_blocks`, with the router's
/// [`threads`]), [`threads`]`(n)` threads, [`shared_bytes`]`(n)`. None off CUDA.
pub fn with_digits_source(target: Target) -> Option<String> {
    Some(format!(
        // The digits' blocks pass x_digits' parameters by hand: x as both x and u (no
        // SwiGLU), its length `xk`.
        "// {WITH_DIGITS}: {NAME} and x_digits in one launch (codegen/src/cuda_router.rs).\n{}{}{}    if (blockIdx.x < tokens) {{\n        ds4_router_block(blockIdx.x, {});\n    }} else {{\n        ds4_x_digits_block(blockIdx.x - tokens, ds4_xd, ds4_xs, ds4_xsum, ds4_x, ds4_x, xk, 0.0f, 0ull);\n    }}\n}}\n",
        router_block(),
        cuda_digits::x_digits_block(target)?,
        crate::cuda::own_entry(WITH_DIGITS, &cuda_top_k::MAX_THREADS.to_string(), &with_digits_params()),
        crate::quant::cuda::c_args(&params())
    ))
}

/// Parameters of [`WITH_DIGITS`] in launch order: [`params`], then x's digits, scales and
/// sums (outputs), x and its length, and the routed tokens (the blocks before the digits').
pub fn with_digits_params() -> Vec<QParam> {
    let mut p = params();
    // x_digits' outputs and x (its first four), then x's length under a name of its own.
    p.extend(cuda_digits::x_digits_params().into_iter().take(4));
    p.extend([QParam::Scalar { name: "xk" }, QParam::Scalar { name: "tokens" }]);
    p
}

/// A routing block's work as a device function of the token `block` and `router_select`'s
/// parameters, with the top-k helpers it needs.
fn router_block() -> String {
    let mut s = String::from(cuda_top_k::HELPERS);
    s.push_str(&format!(
        r#"
// Block `block` of a router_select launch: token `block`'s routing.
__device__ __forceinline__ void ds4_router_block(const unsigned long long block, {params}) {{
    extern __shared__ unsigned long long ds4_keys[];
    const unsigned long long item = block;
    const unsigned int nn = (unsigned int)n;
    const unsigned int len = ds4_sort_len(nn);
    float* const scores = (float*)(ds4_keys + len);
    // Scores (`router_scores`), selection keys of the biased scores (`router_biased`).
    for (unsigned int e = threadIdx.x; e < len; e += blockDim.x) {{
        unsigned long long key = 0ull;
        if (e < nn) {{
            // The logits, or (`pnh` streams) the parts `hc_pre` made of them: the normed
            // collapse's products, inv · Σ_i pre_i · P[e][i] (`cuda_hc_pre`'s router part).
            float x;
            if (pnh == 0ull) {{
                x = ds4_logits[item * n + e];
            }} else {{
                const float* const pp = ds4_parts + (item * n + e) * pnh;
                float t = 0.0f;
                for (unsigned int i = 0u; i < (unsigned int)pnh; i++) t = fmaf(ds4_pmix[item * pmw + i], pp[i], t);
                x = ds4_pinv[item] * t;
            }}
            float sp = x;
            if (x <= 20.0f) {{
                sp = log1pf(expf(x));
            }}
            const float s = sqrtf(sp);
            scores[e] = s;
            key = ds4_top_k_key(s + ds4_bias[e], e);
        }}
        ds4_keys[e] = key;
    }}
    __syncthreads();
    const bool select = len <= {select_max}u;
    if (!select) {{
        ds4_sort_keys(ds4_keys, len);
    }}
    // Picks and weights (`router_weights` by one warp: its sum is this shuffle tree).
    if (threadIdx.x < 32u) {{
        const unsigned int j = threadIdx.x;
        const bool on = j < (unsigned int)k;
        int pick = -1;
        if (select && len <= {lane_keys}u * 32u) {{
            // Lane j holds keys j, j + 32, ... in registers. Round r: the largest of the
            // lanes' largest is pick r (0: none left, nor after it), and the lane holding
            // it (the keys are distinct) clears it. The same picks as the rounds on shared
            // memory below, without their loads and stores: 2.05 -> 1.29 µs for 256
            // experts and 6 picks (H200, a globaltimer read in the block).
            unsigned long long mine[{lane_keys}];
            #pragma unroll
            for (unsigned int i = 0u; i < {lane_keys}u; i++) mine[i] = j + 32u * i < len ? ds4_keys[j + 32u * i] : 0ull;
            for (unsigned int r = 0u; r < (unsigned int)k; r++) {{
                unsigned long long best = 0ull;
                #pragma unroll
                for (unsigned int i = 0u; i < {lane_keys}u; i++) best = mine[i] > best ? mine[i] : best;
                best = ds4_warp_max_key(best);
                if (best == 0ull) {{
                    break;
                }}
                if (j == r) {{
                    pick = ds4_top_k_index(best);
                }}
                #pragma unroll
                for (unsigned int i = 0u; i < {lane_keys}u; i++) mine[i] = mine[i] == best ? 0ull : mine[i];
            }}
        }} else if (select) {{
            // Round r: the largest key left is pick r (0: none left, nor after it); its
            // place is cleared for the next round.
            for (unsigned int r = 0u; r < (unsigned int)k; r++) {{
                unsigned long long best = 0ull;
                for (unsigned int e = j; e < len; e += 32u) {{
                    const unsigned long long key = ds4_keys[e];
                    best = key > best ? key : best;
                }}
                best = ds4_warp_max_key(best);
                if (best == 0ull) {{
                    break;
                }}
                const int idx = ds4_top_k_index(best);
                if (j == r) {{
                    pick = idx;
                }}
                if (j == 0u) {{
                    ds4_keys[idx] = 0ull;
                }}
                __syncwarp();
            }}
        }} else if (on && ds4_keys[j] != 0ull) {{
            // Sorted, the keys that were never chosen (0) come last.
            pick = ds4_top_k_index(ds4_keys[j]);
        }}
        const float s = pick >= 0 ? scores[pick] : 0.0f;
        float sum = s;
        for (int o = 16; o > 0; o >>= 1) {{
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        }}
        if (on) {{
            const float sc = scale;
            ds4_sel[item * k + j] = pick;
            ds4_wts[item * k + j] = normalize != 0ull ? sc * s / (sum + 1e-20f) : sc * s;
        }}
    }}
}}
"#,
        params = crate::quant::cuda::c_params(&params()),
        select_max = SELECT_MAX_N,
        lane_keys = LANE_KEYS,
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_warp_of_picks() {
        assert!(fits(256, 6) && fits(cuda_top_k::MAX_N, MAX_K));
        assert!(!fits(0, 6) && !fits(256, 0) && !fits(256, MAX_K + 1) && !fits(cuda_top_k::MAX_N + 1, 6));
        assert_eq!(shared_bytes(256), 256 * 8 + 256 * 4);
    }

}
