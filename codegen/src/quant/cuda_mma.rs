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
//! TF32 keeps 10 bits of mantissa, so every operand is split in two TF32 numbers by
//! truncation (`big`: v's top 11 significant bits, `small`: the top 11 of the exact rest
//! `v − big`) and three products are accumulated in f32: `big·big + big·small +
//! small·big`. Each operand is kept to 2^-20 of itself and the dropped `small·small` is
//! below 2^-20 of the product, so each term is within 3·2^-20 of its exact value and the
//! sum within about 3e-6 of Σ|w·x| before f32 accumulation: the kernel parity test holds
//! it to 1e-5 of Σ|w·x|, the SIMT kernel's bound (measured on the H200: ≤ 1.1e-6).
//!
//! **The element-term path** (`TermMma`: Q8_0, Q2_K, Q4_K, Q6_K, IQ2_XXS, MXFP4). Where
//! every element term of the factored value (`scale · term + offset`, see `runs.rs`) is
//! exact in bf16 (small integers, IQ2_XXS's ±8/25/43: `Lower::terms_exact_in_bf16`, by
//! interpreting the declaration over value sets) and the scale and offset hold for 16
//! columns (`Lower::scale_span`), the weights need no split: each thread de-quantizes its
//! 16 terms once (`Lower::term_runs`) into a bf16 tile with their scale (and offset); x
//! comes split into [`TERM_PLANES`] bf16 parts, made once per matmul by `split_x_bf16x3`
//! (`quant/cuda_split.rs`; the runtime runs it first, `runtime/src/cuda/x_parts.rs`) and
//! copied into the tiles like the weights; the warps multiply with `mma.sync.m16n8k16` on
//! bf16 (operands by `ldmatrix`), a fresh product per part summed smallest first, then
//! scaled into the f32 accumulators once per 16 or 32 columns; an offset adds
//! `offset · Σx` (x's sums per 16 columns, made with the parts). Per 16 columns that is 3
//! MMAs of k = 16 where TF32 takes 6 of k = 8, and no operand split in the kernel: on the
//! H200 at 2048 tokens Q8_0 3.0 → 2.2 ms and IQ2_XXS experts 6.1 → 4.7 ms with the split
//! inside the kernel (see bench/RESULTS.md for the split outside), the error ≤ 1.4e-7 of
//! Σ|w·x|. Other types (F32, F16, BF16) take the TF32 path.
//!
//! The kernel is latency-bound (Nsight Compute on the H200: 19-25% occupancy, register-
//! limited, ~6 cycles between a warp's instructions), so the steps are pipelined and every
//! access is as wide as it can be:
//! - **Double-buffered tiles, one barrier a step.** Step i de-quantizes its weight tile
//!   into buffer i mod 2, waits for its x tile, synchronizes once, then starts the copies
//!   step i + 1 needs (`cp.async`, 16 bytes each, straight into shared memory: no
//!   registers held) and multiplies while they travel.
//! - **Weight rows are staged raw.** The tile's bytes for [`stage_elems`] columns (whole
//!   blocks) are copied the same way, a stage ahead, and de-quantized from shared memory
//!   (`Lower::wbuf`, multi-byte fields read as aligned words: `Lower::words`). A row's
//!   stretch need not be 16-byte aligned (66- and 84-byte blocks): the copy starts at the
//!   aligned address below it and the row remembers its shift.
//! - **MMA steps take columns a lane can load together.** An MMA sums over 8 columns in
//!   any order, so MMA step σ of a 32-column step takes columns 8t + 2σ (as its k = t) and
//!   8t + 2σ + 1 (as k = t + 4), t = 0..3: a lane's four values for two MMA steps are one
//!   16-byte load, with the tiles in their natural order. With rows 36 floats apart
//!   neither those loads nor the threads' 16-byte stores have bank conflicts.
//!
//! The tiles and staged rows are dynamic shared memory (`QuantKernel::dynamic_shared`:
//! 49-72 KiB, past the 48 KiB of static shared memory a kernel may declare).
//!
//! A launch may be split over k (`gridDim.z` slices of `k_slice` columns, a multiple of
//! [`stage_elems`]): slice z writes its partial sums at `out + z·out_slice`, and the
//! runtime adds the slices in order (`runtime/src/cuda/exec/`, `mma_k_slices`).
//!
//! A tile must not straddle two row groups of a grouped matmul: the runtime uses this
//! kernel when `groups == 1` or `ng` is a multiple of [`MMA_ROWS`], the SIMT one otherwise.

use super::{Lower, QuantGenError, Reads};
use std::fmt::Write;

/// Weight rows per block.
pub const MMA_ROWS: u64 = 64;
/// Tokens per block (and rows per expert group when the rows are listed).
pub const MMA_TOKENS: u64 = 64;
/// Floats of one tile buffer (64 rows × 36, padded against bank conflicts).
const TILE_FLOATS: u64 = 64 * 36;
/// Dynamic shared memory of the tiles: weight and x tiles, two buffers each.
const TILE_BYTES: u64 = 4 * TILE_FLOATS * 4;
/// Static shared memory besides the tables: the tokens' x offsets and output rows.
pub(super) const STATIC_SHARED_BYTES: u64 = 64 * 8 + 64 * 8;

