//! `split_x_bf16x3`: a matmul's activations split once into three bf16 parts, for the
//! element-term path of `matmul_mma_<type>` (`quant/cuda_mma.rs`).
//!
//! That path multiplies exact bf16 element terms by x on bf16 tensor cores, so x must be
//! a sum of bf16 numbers: h + m + l, each the rounding to nearest of what the previous
//! left (the rests are exact in f32), keep x to about 2^-24 of itself. Every 64-row tile
//! of a matmul needs the same parts of the same x; made here once per matmul, they are
//! copied into the tiles with the weights (the split inside the kernel was about a
//! quarter of its instructions, repeated for each row tile). The sums of x per 16
//! columns come with them: the offsets of types with mins multiply them.
//!
//! Layout, for x of `n` floats (a multiple of 16): part p of x[i] is the bf16 at
//! `planes + 2·(p·n + i)`, and `sums[g]` = x[16g] + .. + x[16g + 15], added in order.

use super::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "split_x_bf16x3";
/// Threads per block: each takes 16 consecutive floats.
pub const THREADS: u32 = 128;
/// bf16 parts of x (the source below writes these three: h, m, l).
pub const PARTS: u64 = 3;

/// Parameters in launch order.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "planes", elem: BufElem::Bytes, mutable: true },
        QParam::Buffer { name: "sums", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
    ]
}

/// Blocks for `n` floats.
pub fn blocks(n: usize) -> usize {
    n.div_ceil(16).div_ceil(THREADS as usize).max(1)
}

/// The split helpers, shared with nothing else (the MMA kernel reads the parts).
const HELPERS: &str = r#"// Two f32 as a bf16 pair rounded to nearest: lo in the low half, hi in the high half.
__device__ __forceinline__ unsigned int ds4_bf16x2(const float lo, const float hi) {
    unsigned int d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// (x0, x1) = h + m + l, three bf16 pairs, each the rounding of what the previous left.
__device__ __forceinline__ void ds4_split_bf16x3(float x0, float x1, unsigned int& h, unsigned int& m, unsigned int& l) {
    h = ds4_bf16x2(x0, x1);
    x0 = x0 - __uint_as_float(h << 16);
    x1 = x1 - __uint_as_float(h & 0xffff0000u);
    m = ds4_bf16x2(x0, x1);
    x0 = x0 - __uint_as_float(m << 16);
    x1 = x1 - __uint_as_float(m & 0xffff0000u);
    l = ds4_bf16x2(x0, x1);
}

"#;

/// The CUDA source (sm_80 and later: `cvt.rn.bf16x2.f32`).
pub fn source() -> String {
    let mut s = format!("// {NAME}: x split into {PARTS} bf16 parts, and its sums per 16 floats (codegen/src/quant/cuda_split.rs).\n\n");
    s.push_str(HELPERS);
    s.push_str(&format!(
        r#"{entry}    const unsigned long long g = (unsigned long long)blockIdx.x * {THREADS}ull + threadIdx.x;
    if (g * 16ull >= n) return;
    // Plain loads: x may be a view at any float (a warp's loads still coalesce).
    const float* const xv = ds4_x + g * 16ull;
    unsigned int h[8], m[8], l[8];
    float sum = 0.0f;
    #pragma unroll
    for (int q = 0; q < 4; q++) {{
        const float4 v = make_float4(xv[4 * q], xv[4 * q + 1], xv[4 * q + 2], xv[4 * q + 3]);
        ds4_split_bf16x3(v.x, v.y, h[2 * q], m[2 * q], l[2 * q]);
        ds4_split_bf16x3(v.z, v.w, h[2 * q + 1], m[2 * q + 1], l[2 * q + 1]);
        sum = sum + v.x + v.y + v.z + v.w;
    }}
    uint4* const ph = (uint4*)(ds4_planes + g * 32ull);
    uint4* const pm = (uint4*)(ds4_planes + 2ull * n + g * 32ull);
    uint4* const pl = (uint4*)(ds4_planes + 4ull * n + g * 32ull);
    ph[0] = make_uint4(h[0], h[1], h[2], h[3]); ph[1] = make_uint4(h[4], h[5], h[6], h[7]);
    pm[0] = make_uint4(m[0], m[1], m[2], m[3]); pm[1] = make_uint4(m[4], m[5], m[6], m[7]);
    pl[0] = make_uint4(l[0], l[1], l[2], l[3]); pl[1] = make_uint4(l[4], l[5], l[6], l[7]);
    ds4_sums[g] = sum;
}}
"#,
        entry = crate::cuda::own_entry(NAME, &THREADS.to_string(), &params())
    ));
    s
}
