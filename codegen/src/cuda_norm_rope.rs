//! `norm_rope`: an RMS norm, the RoPE of its rows, and optionally the FP8 round trip, in one
//! launch, CUDA text.
//!
//! The attention makes its queries and its KV row in chains of per-row ops
//! (`model/src/builder.rs`): each query head `rms_norm_plain → rope`, the KV row `rms_norm →
//! rope → fp8_roundtrip`. At decode each op is a launch of a few µs over 64 or one rows of
//! 512 values, three a layer (129 a step on DeepSeek-V4-Flash). Here block `item` norms its
//! row into shared memory (the same loop and block sum as `rms_norm`, launched with the
//! same threads, so the same floats), rotates the last `n_rot` values there (`rope`'s
//! arithmetic), and writes the row, after the FP8 round trip of its first `n_nope` values
//! where asked (`fp8_roundtrip`'s arithmetic, its `pow2_scale` and `e4m3_round` rendered
//! from the op kernel's IR helpers, the rotation from `rope`'s). Bit for bit the chain's
//! output (`cuda_kernels` checks).
//!
//! The runtime finds the chains (`runtime/src/cuda/norm_rope.rs`) and runs this kernel at
//! any number of rows up to [`MAX_N`] values each; `DS4_NORM_ROPE=0` turns it off.

use crate::quant::{BufElem, QParam};
use crate::Target;

/// Kernel name.
pub const NAME: &str = "norm_rope";
/// The most threads a block (a launch gives it the norm's own).
pub const MAX_THREADS: u32 = 1024;
/// The longest row (its floats are staged in dynamic shared memory).
pub const MAX_N: usize = crate::cuda::STAGE_OUT_LIMIT / 4;

/// Parameters in launch order. `w` is read only when `weighted` is 1, the round trip made
/// only when `fp8` is 1 (over the first `n_nope`).
/// Row `item` is token `item / heads`, at position `(pos_base + token) · pos_mult`.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "w", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "inv_freq", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "heads" },
        QParam::Scalar { name: "n_rot" },
        QParam::Scalar { name: "pos_base" },
        QParam::Scalar { name: "pos_mult" },
        QParam::Float { name: "eps" },
        QParam::Float { name: "sign" },
        QParam::Scalar { name: "weighted" },
        QParam::Scalar { name: "fp8" },
        QParam::Scalar { name: "n_nope" },
    ]
}

/// `rope` on a row of `n` values staged in shared memory (its last `n_rot` in pairs, at
/// position `pos`): the op kernel's floats (its angle and pair rotation rendered from its
/// IR), shared with `attention_merge_rope`.
pub(crate) fn rope_row(cuda: &crate::cuda::Cuda) -> String {
    let mut s = crate::render::op_helpers(cuda, "rope");
    s.push_str(
        r#"
// `rope` on a staged row: its last n_rot values in pairs, at position pos, by the block.
__device__ __forceinline__ void ds4_rope_row(float* const row, const float* __restrict__ inv_freq, const unsigned long long n, const unsigned long long n_rot, const float pos, const float sign) {
    const unsigned long long nope = n - n_rot;
    for (unsigned long long p = threadIdx.x; p < n_rot / 2ull; p += blockDim.x) {
        const float c = rope_cos(pos, inv_freq[p]);
        const float s = rope_sin(pos, inv_freq[p], sign);
        const float a = row[nope + 2ull * p];
        const float b = row[nope + 2ull * p + 1ull];
        row[nope + 2ull * p] = rotate_first(a, b, c, s);
        row[nope + 2ull * p + 1ull] = rotate_second(a, b, c, s);
    }
}
"#,
    );
    s
}

/// Bytes of dynamic shared memory a launch over rows of `n` values needs.
pub fn shared_bytes(n: usize) -> u32 {
    (n * 4) as u32
}

