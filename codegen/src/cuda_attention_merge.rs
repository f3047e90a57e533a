//! `attention_merge_warp`: `attention_merge` for CUDA, written as CUDA text, with the same
//! parameters and output, and the same floats bit for bit.
//!
//! The generated merge has every thread of an item (a token's head) work out the chunks'
//! largest max and the denominator itself, one chunk after another, then its outputs' sums
//! with an `exp` per chunk again: at decode (32 chunks, 64 heads, 512 dimensions) a chain
//! of ~100 dependent steps a thread, 9.3 µs a layer on the H200 (Nsight Compute). Here one
//! warp takes the chunks' maxima and sums (a lane per chunk: the max by shuffles, which is
//! exact in any order; each chunk's factor `exp(m − max)` once; the denominator added in
//! chunk order, as the reference adds it, its terms from the lanes by shuffles), puts the
//! factors in shared memory, and then every thread sums its dimensions over the chunks in
//! order (H200, decode: 6.0 → 4.7 µs a layer). A thread's first dimension's values are
//! loaded before the first warp's factors are known, in one round, where an item has 9 to
//! 32 chunks (a decode's): 4.6 → 3.3 µs at 32 chunks, 3.3 → 2.8 at 9 (thirtieth stop,
//! `scripts/lab/attention_lab.sh`); the rest go eight chunks' loads at a time.
//!
//! It takes up to [`MAX_CHUNKS`] chunks ([`fits`]); the runtime runs the generated merge
//! otherwise.

use crate::quant::{BufElem, QParam};
use crate::Target;
use ds4_ir::kir::Kernel;

/// The kernel's entry point.
pub const NAME: &str = "attention_merge_warp";
/// Threads per block (an item a block; its dimensions strided over them).
pub const THREADS: u32 = 512;
/// The most chunks an item may have (two a lane of the first warp).
pub const MAX_CHUNKS: usize = 64;

/// Whether items of `nc` chunks fit.
pub fn fits(nc: usize) -> bool {
    (1..=MAX_CHUNKS).contains(&nc)
}

/// The IR kernel whose parameters and output `attention_merge_warp` shares.
pub fn contract() -> Kernel {
    ds4_ir::kernels::attention::attention_merge_kir()
}

/// The kernel's CUDA source for a CUDA target (`None` for the others).
pub fn source(target: Target) -> Option<String> {
    let preamble = format!("\n#define DS4_MAX_CHUNKS {MAX_CHUNKS}u\n{MERGE_ITEM}\n");
    crate::cuda::text_kernel(target, NAME, "codegen/src/cuda_attention_merge.rs", &preamble, &THREADS.to_string(), &contract(), BODY)
}