/// Columns staged raw at a time for a type of `block_elems` elements per block: whole
/// blocks and whole 32-column steps, at least two steps (the pipeline loads a stage
/// during the previous stage's first step and waits for it in its second).
pub fn stage_elems(block_elems: u64) -> u64 {
    super::lcm(block_elems, 64)
}

/// Columns a slice of a split over k must be a multiple of for `spec` (a stage).
pub fn mma_k_unit(spec: &ds4_ir::quant::QuantSpec) -> u64 {
    stage_elems(spec.block_elems as u64)
}

/// Helpers placed before the kernel: the TF32 split and one MMA (then the async copies,
/// `cuda::CP_ASYNC`).
const MMA_HELPERS: &str = r#"// v ≈ big + small, both TF32, by truncation: big keeps v's top 11 significant bits,
// v - big is exact and small keeps its top 11 (two masks and a subtraction: the
// rounding conversion measured 22% slower for the whole kernel on the H200).
__device__ __forceinline__ void ds4_split_tf32(const float v, unsigned int& big, unsigned int& small) {
    big = __float_as_uint(v) & 0xffffe000u;
    small = __float_as_uint(v - __uint_as_float(big)) & 0xffffe000u;
}

// c (16 × 8, f32) += a (16 × 8, TF32, row-major) · b (8 × 8, TF32, column-major).
__device__ __forceinline__ void ds4_mma_tf32(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

"#;

/// Helpers of the element-term path (`TermMma`): a 4-byte async copy, a matrix load and
/// one bf16 MMA.
const TERM_HELPERS: &str = r#"// 4 bytes global -> shared (the first `bytes`, else zeros); complete after ds4_cp_wait().
__device__ __forceinline__ void ds4_cp4(void* dst, const void* src, const unsigned int bytes) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(d), "l"(src), "r"(bytes) : "memory");
}

// Four 8 x 8 bf16 matrices from shared memory (lanes 8i..8i+7 give matrix i's rows).
__device__ __forceinline__ void ds4_ldsm_x4(unsigned int* r, const unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// d (16 x 8, f32) = a (16 x 16, bf16, row-major) . b (16 x 8, bf16, column-major) + c.
__device__ __forceinline__ void ds4_mma_bf16(float* d, const unsigned int* a, const unsigned int b0, const unsigned int b1, const float* c) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

"#;

/// The element-term path of `matmul_mma_<type>` (see the module comment), for types whose
/// every element term is exact in bf16 and whose scale and offset hold for 16 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermMma {
    /// The value has an offset (`scale · term − offset`: Q2_K, Q4_K).
    pub offset: bool,
    /// The scale holds for 32 columns (a step): applied once per step.
    pub span32: bool,
}

impl TermMma {
    /// Byte offset (from the term tiles' start) of the scales: after two term tiles and
    /// two buffers of x's planes.
    fn scales_at(self) -> u64 {
        (2 + 2 * TERM_PLANES) * TERM_TILE
    }
    /// Bytes of the per-row and per-token floats, two buffers: the scales, and with an
    /// offset the offsets and x's sums.
    fn pairs_bytes(self) -> u64 {
        2 * TERM_PAIRS * if self.offset { 3 } else { 1 }
    }
}

/// bf16 parts x is split into on the element-term path (by `split_x_bf16x3`,
/// `quant/cuda_split.rs`): three keep x to 2^-24 of itself (measured on the H200: ≤ 1.4e-7
/// of Σ|w·x|, near the SIMT kernel's 5e-8). Two keep it to 2^-17 (≤ 1.7e-6, inside the
/// kernels' own 1e-5 bound) and were 10-15% faster, but the tiny models then failed their
/// CPU-vs-CUDA and reference parity bounds (tiny-q4 logits 1.2e-4·std apart, tiny-q2's p99
/// 2.4e-2·std at 150 tokens): the indexer's FP4 act-sim rounds differences that small
/// into different codes.
const TERM_PLANES: u64 = super::cuda_split::PARTS;

/// Bytes of one row of a bf16 tile: 32 values, in four 16-byte chunks stored swizzled
/// (chunk c of row r at c ^ (r / 2 % 4): `swizzle`), so that the eight rows an `ldmatrix`
/// reads at a time, and the threads' stores, fall in distinct banks without padding (the
/// padding's 16 bytes a row cost the fourth block an SM).
const TERM_ROW: u64 = 64;

/// The swizzled 16-byte chunk of chunk `c` (an expression) in row `r` of a bf16 tile.
fn swizzle(c: &str, r: &str) -> String {
    format!("(({c}) ^ ((({r}) >> 1) & 3u))")
}

/// Bytes of one bf16 tile (64 rows).
const TERM_TILE: u64 = 64 * TERM_ROW;
/// Bytes of a per-row (or per-token) pair of floats for 64 rows: one per 16 columns.
const TERM_PAIRS: u64 = 64 * 2 * 4;

/// The raw staging of a block-quantized type: `elems` columns at a time, each row's
/// bytes in `vectors` 16-byte slots (room for them after a shift of up to 15).
struct Stage {
    elems: u64,
    vectors: u64,
}