/// The CUDA source (None for the targets that are not CUDA). Launch: grid [rows, 1, 1],
/// the norm's threads, [`shared_bytes`].
pub fn source(target: Target) -> Option<String> {
    let cuda = crate::cuda::Cuda::of(target)?;
    let mut s = format!("// {NAME}: an RMS norm, RoPE and the FP8 round trip of a row in one launch (codegen/src/cuda_norm_rope.rs).\n\n");
    s.push_str(crate::cuda::BLOCK_SUM);
    s.push_str(&crate::render::op_helpers(&cuda, "fp8_roundtrip"));
    s.push_str(&crate::cuda::text_helpers("rms_norm"));
    s.push_str(&rope_row(&cuda));
    s.push_str(&format!(
        r#"
// `fp8_roundtrip` of one value `v` of a block whose largest magnitude is `block_max`
// (floored at 1e-4 as the op floors it; a max, so before or after the block's max alike).
__device__ __forceinline__ float ds4_fp8_value(const float v, const float block_max) {{
    const float scale = pow2_scale(fmaxf(0.0001f, block_max), 448.0f);
    const float q = fminf(fmaxf(v / scale, -448.0f), 448.0f);
    return e4m3_round(q) * scale;
}}

{entry}    extern __shared__ float ds4_row[];
    const unsigned long long item = blockIdx.x;
    const unsigned long long base = item * n;
    // A thread a value (a decode's rows: the launch gives the norm's threads, one a value
    // for rows of up to 1024): the value stays in a register from its load to its store,
    // a RoPE pair meets by a shuffle (its two values on adjacent lanes: the rotated part
    // starts at an even place), and each 64-value block's largest magnitude comes from its
    // two warps' maxima. Three barriers instead of five, and no round through the staged
    // row; the same floats as below (a max in any order is the max).
    if ((unsigned long long)blockDim.x == n && n % 64ull == 0ull && (n - n_rot) % 2ull == 0ull) {{
        const unsigned int i = threadIdx.x;
        const unsigned int lane = i & 31u;
        const float xv = ds4_x[base + i];
        const float wv = weighted != 0ull ? ds4_w[i] : 1.0f;
        const float inv = rms_inv(ds4_block_sum(xv * xv), n, eps);
        float v = weighted != 0ull ? rms_scaled(xv, inv, wv) : xv * inv;
        const float other = __shfl_xor_sync(0xffffffffu, v, 1);
        const unsigned long long nope = n - n_rot;
        if (i >= nope) {{
            const unsigned long long p = (i - nope) / 2ull;
            const float pos = (float)((pos_base + item / heads) * pos_mult);
            const float c = rope_cos(pos, ds4_inv_freq[p]);
            const float s = rope_sin(pos, ds4_inv_freq[p], sign);
            v = ((i - nope) & 1ull) == 0ull ? rotate_first(v, other, c, s) : rotate_second(other, v, c, s);
        }}
        const unsigned long long rounded = fp8 != 0ull ? n_nope / 64ull * 64ull : 0ull;
        __shared__ float ds4_wmax[32];
        if (rounded != 0ull) {{
            float am = fabsf(v);
            for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
            if (lane == 0u) ds4_wmax[i >> 5] = am;
            __syncthreads();
        }}
        ds4_out[base + i] = i < rounded ? ds4_fp8_value(v, fmaxf(ds4_wmax[(i / 64u) * 2u], ds4_wmax[(i / 64u) * 2u + 1u])) : v;
        return;
    }}
    // `rms_norm` / `rms_norm_plain`: the same partial sums and block sum.
    float ss = 0.0f;
    {{
        float ss_part = 0.0f;
        for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {{
            const float v = ds4_x[base + i];
            ss_part += v * v;
        }}
        ss += ds4_block_sum(ss_part);
    }}
    const float inv = rms_inv(ss, n, eps);
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {{
        ds4_row[i] = weighted != 0ull ? rms_scaled(ds4_x[base + i], inv, ds4_w[i]) : ds4_x[base + i] * inv;
    }}
    __syncthreads();
    // `rope`: the last n_rot values in pairs.
    ds4_rope_row(ds4_row, ds4_inv_freq, n, n_rot, (float)((pos_base + item / heads) * pos_mult), sign);
    __syncthreads();
    // `fp8_roundtrip` of the first n_nope values (blocks of 64), or the row as it is. Each
    // block's largest magnitude first, a warp a block (a max, in any order; each thread
    // once scanned its value's whole block, 64 shared-memory loads in a chain).
    const unsigned long long rounded = fp8 != 0ull ? n_nope / 64ull * 64ull : 0ull;
    __shared__ float ds4_amax[{max_blocks}];
    for (unsigned long long b = threadIdx.x / 32u; b < rounded / 64ull; b += blockDim.x / 32u) {{
        const unsigned int lane = threadIdx.x & 31u;
        float amax = fmaxf(fabsf(ds4_row[b * 64ull + lane]), fabsf(ds4_row[b * 64ull + 32ull + lane]));
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (lane == 0u) ds4_amax[b] = amax;
    }}
    __syncthreads();
    float* const out = ds4_out + base;
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {{
        const float v = ds4_row[i];
        out[i] = i < rounded ? ds4_fp8_value(v, ds4_amax[i / 64ull]) : v;
    }}
}}
"#,
        entry = crate::cuda::own_entry(NAME, &MAX_THREADS.to_string(), &params()),
        max_blocks = MAX_N / 64
    ));
    Some(s)
}