/// The merge of one item, by the block, into `dst` (shared by both kernels here).
const MERGE_ITEM: &str = r#"
// Chunk c's value of dimension d of an item's chunks `p` (rows of w floats) into v[c], for
// c < E, where the item has chunks in (E/2, E]: zero past them.
template <unsigned int E>
__device__ __forceinline__ void ds4_merge_load(float (&v)[E], const float* __restrict__ p, const unsigned long long w, const unsigned long long d, const unsigned int chunks) {
    #pragma unroll
    for (unsigned int c = 0; c < E; c++) {
        v[c] = c < E / 2u || c < chunks ? p[c * w + d] : 0.0f;
    }
}
// Σ v[c]·factor[c] over the chunks in (E/2, E], in chunk order, a factor of -inf (a chunk
// that saw no row) skipped: the sum the general loop below makes.
template <unsigned int E>
__device__ __forceinline__ float ds4_merge_sum(const float (&v)[E], const float* const factor, const unsigned int chunks) {
    float acc = 0.0f;
    #pragma unroll
    for (unsigned int c = 0; c < E; c++) {
        const float f = c < E / 2u || c < chunks ? factor[c] : __int_as_float(0xff800000);
        if (f > __int_as_float(0xff800000)) {
            acc += v[c] * f;
        }
    }
    return acc;
}
// Item `item`'s chunks (rows of hd + 2 floats in `part`: the chunk's outputs, its max,
// its denominator) merged into dst[0 .. hd], by the block. EARLY: the register arrays
// below (a kernel of its own: they double the registers, which halved a prefill's merge
// of one chunk per item, 131,072 blocks, and the prefill lost 5.5%).
template <bool EARLY>
__device__ __forceinline__ void ds4_merge_item(float* const dst, const float* __restrict__ part, const unsigned long long hd, const unsigned long long nc, const unsigned long long item) {
    __shared__ float ds4_factor[DS4_MAX_CHUNKS];
    __shared__ float ds4_sum;
    const unsigned long long w = hd + 2;
    const float* const p = part + item * nc * w;
    const unsigned int chunks = (unsigned int)nc;
    const float ninf = __int_as_float(0xff800000);
    // The thread's first dimension: its chunks' values loaded before the barrier, beside
    // the first warp's loads of the maxima (after them in that warp), instead of after it
    // in rounds of eight (a decode's 32 chunks were four round trips to L2 after the first
    // warp's one). Where the chunks are 9-16 or 17-32 (a decode's): a register array of 16
    // or 32 whose first half needs no bound check. H200, 32 chunks of 512 dimensions: 4.6
    // µs as it was, 4.1 with a bound check on every load, 3.3 so; 9 chunks 3.3 → 2.8; an
    // array of 64 for 33-64 chunks too took the 32 chunks' to 3.6 (108 registers).
    const unsigned long long d0 = threadIdx.x;
    const unsigned int early = !EARLY || d0 >= hd || chunks <= 8u || chunks > 32u ? 0u : chunks <= 16u ? 16u : 32u;
    float v32[32];
    float v16[16];
    if (threadIdx.x >= 32u) {
        if (early == 32u) ds4_merge_load<32>(v32, p, w, d0, chunks);
        if (early == 16u) ds4_merge_load<16>(v16, p, w, d0, chunks);
    }
    if (threadIdx.x < 32u) {
        // Lane l: chunks l and l + 32, their maxima and denominators in one round of loads.
        const unsigned int lane = threadIdx.x;
        const float m0 = lane < chunks ? p[lane * w + hd] : ninf;
        const float m1 = lane + 32u < chunks ? p[(lane + 32u) * w + hd] : ninf;
        const float s0 = lane < chunks ? p[lane * w + hd + 1] : 0.0f;
        const float s1 = lane + 32u < chunks ? p[(lane + 32u) * w + hd + 1] : 0.0f;
        if (early == 32u) ds4_merge_load<32>(v32, p, w, d0, chunks);
        if (early == 16u) ds4_merge_load<16>(v16, p, w, d0, chunks);
        float mx = fmaxf(m0, m1);
        for (int o = 16; o > 0; o >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        // A chunk that saw no row (max -inf) adds nothing: factor -inf in shared memory,
        // and it is skipped.
        const float f0 = m0 > ninf ? expf(m0 - mx) : 0.0f;
        const float f1 = m1 > ninf ? expf(m1 - mx) : 0.0f;
        if (lane < chunks) {
            ds4_factor[lane] = m0 > ninf ? f0 : ninf;
        }
        if (lane + 32u < chunks) {
            ds4_factor[lane + 32u] = m1 > ninf ? f1 : ninf;
        }
        // The denominator in chunk order (each term from its lane by a shuffle; a skipped
        // chunk's term is +0, which leaves the positive sum as it is).
        const float t0 = m0 > ninf ? s0 * f0 : 0.0f;
        const float t1 = m1 > ninf ? s1 * f1 : 0.0f;
        float sum = 0.0f;
        for (unsigned int c = 0; c < chunks && c < 32u; c++) {
            sum += __shfl_sync(0xffffffffu, t0, c);
        }
        for (unsigned int c = 32u; c < chunks; c++) {
            sum += __shfl_sync(0xffffffffu, t1, c - 32u);
        }
        if (lane == 0u) {
            ds4_sum = sum;
        }
    }
    __syncthreads();
    const float sum = ds4_sum;
    if (early == 32u) dst[d0] = ds4_merge_sum<32>(v32, ds4_factor, chunks) / sum;
    if (early == 16u) dst[d0] = ds4_merge_sum<16>(v16, ds4_factor, chunks) / sum;
    for (unsigned long long d = early != 0u ? d0 + blockDim.x : d0; d < hd; d += blockDim.x) {
        // Eight chunks' loads in flight, added in chunk order (a prefill's items, of one
        // chunk or a few, one at a time).
        float acc = 0.0f;
        if (chunks >= 8u) {
            for (unsigned int c0 = 0; c0 < chunks; c0 += 8u) {
                float v[8];
                #pragma unroll
                for (unsigned int j = 0; j < 8u; j++) {
                    v[j] = c0 + j < chunks ? p[(c0 + j) * w + d] : 0.0f;
                }
                #pragma unroll
                for (unsigned int j = 0; j < 8u; j++) {
                    const float f = c0 + j < chunks ? ds4_factor[c0 + j] : ninf;
                    if (f > ninf) {
                        acc += v[j] * f;
                    }
                }
            }
        } else {
            for (unsigned int c = 0; c < chunks; c++) {
                const float f = ds4_factor[c];
                if (f > ninf) {
                    acc += p[c * w + d] * f;
                }
            }
        }
        dst[d] = acc / sum;
    }
}
"#;

const BODY: &str = "    ds4_merge_item<false>(out + blockIdx.x * hd, part, hd, nc, blockIdx.x);\n";

/// `attention_merge_rope`: the merge, then the inverse RoPE that the graph applies to the
/// attention's output (`rope` with `sign` -1, at the token's position), one launch
/// (`runtime/src/cuda/fusion_plan.rs` finds the pair): the item's merged row staged in
/// shared memory, rotated there by `cuda_norm_rope`'s `ds4_rope_row`, then written out.
/// Bit for bit `attention_merge_warp` then `rope` (`cuda_kernels` checks).
pub const ROPE_NAME: &str = "attention_merge_rope";
/// The widest head `attention_merge_rope` stages.
pub const ROPE_MAX_HD: usize = 4096;

/// `attention_merge_rope`'s parameters in launch order: the merge's (`part`, `hd`, `nc`)
/// and the RoPE's (item `item` is token `item / heads`, at `(pos_base + token) · pos_mult`).
pub fn rope_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "part", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "inv_freq", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "hd" },
        QParam::Scalar { name: "nc" },
        QParam::Scalar { name: "heads" },
        QParam::Scalar { name: "n_rot" },
        QParam::Scalar { name: "pos_base" },
        QParam::Scalar { name: "pos_mult" },
        QParam::Float { name: "sign" },
    ]
}