impl Stage {
    /// 16-byte vectors each of the 128 threads copies per stage.
    fn per_thread(&self) -> u64 {
        (MMA_ROWS * self.vectors).div_ceil(128)
    }
    /// Bytes of one stage buffer, padded for word reads (`WORDS_PAD`).
    fn buffer_bytes(&self) -> u64 {
        MMA_ROWS * self.vectors * 16 + super::WORDS_PAD
    }
}

impl Lower<'_> {
    /// The helpers placed before `matmul_mma_<type>`.
    pub(super) fn mma_helpers(&self) -> String {
        match self.term_mma() {
            Some(_) => format!("{MMA_HELPERS}{}{TERM_HELPERS}", crate::cuda::CP_ASYNC),
            None => format!("{MMA_HELPERS}{}", crate::cuda::CP_ASYNC),
        }
    }

    /// Whether `matmul_mma_<type>` takes the element-term path: rows walked in runs inside
    /// sub-blocks that a thread's 16 elements hold whole, every element term exact in
    /// bf16 (`terms_exact_in_bf16`), the scale and offset the same for each 16 elements
    /// (`scale_span`).
    pub fn term_mma(&self) -> Option<TermMma> {
        let super::runs::Shape::InSub { run } = self.shape() else { return None };
        let f = self.factored()?;
        let ok = 16 % run == 0 && self.spec.block_elems.is_multiple_of(16) && self.scale_span().is_multiple_of(16) && self.terms_exact_in_bf16();
        // Scaling once per step saves 16 of 32 multiply-adds a 16-column step and 10-14
        // registers (the H200: Q8_0 2.24 → 2.02 ms, now 4 blocks an SM; IQ2_XXS 4.42 → 4.29).
        let span32 = self.scale_span().is_multiple_of(32);
        ok.then_some(TermMma { offset: f.offset.is_some(), span32 })
    }

    /// Blocks per SM the kernel is compiled for (`__launch_bounds__`): 4 (128 registers)
    /// where four blocks' shared memory fits the 228 KiB of an sm_90 SM. Measured on the
    /// H200 at 2048 tokens: F16 0.77 → 0.55 ms (3 → 4 blocks), Q2_K 5.03 → 4.93 ms (168
    /// registers → 128, 3 → 4 blocks); the others were at 4 blocks already. F32's staged
    /// rows do not fit four: its registers are left alone.
    pub(super) fn mma_min_blocks(&self) -> Option<u32> {
        let shared = STATIC_SHARED_BYTES + self.staged_table_bytes() as u64 + self.mma_dynamic_shared() as u64;
        // Each resident block also reserves 1 KiB.
        let fits = 4 * (shared + 1024) <= 228 * 1024;
        fits.then_some(4)
    }

    /// Bytes of the tiles (dynamic shared memory before the staged rows).
    fn tile_bytes(&self) -> u64 {
        match self.term_mma() {
            // Two buffers each: the term tile, x's bf16 parts, the scales, and with an
            // offset the offsets and x's sums per 16 columns.
            Some(t) => t.scales_at() + t.pairs_bytes(),
            None => TILE_BYTES,
        }
    }

    fn mma_stage(&self) -> Stage {
        let (be, bb) = (self.spec.block_elems as u64, self.spec.block_bytes as u64);
        let elems = stage_elems(be);
        let bytes = elems / be * bb;
        Stage { elems, vectors: (bytes + 15).div_ceil(16) }
    }

    /// Dynamic shared memory of the kernel: the tiles and the staged rows, two buffers each.
    pub(super) fn mma_dynamic_shared(&self) -> u32 {
        (self.tile_bytes() + 2 * self.mma_stage().buffer_bytes()) as u32
    }

    /// The body of `matmul_mma_<type>` (after `kernel_open` and the tables' staging).
    pub(super) fn mma_body(&self) -> Result<String, QuantGenError> {
        let (be, bb) = (self.spec.block_elems as u64, self.spec.block_bytes as u64);
        let stage = self.mma_stage();
        let tf = TILE_FLOATS;
        let term = self.term_mma();
        let mut o = String::new();
        let w = |o: &mut String, depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        // Tile bookkeeping: which tokens (x offsets, output rows) this block serves.
        for l in [
            "extern __shared__ __align__(16) unsigned char ds4_smem[];".to_string(),
            match term {
                // One x buffer, then the term path's tiles (`tile_bytes`).
                Some(_) => "unsigned char* const tb = ds4_smem;".to_string(),
                None => format!("float* const ws = (float*)ds4_smem;\n    float* const xs = ws + {};", 2 * tf),
            },
            "__shared__ unsigned long long xrow[64];".into(),
            "__shared__ long long prow[64];".into(),
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);".into(),
            "const unsigned int warp = (unsigned int)(ds4_tid >> 5);".into(),
            "const unsigned int g = lane >> 2;".into(),
            "const unsigned int t4 = lane & 3u;".into(),
            "const unsigned int wm = warp >> 1;".into(),
            "const unsigned int wn = warp & 1u;".into(),
            "const unsigned long long r0 = ds4_bx * 64ull;".into(),
            "const unsigned long long ex = has_idx != 0ull ? (unsigned long long)ds4_gexp[ds4_by] : 0ull;".into(),
            "const unsigned long long xg = r0 / ng;".into(),
            "if (ds4_tid < 64ull) {".into(),
            "    long long p;".into(),
            "    if (has_idx != 0ull) {".into(),
            "        p = (long long)ds4_idx[ds4_by * 64ull + ds4_tid];".into(),
            "    } else {".into(),
            "        const unsigned long long tt = ds4_by * 64ull + ds4_tid;".into(),
            "        p = tt < m ? (long long)tt : -1ll;".into(),
            "    }".into(),
            "    prow[ds4_tid] = p;".into(),
            "    xrow[ds4_tid] = p >= 0 ? (((unsigned long long)p / x_div) * groups + xg) * k : 0ull;".into(),
            "}".into(),
            "__syncthreads();".into(),
            "float c[2][4][4];".into(),
            "for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++) for (int q = 0; q < 4; q++) c[i][j][q] = 0.0f;".into(),
            // Each thread de-quantizes 16 elements of one row and copies 16 x values of
            // one token per step: columns 16·hb .. 16·hb + 15.
            "const unsigned long long trow = ds4_tid >> 1;".into(),
            "const unsigned int hb = (unsigned int)(ds4_tid & 1ull);".into(),
            "const unsigned long long half = hb * 16ull;".into(),
            "const unsigned long long wrow = r0 + trow;".into(),
            "const unsigned long long row_at = (ex * n + (wrow < n ? wrow : 0ull)) * row_bytes;".into(),
            "const bool tok_ok = prow[trow] >= 0;".into(),
            "const unsigned long long tok_x = xrow[trow];".into(),
            if term.is_some() { "float tv[16];".into() } else { "float wr[16];".into() },
            // Split over k (few tiles, long rows): slice blockIdx.z sums columns
            // [k_lo, k_hi) into its own copy of the output; the runtime adds the slices.
            "const unsigned long long k_lo = (unsigned long long)blockIdx.z * k_slice;".into(),
            "const unsigned long long k_hi = k_lo + k_slice < k ? k_lo + k_slice : k;".into(),
            "float* const out_z = ds4_out + (unsigned long long)blockIdx.z * out_slice;".into(),
        ] {
            w(&mut o, 1, &l);
        }
        // The x tile of the step at column `c0` into buffer `b`: 16-byte copies (zeros past
        // k and for empty token slots), or plain loads where rows are not 16-byte aligned.
        let x_copy = |o: &mut String, depth: usize, c0: &str, b: &str| {
            if let Some(t) = term {
                // The term path: this thread's 16 columns of its token in each of x's bf16
                // parts (two 16-byte chunks a part, stored swizzled as the tiles' rows), and
                // with an offset their sum (zeros for an empty token slot).
                w(o, depth, "{");
                w(o, depth + 1, &format!("const unsigned long long e = tok_x + {c0} + half;"));
                w(o, depth + 1, "const unsigned int bytes = tok_ok ? 16u : 0u;");
                w(o, depth + 1, &format!("unsigned char* const xd = tb + {} + ({b}) * {}u + trow * {TERM_ROW}ull;", 2 * TERM_TILE, TERM_PLANES * TERM_TILE));
                w(o, depth + 1, "#pragma unroll");
                w(o, depth + 1, &format!("for (int p = 0; p < {TERM_PLANES}; p++) {{"));
                w(o, depth + 2, "const unsigned char* const src = ds4_xp + (p * xp_stride + e) * 2ull;");
                for c in 0..2 {
                    let at = swizzle(&format!("2u * hb + {c}u"), "trow");
                    w(o, depth + 2, &format!("ds4_cp16(xd + p * {TERM_TILE}u + ({at} << 4), bytes != 0u ? (const void*)(src + {}) : (const void*)ds4_xp, bytes);", 16 * c));
                }
                w(o, depth + 1, "}");
                if t.offset {
                    let to_xsum = TERM_PAIRS / 4 * 4;
                    w(o, depth + 1, &format!("ds4_cp4((float*)(tb + {}u) + ({b}) * 128u + trow * 2ull + hb + {to_xsum}u, bytes != 0u ? (const void*)(ds4_xs16 + e / 16ull) : (const void*)ds4_xs16, bytes / 4u);", t.scales_at()));
                }
                w(o, depth, "}");
                return;
            }
            for l in [
                "{".to_string(),
                format!("    float* const xd = xs + ({b}) * {tf}u + trow * 36ull + half;"),
                format!("    const unsigned long long ex0 = {c0} + half;"),
                "    if ((k & 3ull) == 0ull) {".into(),
                "        for (int q = 0; q < 4; q++) {".into(),
                "            const unsigned long long e = ex0 + 4ull * q;".into(),
                "            const unsigned int bytes = tok_ok && e < k ? (k - e < 4ull ? (unsigned int)(k - e) * 4u : 16u) : 0u;".into(),
                "            ds4_cp16(xd + 4 * q, bytes != 0u ? (const void*)(ds4_x + tok_x + e) : (const void*)ds4_x, bytes);".into(),
                "        }".into(),
                "    } else {".into(),
                "        for (unsigned long long i = 0ull; i < 16ull; i++) xd[i] = (tok_ok && ex0 + i < k) ? ds4_x[tok_x + ex0 + i] : 0.0f;".into(),
                "    }".into(),
                "}".into(),
            ] {
                w(o, depth, &l);
            }
        };
        // The raw bytes of the stage at column `s0` into stage buffer `b`: vector q of this
        // thread is slot vi % nv of tile row vi / nv; only slots holding some of the row's
        // bytes are copied (none past the tensor's end).
        let stage_copy = |o: &mut String, depth: usize, st: &Stage, s0: &str, b: &str| {
            let (se, nv, pt) = (st.elems, st.vectors, st.per_thread());
            for l in [
                "{".to_string(),
                format!("    const unsigned long long cols = k - {s0} < {se}ull ? k - {s0} : {se}ull;"),
                format!("    const unsigned long long len = cols / {be}ull * {bb}ull;"),
                format!("    const unsigned long long at = ({s0} / {be}ull) * {bb}ull;"),
                format!("    unsigned char* const dst = wst + ({b}) * {}u;", st.buffer_bytes()),
                "    #pragma unroll".into(),
                format!("    for (int q = 0; q < {pt}; q++) {{"),
                "        const unsigned int vi = (unsigned int)ds4_tid + 128u * q;".into(),
                format!("        const unsigned int vr = vi / {nv}u, vc = vi % {nv}u;"),
                "        const unsigned long long rr = r0 + vr < n ? r0 + vr : 0ull;".into(),
                "        const unsigned long long a = (unsigned long long)(ds4_w + (ex * n + rr) * row_bytes + at);".into(),
                format!("        if (vi < {}u && 16ull * vc < (a & 15ull) + len) ds4_cp16(dst + 16u * vi, (const void*)((a & ~15ull) + 16ull * vc), 16u);", MMA_ROWS * nv),
                "    }".into(),
                "}".into(),
            ] {
                w(o, depth, &l);
            }
        };
        // One 32-column step at k0 into buffer `buf`: de-quantize (`row_base` and `e0`
        // locate the thread's 16 elements for `value_runs`, in the staged copy or in the
        // weights), wait for this step's copies, one barrier, start the next step's copies
        // (`next`), multiply.
        let step = |o: &mut String, depth: usize, lower: &Lower, row_base: &str, e0: &str, next: &dyn Fn(&mut String, usize)| -> Result<(), QuantGenError> {
            w(o, depth, "{");
            w(o, depth + 1, &format!("const unsigned long long row_base = {row_base};"));
            w(o, depth + 1, &format!("const unsigned long long e0 = {e0};"));
            w(o, depth + 1, "if (wrow < n) {");
            let store = |i: u64, v: &str| format!("wr[{i}] = {v};");
            for (d, l) in lower.value_runs(16, &store)? {
                w(o, depth + 2 + d, &l);
            }
            w(o, depth + 1, "} else {");
            w(o, depth + 2, "for (int i = 0; i < 16; i++) wr[i] = 0.0f;");
            w(o, depth + 1, "}");
            w(o, depth + 1, &format!("float* const wd = ws + buf * {tf}u + trow * 36ull + half;"));
            w(o, depth + 1, "for (int q = 0; q < 4; q++) *(float4*)(wd + 4 * q) = make_float4(wr[4 * q], wr[4 * q + 1], wr[4 * q + 2], wr[4 * q + 3]);");
            w(o, depth, "}");
            w(o, depth, "ds4_cp_wait();");
            w(o, depth, "__syncthreads();");
            next(o, depth);
            for l in [
                // MMA step σ = 2hs + s2 takes columns 8·t4 + 2σ (k = t4) and 8·t4 + 2σ + 1
                // (k = t4 + 4): one 16-byte load holds a lane's values for σ = 2hs, 2hs + 1.
                format!("const float* const wt = ws + buf * {tf}u + (wm * 32u + g) * 36u + t4 * 8u;"),
                format!("const float* const xt = xs + buf * {tf}u + (wn * 32u + g) * 36u + t4 * 8u;"),
                "#pragma unroll".into(),
                "for (int hs = 0; hs < 2; hs++) {".into(),
                "    float4 av[2][2], bv[4];".into(),
                "    for (int i = 0; i < 2; i++) {".into(),
                "        av[i][0] = *(const float4*)(wt + i * 16 * 36 + hs * 4);".into(),
                "        av[i][1] = *(const float4*)(wt + (i * 16 + 8) * 36 + hs * 4);".into(),
                "    }".into(),
                "    for (int j = 0; j < 4; j++) bv[j] = *(const float4*)(xt + j * 8 * 36 + hs * 4);".into(),
                "    #pragma unroll".into(),
                "    for (int s2 = 0; s2 < 2; s2++) {".into(),
                "        unsigned int ab[2][4], as_[2][4];".into(),
                "        for (int i = 0; i < 2; i++) {".into(),
                "            ds4_split_tf32(s2 ? av[i][0].z : av[i][0].x, ab[i][0], as_[i][0]);".into(),
                "            ds4_split_tf32(s2 ? av[i][1].z : av[i][1].x, ab[i][1], as_[i][1]);".into(),
                "            ds4_split_tf32(s2 ? av[i][0].w : av[i][0].y, ab[i][2], as_[i][2]);".into(),
                "            ds4_split_tf32(s2 ? av[i][1].w : av[i][1].y, ab[i][3], as_[i][3]);".into(),
                "        }".into(),
                "        for (int j = 0; j < 4; j++) {".into(),
                "            unsigned int bb[2], bs[2];".into(),
                "            ds4_split_tf32(s2 ? bv[j].z : bv[j].x, bb[0], bs[0]);".into(),
                "            ds4_split_tf32(s2 ? bv[j].w : bv[j].y, bb[1], bs[1]);".into(),
                "            for (int i = 0; i < 2; i++) {".into(),
                "                ds4_mma_tf32(c[i][j], as_[i], bb);".into(),
                "                ds4_mma_tf32(c[i][j], ab[i], bs);".into(),
                "                ds4_mma_tf32(c[i][j], ab[i], bb);".into(),
                "            }".into(),
                "        }".into(),
                "    }".into(),
                "}".into(),
            ] {
                w(o, depth, &l);
            }
            Ok(())
        };
        let st = &stage;
        let se = st.elems;
        match term {
            Some(t) => w(&mut o, 1, &format!("unsigned char* const wst = tb + {};", t.scales_at() + t.pairs_bytes())),
            None => w(&mut o, 1, &format!("unsigned char* const wst = (unsigned char*)(xs + {});", 2 * tf)),
        }
        // This thread's row in the staged copy of the stage at column `s` in buffer `b`: its
        // slots plus the row's shift, less the stage's first block (the walk's element
        // indices are the row's: `ea < k` holds).
        let row_in_stage = |b: &str, s: &str| format!("({b}) * {}ull + trow * {}ull + (((unsigned long long)(ds4_w + row_at + (({s}) / {be}ull) * {bb}ull)) & 15ull) - (({s}) / {be}ull) * {bb}ull", st.buffer_bytes(), st.vectors * 16);
        let staged = Lower { wbuf: "wst", reads: Reads::Staged, dot: true, ..*self };
        // The first stage and x tile, complete before the first step reads them.
        stage_copy(&mut o, 1, st, "k_lo", "0u");
        x_copy(&mut o, 1, "k_lo", "0u");
        w(&mut o, 1, "ds4_cp_wait();");
        w(&mut o, 1, "__syncthreads();");
        if let Some(t) = term {
            // The element-term path is pipelined one step further: a step's terms are
            // de-quantized during the previous step, after its MMAs (the two are
            // independent, so their latencies overlap), and the barrier that starts a step
            // makes them visible.
            w(&mut o, 1, &format!("const unsigned long long my_at0 = {};", row_in_stage("0u", "k_lo")));
            self.term_dequant(&mut o, 1, &staged, t, ("my_at0", "k_lo + half", "0u"))?;
        }
        w(&mut o, 1, "unsigned int buf = 0u, sb = 0u;");
        w(&mut o, 1, &format!("for (unsigned long long s0 = k_lo; s0 < k_hi; s0 += {se}ull, sb ^= 1u) {{"));
        if term.is_none() {
            w(&mut o, 2, &format!("const unsigned long long my_at = {};", row_in_stage("sb", "s0")));
        }
        w(&mut o, 2, &format!("for (unsigned long long k0 = s0; k0 < s0 + {se}ull && k0 < k_hi; k0 += 32ull, buf ^= 1u) {{"));
        let next = |o: &mut String, d: usize| {
            // The next stage goes out during this stage's first step.
            w(o, d, &format!("if (k0 == s0 && s0 + {se}ull < k_hi) {{"));
            stage_copy(o, d + 1, st, &format!("(s0 + {se}ull)"), "sb ^ 1u");
            w(o, d, "}");
            w(o, d, "if (k0 + 32ull < k_hi) {");
            x_copy(o, d + 1, "(k0 + 32ull)", "buf ^ 1u");
            w(o, d, "}");
        };
        match term {
            Some(t) => {
                // This step's terms and copies are complete (the previous step waited for
                // its copies): one barrier, the next copies, this step's MMAs, the next
                // step's terms (from the next stage's buffer at a stage's last step: that
                // stage was copied during this stage's first step), the wait.
                w(&mut o, 3, "__syncthreads();");
                next(&mut o, 3);
                self.term_multiply(&mut o, 3, t);
                w(&mut o, 3, "if (k0 + 32ull < k_hi) {");
                w(&mut o, 4, &format!("const bool same = k0 + 32ull < s0 + {se}ull;"));
                w(&mut o, 4, &format!("const unsigned long long my_at1 = {};", row_in_stage("same ? sb : (sb ^ 1u)", &format!("same ? s0 : s0 + {se}ull"))));
                self.term_dequant(&mut o, 4, &staged, t, ("my_at1", "k0 + 32ull + half", "buf ^ 1u"))?;
                w(&mut o, 3, "}");
                w(&mut o, 3, "ds4_cp_wait();");
            }
            None => step(&mut o, 3, &staged, "my_at", "k0 + half", &next)?,
        }
        w(&mut o, 2, "}");
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
            "                out_z[(unsigned long long)p * n + row] = c[i][j][q];",
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