/// `rope_hadamard_fp4`: the RoPE of rows of 128 values, then each row's Hadamard transform
/// and FP4 round trip (`hadamard_fp4`), one launch. The indexer's query heads at decode
/// were three launches on the critical path of a CSA layer: the projection, `rope` (4.2
/// µs) and `hadamard_fp4` (7.4 µs: its round trip by four threads, 32 values each in turn,
/// behind seven barriers). Here a warp takes a row, four values a lane (lane l values 4l ..
/// 4l + 4): the RoPE's pairs are a lane's own (`ds4_rope_row`'s arithmetic, its angle and
/// rotation rendered from `rope`'s IR); the
/// butterflies of spans 1 and 2 are a lane's, those of 4 to 64 are between lanes
/// (shuffles: the lower of a pair keeps a + b, the upper a − b, the same two operations on
/// the same values); then ×1/√128 and, in blocks of 32 (eight lanes), the block's largest
/// magnitude (a max, in any order) and the round trip (`pow2_scale` and `e2m1_round`,
/// rendered from the op kernel's IR helpers). Bit for bit `rope` then `hadamard_fp4`
/// (`cuda_kernels`).
pub const ROPE_HADAMARD: &str = "rope_hadamard_fp4";
/// Values a row (the Hadamard transform's length).
pub const HADAMARD_N: usize = 128;
/// Threads a block: four rows.
pub const ROPE_HADAMARD_THREADS: u32 = 128;

/// `rope_hadamard_fp4`'s parameters in launch order: the RoPE's (row `item` is token
/// `item / heads`; its last `n_rot` values rotated) and `fp4` (0 or 1).
pub fn rope_hadamard_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "inv_freq", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "rows" },
        QParam::Scalar { name: "heads" },
        QParam::Scalar { name: "n_rot" },
        QParam::Scalar { name: "pos_base" },
        QParam::Scalar { name: "pos_mult" },
        QParam::Float { name: "sign" },
        QParam::Scalar { name: "fp4" },
    ]
}

/// Blocks of a launch over `rows` rows.
pub fn rope_hadamard_blocks(rows: usize) -> u32 {
    rows.div_ceil(ROPE_HADAMARD_THREADS as usize / 32) as u32
}