/// Dynamic shared memory of an `attention_merge_rope` launch over heads of `hd`.
pub fn rope_shared_bytes(hd: usize) -> u32 {
    (hd * 4) as u32
}

/// `attention_merge_rope` with the chunks' values loaded before the factors are known
/// (`ds4_merge_item`'s EARLY): the same parameters, launch and floats; for items of
/// [`EARLY_CHUNKS`] chunks (a decode's).
pub const ROPE_EARLY_NAME: &str = "attention_merge_rope_early";
/// The chunk counts `attention_merge_rope_early` is for (it runs any count up to
/// [`MAX_CHUNKS`], the others as `attention_merge_rope`).
pub const EARLY_CHUNKS: std::ops::RangeInclusive<usize> = 9..=32;

/// `attention_merge_rope`'s CUDA source (None off CUDA). Launch: grid [items, 1, 1],
/// [`THREADS`] threads, [`rope_shared_bytes`].
pub fn rope_source(target: Target) -> Option<String> {
    rope_kernel(target, ROPE_NAME, false)
}

/// `attention_merge_rope_early`'s CUDA source (None off CUDA); launched as
/// `attention_merge_rope`.
pub fn rope_early_source(target: Target) -> Option<String> {
    rope_kernel(target, ROPE_EARLY_NAME, true)
}

fn rope_kernel(target: Target, name: &str, early: bool) -> Option<String> {
    let cuda = crate::cuda::Cuda::of(target)?;
    let mut s = format!("// {name}: attention_merge_warp, then the inverse RoPE of the item's row, in one launch (codegen/src/cuda_attention_merge.rs).\n");
    s.push_str(&format!("\n#define DS4_MAX_CHUNKS {MAX_CHUNKS}u\n"));
    s.push_str(MERGE_ITEM);
    s.push_str(&crate::cuda_norm_rope::rope_row(&cuda));
    s.push_str(&format!(
        r#"
{entry}    extern __shared__ float ds4_row[];
    const unsigned long long item = blockIdx.x;
    ds4_merge_item<{early}>(ds4_row, ds4_part, hd, nc, item);
    __syncthreads();
    ds4_rope_row(ds4_row, ds4_inv_freq, hd, n_rot, (float)((pos_base + item / heads) * pos_mult), sign);
    __syncthreads();
    for (unsigned long long d = threadIdx.x; d < hd; d += blockDim.x) {{
        ds4_out[item * hd + d] = ds4_row[d];
    }}
}}
"#,
        entry = crate::cuda::own_entry(name, &THREADS.to_string(), &rope_params())
    ));
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_up_to_two_chunks_a_lane() {
        assert!(fits(1) && fits(32) && fits(MAX_CHUNKS));
        assert!(!fits(0) && !fits(MAX_CHUNKS + 1));
    }
}
