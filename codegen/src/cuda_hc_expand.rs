//! `hc_expand` as the epilogue of the decode launch that makes its y. CUDA text.
//!
//! After each attention and each FFN the graph (`model/src/builder.rs`) updates the
//! hyper-connection streams: `R'_j = post_j·y + Σ_i comb[i][j]·R_i` (`hc_expand`,
//! `ir/src/kernels/hc.rs`), channel by channel, so channel c of every new stream needs
//! only y's channel c. The launch that makes y (the dense Q8_0_R mat-vec of
//! `attn_output_b`, the routed experts' Q2_K down with the shared expert's add) has each
//! block's few channels in hand when it stores them; there it also makes their nh new
//! stream values, and the step runs one launch fewer a sublayer (86 a step, ~3.7 µs each
//! on the H200's critical path).
//!
//! A launch that takes it has the parameters of [`params`] (`enh` = 0: no expand) and, for
//! rows `c0 .. c0 + rows` of token t, gives thread s < rows·nh the value of row
//! c0 + s % rows and stream s / rows: [`STAGE`] when the kernel starts (the mix's post
//! weight and comb column, the streams' channel, copied into shared memory asynchronously,
//! `cp.async`: no registers held through the main loop and no wait), [`VALUE`] at the end
//! with the y it stores. The arithmetic is the op's (a product, then the nh products added
//! in i order, each rounded: NVRTC compiles without FMA contraction), so the streams are
//! `hc_expand`'s floats bit for bit given the same y (`cuda_kernels` checks both kernels).

use crate::cuda_hc_mix::MAX_NH;
use crate::quant::{BufElem, QParam};

/// The extra parameters of a launch that takes the expand: the new streams (`eout`, nh
/// rows of n a token), the old ones (`er`, the same layout), the mix (`emix`, 2·nh + nh²
/// a token) and nh (`enh`, 0 for none).
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "eout", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "er", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "emix", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "enh" },
    ]
}

/// Whether a launch of `threads` threads making `rows` channels a block can take the
/// expand of `nh` streams (a thread per channel and stream, nh within the staged arrays).
pub fn fits(nh: usize, rows: usize, threads: usize) -> bool {
    (1..=MAX_NH).contains(&nh) && rows * nh <= threads
}

/// Floats a thread stages: the post weight, a comb column and the streams' channel.
pub const STAGED: usize = 1 + 2 * MAX_NH;

/// Static shared memory the staging takes in a kernel of `rows` channels a block.
pub fn shared_bytes(rows: usize) -> u32 {
    (rows * MAX_NH * STAGED * 4) as u32
}

/// The helpers, once per kernel source.
pub fn helpers() -> String {
    format!(
        r#"
#define DS4_EXPAND_NH {MAX_NH}u
#define DS4_EXPAND_STAGED {STAGED}u
// A 4-byte copy from global to shared memory that the thread does not wait for.
__device__ __forceinline__ void ds4_copy_async4(float* const to, const float* const from) {{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"((unsigned int)__cvta_generic_to_shared(to)), "l"(from) : "memory");
}}
{STAGE}{VALUE}"#
    )
}

/// `ds4_expand_stage(st, mix, r, nh, n, t, j, c)`: copies what stream j of channel c of
/// token t needs into `st` (`DS4_EXPAND_STAGED` floats of shared memory, the thread's own).
pub const STAGE: &str = r#"__device__ __forceinline__ void ds4_expand_stage(float* const st, const float* const mix, const float* const r, const unsigned int nh, const unsigned long long n, const unsigned int t, const unsigned int j, const unsigned long long c) {
    const float* const m = mix + (unsigned long long)t * (2u * nh + nh * nh);
    ds4_copy_async4(st, m + nh + j);
    #pragma unroll
    for (unsigned int i = 0; i < DS4_EXPAND_NH; i++) {
        if (i < nh) {
            ds4_copy_async4(st + 1u + i, m + 2u * nh + i * nh + j);
            ds4_copy_async4(st + 1u + DS4_EXPAND_NH + i, r + ((unsigned long long)t * nh + i) * n + c);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
"#;

/// `ds4_expand_value(st, y, nh)`: the new stream value from the thread's staged floats
/// and its channel's y (waits for the thread's copies).
pub const VALUE: &str = r#"__device__ __forceinline__ float ds4_expand_value(const float* const st, const float y, const unsigned int nh) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    float acc = st[0] * y;
    #pragma unroll
    for (unsigned int i = 0; i < DS4_EXPAND_NH; i++) {
        if (i < nh) {
            acc += st[1u + i] * st[1u + DS4_EXPAND_NH + i];
        }
    }
    return acc;
}
"#;

/// The kernel text that stages: `rows` channels from `first` (an expression) of token
/// `t`, n channels a row of y; declares the shared array.
pub fn stage_call(rows: u64, first: &str, t: &str) -> String {
    format!(
        "__shared__ float ds4_est[{rows} * DS4_EXPAND_NH][DS4_EXPAND_STAGED];\n    \
         if (enh != 0ull && threadIdx.x < {rows}u * (unsigned int)enh && {first} + threadIdx.x % {rows}u < n) {{\n        \
         ds4_expand_stage(ds4_est[threadIdx.x], ds4_emix, ds4_er, (unsigned int)enh, n, {t}, threadIdx.x / {rows}u, {first} + threadIdx.x % {rows}u);\n    \
         }}\n"
    )
}

/// The kernel text that stores the new stream values, given `y(q)`: the expression of row
/// q's y (each thread computes its row's, in the order the kernel stores it).
pub fn store_call(rows: u64, first: &str, t: &str, y: &dyn Fn(&str) -> String) -> String {
    format!(
        "if (enh != 0ull && threadIdx.x < {rows}u * (unsigned int)enh && {first} + threadIdx.x % {rows}u < n) {{\n        \
         const unsigned int q = threadIdx.x % {rows}u;\n        \
         const unsigned int j = threadIdx.x / {rows}u;\n        \
         ds4_eout[((unsigned long long)({t}) * enh + j) * n + {first} + q] = ds4_expand_value(ds4_est[threadIdx.x], {}, (unsigned int)enh);\n    \
         }}\n",
        y("q")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_thread_per_channel_and_stream() {
        assert!(fits(4, 4, 32) && fits(MAX_NH, 4, 128));
        assert!(!fits(0, 4, 128) && !fits(MAX_NH + 1, 4, 128) && !fits(4, 4, 8));
    }

    #[test]
    fn helpers_adds_in_the_ops_order() {
        let h = helpers();
        assert!(h.contains("float acc = st[0] * y;") && h.contains("acc += st[1u + i] * st[1u + DS4_EXPAND_NH + i];"), "{h}");
    }
}