/// `rope_hadamard_fp4`'s source (None off CUDA). Launch: grid [`rope_hadamard_blocks`],
/// [`ROPE_HADAMARD_THREADS`] threads.
pub fn rope_hadamard_source(target: Target) -> Option<String> {
    let cuda = crate::cuda::Cuda::of(target)?;
    let mut s = format!("// {ROPE_HADAMARD}: rope, then hadamard_fp4, of rows of {HADAMARD_N} (codegen/src/cuda_norm_rope.rs).\n\n");
    s.push_str(&crate::render::op_helpers(&cuda, "hadamard_fp4"));
    s.push_str(&crate::render::op_helpers(&cuda, "rope"));
    s.push_str(&format!(
        r#"
{entry}    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long item = (unsigned long long)blockIdx.x * ({threads}u / 32u) + threadIdx.x / 32u;
    if (item >= rows) return;
    const float4 in = *(const float4*)(ds4_x + item * {n}ull + 4u * lane);
    float v[4] = {{in.x, in.y, in.z, in.w}};
    // `rope`: the last n_rot values in pairs (a lane's two pairs are its own).
    const unsigned int nope = {n}u - (unsigned int)n_rot;
    const float pos = (float)((pos_base + item / heads) * pos_mult);
    #pragma unroll
    for (unsigned int q = 0; q < 2u; q++) {{
        const unsigned int e = 4u * lane + 2u * q;
        if (e >= nope) {{
            const float f = ds4_inv_freq[(e - nope) / 2u];
            const float c = rope_cos(pos, f);
            const float sn = rope_sin(pos, f, sign);
            const float a = v[2u * q];
            const float b = v[2u * q + 1u];
            v[2u * q] = rotate_first(a, b, c, sn);
            v[2u * q + 1u] = rotate_second(a, b, c, sn);
        }}
    }}
    // `hadamard_fp4`'s butterflies: spans 1 and 2 in the lane, 4 .. 64 across lanes.
    {{
        float a = v[0], b = v[1];
        v[0] = a + b; v[1] = a - b;
        a = v[2]; b = v[3];
        v[2] = a + b; v[3] = a - b;
        a = v[0]; b = v[2];
        v[0] = a + b; v[2] = a - b;
        a = v[1]; b = v[3];
        v[1] = a + b; v[3] = a - b;
    }}
    #pragma unroll
    for (unsigned int m = 1u; m < 32u; m <<= 1) {{
        const bool upper = (lane & m) != 0u;
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {{
            const float other = __shfl_xor_sync(0xffffffffu, v[r], m);
            v[r] = upper ? other - v[r] : v[r] + other;
        }}
    }}
    const float norm = 1.0f / sqrtf(128.0f);
    #pragma unroll
    for (unsigned int r = 0; r < 4u; r++) v[r] = v[r] * norm;
    if (fp4 != 0ull) {{
        // Blocks of 32 values: eight lanes.
        float amax = 0.0001f;
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) amax = fmaxf(amax, fabsf(v[r]));
        #pragma unroll
        for (unsigned int m = 1u; m < 8u; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        const float scale = pow2_scale(amax, 6.0f);
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {{
            const float q = fminf(fmaxf(v[r] / scale, -6.0f), 6.0f);
            v[r] = e2m1_round(q) * scale;
        }}
    }}
    *(float4*)(ds4_out + item * {n}ull + 4u * lane) = make_float4(v[0], v[1], v[2], v[3]);
}}
"#,
        entry = crate::cuda::own_entry(ROPE_HADAMARD, &ROPE_HADAMARD_THREADS.to_string(), &rope_hadamard_params()),
        threads = ROPE_HADAMARD_THREADS,
        n = HADAMARD_N
    ));
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;


    /// The round trip's helper comes from the op kernel's IR, rendered for CUDA.
    #[test]
    fn renders_the_fp8_kernels_helper() {
        let s = source(Target::CudaSm90).unwrap();
        assert!(s.contains("float e4m3_round(") && s.contains("e4m3_round(q) * scale"));
    }
}