impl Lower<'_> {
    /// The element-term path's de-quantization of one 32-column step: the thread's 16
    /// terms (row `trow`, element `e0` of its row, its bytes at `row_base` of the staged
    /// copy) as bf16 into the term tile of buffer `buf`, with their scale (and offset).
    fn term_dequant(&self, o: &mut String, depth: usize, lower: &Lower, t: TermMma, (row_base, e0, buf): (&str, &str, &str)) -> Result<(), QuantGenError> {
        let w = |o: &mut String, d: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(d));
        };
        let (tt, tp) = (TERM_TILE, TERM_PAIRS);
        // Floats from the scales to the offsets.
        let to_of = tp / 4 * 2;
        let pack = |q: usize| format!("__byte_perm(__float_as_uint(tv[{}]), __float_as_uint(tv[{}]), 0x7632u)", 2 * q, 2 * q + 1);
        let uint4 = |base: usize, f: &dyn Fn(usize) -> String| format!("make_uint4({}, {}, {}, {})", f(base), f(base + 1), f(base + 2), f(base + 3));
        w(o, depth, "{");
        w(o, depth + 1, &format!("const unsigned long long row_base = {row_base};"));
        w(o, depth + 1, &format!("const unsigned long long e0 = {e0};"));
        w(o, depth + 1, "float t_sc = 0.0f, t_of = 0.0f;");
        w(o, depth + 1, "if (wrow < n) {");
        let store = |i: u64, v: &str| format!("tv[{i}] = {v};");
        let scale = |sc: &str, off: Option<&str>| match off {
            Some(of) => format!("t_sc = {sc}; t_of = {of};"),
            None => format!("t_sc = {sc};"),
        };
        for (d, l) in lower.term_runs(16, &store, &scale)? {
            w(o, depth + 2 + d, &l);
        }
        w(o, depth + 1, "} else {");
        w(o, depth + 2, "for (int i = 0; i < 16; i++) tv[i] = 0.0f;");
        w(o, depth + 1, "}");
        w(o, depth + 1, &format!("uint4* const wd = (uint4*)(tb + ({buf}) * {tt}u + trow * {TERM_ROW}ull);"));
        w(o, depth + 1, &format!("wd[{}] = {};", swizzle("2u * hb", "trow"), uint4(0, &pack)));
        w(o, depth + 1, &format!("wd[{}] = {};", swizzle("2u * hb + 1u", "trow"), uint4(4, &pack)));
        w(o, depth + 1, &format!("float* const scw = (float*)(tb + {}u) + ({buf}) * 128u + trow * 2ull + hb;", t.scales_at()));
        w(o, depth + 1, "scw[0] = t_sc;");
        if t.offset {
            w(o, depth + 1, &format!("scw[{to_of}] = t_of;"));
        }
        w(o, depth, "}");
        Ok(())
    }

    /// The element-term path's multiply of one 32-column step from buffer `buf`: per 16
    /// columns a fresh `term · (l + m + h)` on the tensor cores, scaled into the
    /// accumulators (see the module comment).
    fn term_multiply(&self, o: &mut String, depth: usize, t: TermMma) {
        let w = |o: &mut String, d: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(d));
        };
        let (tt, tp) = (TERM_TILE, TERM_PAIRS);
        // Floats from the scales to the offsets and to x's sums.
        let (to_of, to_xsum) = (tp / 4 * 2, tp / 4 * 4);
        let np = TERM_PLANES as usize;
        for l in [
            "const unsigned int tb_s = (unsigned int)__cvta_generic_to_shared(tb);".to_string(),
            format!("const float* const scr = (const float*)(tb + {}u) + buf * 128u;", t.scales_at()),
            // Lane l gives row l % 16, chunk l / 16 (of the 16 columns) of A's four 8 x 8
            // matrices, and token l % 8 + 8·(l / 16), chunk l / 8 % 2 of B's (two 8-token
            // tiles); rows 16 apart swizzle alike, so each lane's chunk is fixed up to the
            // step's half (`sg`, XORed in).
            format!("const unsigned int a_at = tb_s + buf * {tt}u + (wm * 32u + (lane & 15u)) * {TERM_ROW}u;"),
            format!("const unsigned int a_c = {};", swizzle("lane >> 4", "lane & 15u")),
            format!("const unsigned int b_at = tb_s + {}u + buf * {}u + (wn * 32u + (lane & 7u) + (lane >> 4) * 8u) * {TERM_ROW}u;", 2 * tt, TERM_PLANES * tt),
            format!("const unsigned int b_c = {};", swizzle("(lane >> 3) & 1u", "lane & 7u")),
            "const float zero4[4] = {0.0f, 0.0f, 0.0f, 0.0f};".into(),
        ] {
            w(o, depth, &l);
        }
        // Scaled once per step (the scale holds for both 16 columns: `scale_span`), the
        // fresh products of both kept (`fr`); else once per 16 columns.
        let once = t.span32;
        let (fresh, first) = if once { ("fr[i][j]", "sg == 0 ? zero4 : fr[i][j]") } else { ("f", "zero4") };
        let scale_into = |o: &mut String, d: usize, f: &str, sc: &str| {
            w(o, d, "#pragma unroll");
            w(o, d, "for (int q = 0; q < 4; q++) {");
            w(o, d + 1, &format!("c[i][j][q] = __fmaf_rn({sc}, {f}[q], c[i][j][q]);"));
            w(o, d, "}");
        };
        if once {
            w(o, depth, "float fr[2][4][4];");
        }
        for l in [
            "#pragma unroll".to_string(),
            "for (int sg = 0; sg < 2; sg++) {".into(),
            "    unsigned int a[2][4];".into(),
            "    #pragma unroll".into(),
            format!("    for (int i = 0; i < 2; i++) ds4_ldsm_x4(a[i], a_at + i * {}u + ((a_c ^ (2u * sg)) << 4));", 16 * TERM_ROW),
            // This thread's rows' scales and offsets for these 16 columns (registers: the
            // matrix loads' memory clobbers would make the compiler read them again).
            "    float rs[2][2], ro[2][2];".into(),
            "    #pragma unroll".into(),
            "    for (int r = 0; r < 4; r++) {".into(),
            "        const unsigned int at = (wm * 32u + (r >> 1) * 16u + g + 8u * (r & 1)) * 2u + sg;".into(),
            "        rs[r >> 1][r & 1] = scr[at];".into(),
            format!("        ro[r >> 1][r & 1] = {};", if t.offset { format!("scr[{to_of}u + at]") } else { "0.0f".into() }),
            "    }".into(),
            "    #pragma unroll".into(),
            "    for (int jp = 0; jp < 2; jp++) {".into(),
            format!("        unsigned int b[{np}][4];"),
            "        #pragma unroll".into(),
            format!("        for (int p = 0; p < {np}; p++) ds4_ldsm_x4(b[p], b_at + p * {tt}u + jp * {}u + ((b_c ^ (2u * sg)) << 4));", 16 * TERM_ROW),
            "        #pragma unroll".into(),
            "        for (int jj = 0; jj < 2; jj++) {".into(),
            "            const int j = jp * 2 + jj;".into(),
            "            #pragma unroll".into(),
            "            for (int i = 0; i < 2; i++) {".into(),
        ] {
            w(o, depth, &l);
        }
        let d = depth + 4;
        if !once {
            w(o, d, "float f[4];");
        }
        // The smallest part first: the sum loses the least.
        w(o, d, &format!("ds4_mma_bf16({fresh}, a[i], b[{l}][2 * jj], b[{l}][2 * jj + 1], {first});", l = np - 1));
        w(o, d, "#pragma unroll");
        w(o, d, &format!("for (int p = {}; p >= 0; p--) ds4_mma_bf16({fresh}, a[i], b[p][2 * jj], b[p][2 * jj + 1], {fresh});", np - 2));
        if !once {
            scale_into(o, d, "f", "rs[i][q >> 1]");
        }
        if t.offset {
            // offset · Σ x over the 16 columns, for tokens 2·t4 and 2·t4 + 1.
            w(o, d, "#pragma unroll");
            w(o, d, "for (int q = 0; q < 4; q++) {");
            w(o, d + 1, &format!("const float xsum = scr[{to_xsum}u + (wn * 32u + j * 8u + 2u * t4 + (q & 1)) * 2u + sg];"));
            w(o, d + 1, "c[i][j][q] = __fmaf_rn(ro[i][q >> 1], xsum, c[i][j][q]);");
            w(o, d, "}");
        }
        for l in ["            }", "        }", "    }", "}"] {
            w(o, depth, l);
        }
        if once {
            w(o, depth, "#pragma unroll");
            w(o, depth, "for (int i = 0; i < 2; i++) {");
            w(o, depth + 1, "#pragma unroll");
            w(o, depth + 1, "for (int j = 0; j < 4; j++) {");
            scale_into(o, depth + 2, "fr[i][j]", "scr[(wm * 32u + i * 16u + g + 8u * (q >> 1)) * 2u]");
            w(o, depth + 1, "}");
            w(o, depth, "}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which types take the element-term path, and why the others do not.
    #[test]
    fn integer_term_types_take_the_bf16_path() {
        use ds4_ir::GgmlType::*;
        let syn = crate::quant::syntax(crate::Target::CudaSm90).unwrap();
        for (t, path, span) in [
            (Q8_0, Some(TermMma { offset: false, span32: true }), 32),
            (Q2K, Some(TermMma { offset: true, span32: false }), 16),
            (Q4K, Some(TermMma { offset: true, span32: true }), 32),
            (Q6K, Some(TermMma { offset: false, span32: false }), 16),
            // Its scale reads `s / 4`: four sub-blocks of 8.
            (Iq2Xxs, Some(TermMma { offset: false, span32: true }), 32),
            (Mxfp4, Some(TermMma { offset: false, span32: true }), 32),
            // One element per block: nothing factored, the value itself is not exact in bf16.
            (F16, None, 0),
            (F32, None, 0),
        ] {
            let spec = ds4_ir::quant::spec(t).unwrap();
            let l = Lower { syn: syn.as_ref(), spec, shared_tables: false, wbuf: "ds4_w", reads: Reads::Bytes, run_elem: None, dot: false };
            assert_eq!(l.term_mma(), path, "{t}");
            assert_eq!(l.scale_span(), span, "{t}");
        }
    }

    #[test]
    fn stages_hold_whole_blocks_and_at_least_two_steps() {
        for (be, want) in [(1u64, 64u64), (32, 64), (256, 256), (48, 192)] {
            let se = stage_elems(be);
            assert_eq!(se, want, "{be}");
            assert_eq!(se % be, 0);
            assert_eq!(se % 32, 0);
            assert!(se >= 64);
        }
    }
}
