//! `attention_tiled`: `attention_partial` for CUDA, written as CUDA text, with the same
//! parameters and output (so `attention_merge` folds either's chunks).
//!
//! The model's attention is MQA: every query head of a token sees the same key rows
//! (K = V, one shared head), so a token's work is a small GEMM pair, S = Q·Kᵀ and O = P·V.
//! The generated `attention_partial` runs a block per (token, head) and walks the rows one
//! at a time with a block-wide sum per row (latency-bound). Here a block serves
//! [`TILE_HEADS`] heads of one token (and one chunk of its row list), and each key row
//! brought into shared memory is used by all of them.
//!
//! Block = (token, group of 16 heads, chunk), 256 threads, rows in tiles of
//! [`TILE_ROWS`] = 16:
//! 1. **Row list.** The chunk's list entries (window rows, then compressed rows, -1 picks
//!    skipped) are compacted into a ring of row codes in shared memory, 256 entries at a
//!    time (a ballot per warp), so that every tile but the last is full of present rows.
//! 2. **Stage** the tile's 16 rows, full width (16 × 512 floats = 32 KB), by 16-byte
//!    `cp.async` copies where `hd` and the pointers allow (plain loads otherwise), into one
//!    of two buffers: the next tile's rows travel while this tile is computed (one
//!    barrier a tile for both). The slots a tile leaves empty (rows past its count,
//!    columns past `hd`) are written with zeros as it is staged, so they stay finite.
//! 3. **Logits.** Thread (hq = warp / 2, dl = 32·(warp % 2) + lane) owns heads 4·hq .. +4
//!    of the group and dimensions 4·dl + 256·j + e (j < 2, e < 4): Q for those 32 (head,
//!    dim) pairs sits in registers, loaded once. Per 8 rows it forms 4 × 8 partial dot
//!    products over its 8 dimensions (each float4 of a row feeds 16 FMAs), sums them over
//!    the warp's 32 lanes with a reduce-scatter (31 shuffles leave lane l with the sum of
//!    head l / 8, row l % 8) and writes them to shared memory; the two warps of a head
//!    quad hold the two halves of the dimensions.
//! 4. **Softmax.** Thread (head tid / 16, row tid % 16) adds the halves, scales, and runs
//!    the online softmax for its head over the tile (max and sum over 16 lanes by
//!    shuffles): m' = max(m, tile max), corr = exp(m − m'), p = exp(s − m'),
//!    l = l·corr + Σ p. Rows past the tile's count get s = −∞ (p = 0). p is taken in
//!    double (one exp per thread and tile): the rows' terms may cancel in O, and expf's
//!    2 ulp would show there.
//! 5. **Output.** O (the same 4 heads × 8 dimensions per thread, in registers) becomes
//!    O·corr + Σ_rows p·V, V read from the staged tile (K = V): each float4 again feeds 16
//!    FMAs, and the 4 probabilities of a row are one broadcast load. The tile's sum is
//!    formed apart (in the logits' registers) and added once: one rounding of O per tile.
//!
//! Shared memory: the two tile buffers, 64 KB dynamic ([`DYN_SHARED_BYTES`]), and
//! static logits 2 KB, probabilities 1 KB, the row ring 2 KB ([`SHARED_BYTES`]), so two
//! blocks fit an SM along with ~80 KB of L1. Registers: Q, O and the logit (then tile
//! sum) accumulators, 32 floats each, and a few indices: `__launch_bounds__(256, 2)` caps
//! them at 128 per thread.
//!
//! Q and O in registers cover [`MAX_HD`] = 512 dimensions per head; the runtime runs the
//! generated `attention_partial` for larger heads. Heads past `heads` in the last group
//! compute on zeros and are not written. FMAs are explicit (`fmaf`: the kernels are
//! compiled with `--fmad=false`), and the order of the sums differs from the reference's,
//! so results move by rounding only.

use crate::Target;
use ds4_ir::kernels::attention::{self, COMP_CAUSAL, COMP_SELECTED};
use ds4_ir::kir::Kernel;

/// The kernel's entry point.
pub const NAME: &str = "attention_tiled";
/// The same kernel at one block an SM (`__launch_bounds__(256, 1)`: 192 registers and no
/// spills from NVRTC on the H200, where two blocks an SM cap them at 128 and spill 40
/// bytes; nvcc: 188, and 136 bytes), for launches of at most one block an SM (a
/// decode's): H200, a CSA layer's decode attention 10.9 → 10.2 µs, an HCA layer's 7.6 →
/// 7.2 (`scripts/lab/attention_lab.sh`); with more blocks than SMs it is slower (40
/// chunks: 11.5 → 13.6).
pub const ONE_NAME: &str = "attention_tiled_one";
/// Query heads per block.
pub const TILE_HEADS: usize = 16;
/// Key rows per tile.
pub const TILE_ROWS: usize = 16;
/// Threads per block: one per (head, row) of a tile in the softmax step.
pub const THREADS: u32 = (TILE_HEADS * TILE_ROWS) as u32;
/// The largest head dimension the kernel takes (Q and O held in registers).
pub const MAX_HD: usize = 512;
/// Capacity of the ring of row codes: one refill (THREADS entries) on top of a tile's
/// worth minus one, rounded up to a power of two.
const QUEUE: usize = 512;
/// Static shared memory: the two halves of the logits, the probabilities, the
/// correction factors, the row ring and the per-warp counts.
pub const SHARED_BYTES: u32 = (4 * (2 * TILE_HEADS * TILE_ROWS + TILE_ROWS * TILE_HEADS + TILE_HEADS + QUEUE + THREADS as usize / 32)) as u32;
/// Dynamic shared memory (given at launch): two tile buffers of rows.
pub const DYN_SHARED_BYTES: u32 = (2 * 4 * TILE_ROWS * MAX_HD) as u32;

// The layout the CUDA text assumes: static shared memory; a thread per (head, row) in the
// softmax step; 8 warps of 4 heads × half the dimensions, 8 of them per thread, for the
// dot products; a ring that takes a refill on top of a tile's leftovers.
const _: () = assert!(SHARED_BYTES <= 48 * 1024 && 2 * (SHARED_BYTES + DYN_SHARED_BYTES + 1024) <= 228 * 1024);
const _: () = assert!(TILE_HEADS == 16 && TILE_ROWS == 16 && THREADS == 256);
const _: () = assert!(MAX_HD == 2 * 32 * 8);
const _: () = assert!(QUEUE.is_power_of_two() && QUEUE >= THREADS as usize + TILE_ROWS - 1);

/// The IR kernel whose parameters and output layout `attention_tiled` shares.
pub fn contract() -> Kernel {
    attention::attention_partial_kir()
}

/// Blocks of one launch: (token, head group, chunk), in that order.
pub fn blocks(tokens: usize, heads: usize, nc: usize) -> usize {
    tokens * heads.div_ceil(TILE_HEADS) * nc
}

/// The kernel's CUDA source for a CUDA target (`None` for the others).
pub fn source(target: Target) -> Option<String> {
    tiled_source(target, NAME, 2)
}

/// [`ONE_NAME`]'s CUDA source (`None` off CUDA).
pub fn one_source(target: Target) -> Option<String> {
    tiled_source(target, ONE_NAME, 1)
}

/// Whether a launch of `blocks` blocks takes [`ONE_NAME`] on a device of `sms` SMs.
pub fn one_a_sm(blocks: usize, sms: usize) -> bool {
    blocks <= sms
}

fn tiled_source(target: Target, name: &str, blocks_per_sm: u32) -> Option<String> {
    let mut s = String::new();
    for (name, v) in [
        ("TILE_HEADS", TILE_HEADS),
        ("TILE_ROWS", TILE_ROWS),
        ("THREADS", THREADS as usize),
        ("WARPS", THREADS as usize / 32),
        ("MAX_HD", MAX_HD),
        ("QUEUE", QUEUE),
        ("COMP_CAUSAL", COMP_CAUSAL),
        ("COMP_SELECTED", COMP_SELECTED),
    ] {
        s.push_str(&format!("constexpr unsigned int {name} = {v}u;\n"));
    }
    s.push_str(crate::cuda::CP_ASYNC);
    s.push_str(HELPERS);
    crate::cuda::text_kernel(target, name, "codegen/src/cuda_attention.rs", &s, &format!("{THREADS}, {blocks_per_sm}"), &contract(), BODY)
}

const HELPERS: &str = r#"
__device__ __forceinline__ usize ds4_min_usize(usize a, usize b) { return a < b ? a : b; }

// One step of a warp reduce-scatter over 2·O values per lane: each lane keeps the half
// whose index bit O matches its lane bit O, and adds the partner lane's copy of it.
template <int O>
__device__ __forceinline__ void ds4_reduce_scatter_step(float* v, const unsigned int lane) {
    const bool up = (lane & (unsigned int)O) != 0u;
#pragma unroll
    for (int k = 0; k < O; k++) {
        const float send = up ? v[k] : v[k + O];
        const float keep = up ? v[k + O] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

// v[i] (32 values per lane) summed over the warp's lanes: lane l is left with the sum of
// v[l] in v[0].
__device__ __forceinline__ float ds4_warp_reduce_scatter32(float* v, const unsigned int lane) {
    ds4_reduce_scatter_step<16>(v, lane);
    ds4_reduce_scatter_step<8>(v, lane);
    ds4_reduce_scatter_step<4>(v, lane);
    ds4_reduce_scatter_step<2>(v, lane);
    ds4_reduce_scatter_step<1>(v, lane);
    return v[0];
}

"#;

const BODY: &str = r#"    extern __shared__ __align__(16) float kv_buf[];
    __shared__ __align__(16) float logit[2 * TILE_HEADS * TILE_ROWS];
    __shared__ __align__(16) float prob[TILE_ROWS * TILE_HEADS];
    __shared__ __align__(16) float corr[TILE_HEADS];
    __shared__ int queue[QUEUE];
    __shared__ unsigned int warp_count[WARPS];
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const unsigned int warp = tid >> 5;
    const usize groups = (heads + TILE_HEADS - 1) / TILE_HEADS;
    const usize chunk = blockIdx.x % nc;
    const usize g = (blockIdx.x / nc) % groups;
    const usize t = blockIdx.x / nc / groups;

    // The token's row list and this chunk's entries [a, b), as in attention_partial.
    const usize pos = pos0 + t;
    usize lo = 0;
    if (pos + 1 > window + win_pos0) {
        lo = pos + 1 - window - win_pos0;
    }
    const usize hi = ds4_min_usize(pos + 1 - win_pos0, n_win);
    usize visible_comp = 0;
    if (comp_mode == COMP_CAUSAL) {
        visible_comp = ds4_min_usize((pos + 1) / ratio, n_comp);
    }
    if (comp_mode == COMP_SELECTED) {
        visible_comp = k_sel;
    }
    const usize n_w = hi - lo;
    const usize n_rows = n_w + visible_comp;
    const usize a = chunk * n_rows / nc;
    const usize b = (chunk + 1) * n_rows / nc;

    // This thread's 4 heads (4·hq + i of the group) and 8 dimensions (4·dl + 256·j + e):
    // their Q, and their output accumulators.
    const unsigned int hq = warp >> 1;
    const unsigned int half = warp & 1u;
    const unsigned int dl = half * 32u + lane;
    const unsigned int jn = hd > MAX_HD / 2 ? 2u : 1u;
    float qv[4][2][4];
    float o[4][2][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const usize head = g * TILE_HEADS + 4u * hq + i;
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const usize d = 4u * dl + (MAX_HD / 2) * j + e;
                qv[i][j][e] = head < heads && d < hd ? q[(t * heads + head) * hd + d] : 0.0f;
                o[i][j][e] = 0.0f;
            }
        }
    }
    // The softmax state of head tid / 16 (the same in its 16 threads); chunk 0 starts
    // from the sink.
    const usize shead = g * TILE_HEADS + (tid >> 4);
    float m = __int_as_float(0xff800000);
    float l = 0.0f;
    if (chunk == 0) {
        m = shead < heads ? sinks[shead] : 0.0f;
        l = 1.0f;
    }

    const bool vec = (hd & 3ull) == 0ull && (((usize)win | (usize)comp) & 15ull) == 0ull;
    // Ring of row codes (r ≥ 0: window row r, ~c: compressed row c): [qhead, qtail) are
    // present rows not yet used (the tile being computed first), `next` the first list
    // entry not yet looked at.
    unsigned int qhead = 0u;
    unsigned int qtail = 0u;
    usize next = a;
    // The tile in buffer `cur` (rows [qhead, qhead + count) of the ring) is computed while
    // the next one is copied into the other buffer.
    unsigned int cur = 0u;
    unsigned int count = 0u;
    for (bool first = true;; first = false) {
        const unsigned int nhead = qhead + count;
        // Top the ring up to the next tile: the next THREADS entries, present ones in list
        // order.
        while (qtail - nhead < TILE_ROWS && next < b) {
            const usize e = next + tid;
            int code = 0;
            bool present = false;
            if (e < b) {
                if (e < n_w) {
                    code = (int)(lo + e);
                    present = true;
                } else {
                    int r = (int)(e - n_w);
                    if (comp_mode == COMP_SELECTED) {
                        r = sel[t * k_sel + (e - n_w)];
                    }
                    present = r >= 0;
                    code = ~r;
                }
            }
            const unsigned int ballot = __ballot_sync(0xffffffffu, present);
            if (lane == 0u) {
                warp_count[warp] = __popc(ballot);
            }
            __syncthreads();
            unsigned int before = 0u;
            unsigned int total = 0u;
            for (unsigned int w = 0; w < WARPS; w++) {
                const unsigned int c = warp_count[w];
                before += w < warp ? c : 0u;
                total += c;
            }
            if (present) {
                queue[(qtail + before + __popc(ballot & ((1u << lane) - 1u))) & (QUEUE - 1u)] = code;
            }
            qtail += total;
            next += THREADS;
            __syncthreads();
        }
        const unsigned int ncount = qtail - nhead < TILE_ROWS ? qtail - nhead : TILE_ROWS;

        // Stage the next tile's rows into the other buffer. Its other slots (rows past its
        // count, columns past hd) get zeros: the products read them with p = 0 and must
        // not meet a NaN. (Zeroing both buffers up front instead cost ~0.5 µs a launch.)
        // No next tile (the loop ends after this one): nothing to stage.
        if (ncount > 0u) {
            float* const dst = kv_buf + (cur ^ (first ? 0u : 1u)) * (TILE_ROWS * MAX_HD);
            if (vec) {
                constexpr unsigned int PER_THREAD = TILE_ROWS * MAX_HD / 4 / THREADS;
#pragma unroll
                for (unsigned int s = 0; s < PER_THREAD; s++) {
                    const unsigned int idx = tid + s * THREADS;
                    const unsigned int k = idx / (MAX_HD / 4);
                    const unsigned int c = idx % (MAX_HD / 4);
                    if (k < ncount && 4u * c < hd) {
                        const int code = queue[(nhead + k) & (QUEUE - 1u)];
                        const float* row = code >= 0 ? win + (usize)code * hd : comp + (usize)(~code) * hd;
                        ds4_cp16(dst + 4u * idx, row + 4u * c, 16u);
                    } else {
                        *(float4*)(dst + 4u * idx) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
                }
            } else {
                for (unsigned int idx = tid; idx < TILE_ROWS * MAX_HD; idx += THREADS) {
                    const unsigned int k = idx / MAX_HD;
                    const unsigned int c = idx % MAX_HD;
                    if (k < ncount && c < hd) {
                        const int code = queue[(nhead + k) & (QUEUE - 1u)];
                        const float* row = code >= 0 ? win + (usize)code * hd : comp + (usize)(~code) * hd;
                        dst[idx] = row[c];
                    } else {
                        dst[idx] = 0.0f;
                    }
                }
            }
        }
        if (first) {
            // Nothing to compute yet: the first tile is the one just staged.
            ds4_cp_wait();
            __syncthreads();
            count = ncount;
            if (count == 0u) {
                break;
            }
            continue;
        }
        const float4* kv4 = (const float4*)(kv_buf + cur * (TILE_ROWS * MAX_HD));

        // Logits, 8 rows at a time: 4 heads × 8 rows over this thread's dimensions, summed
        // over the warp (lane l: head 4·hq + l / 8, row l % 8); logit[half] holds the
        // sums over each half of the dimensions.
#pragma unroll
        for (unsigned int ro = 0; ro < TILE_ROWS; ro += 8u) {
            if (ro < count) {
                float acc[32];
#pragma unroll
                for (int x = 0; x < 32; x++) {
                    acc[x] = 0.0f;
                }
#pragma unroll
                for (unsigned int j = 0; j < 2u; j++) {
                    if (j < jn) {
#pragma unroll
                        for (unsigned int r = 0; r < 8u; r++) {
                            const float4 kk = kv4[(ro + r) * (MAX_HD / 4) + dl + (MAX_HD / 8) * j];
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                float s = acc[i * 8 + r];
                                s = fmaf(qv[i][j][0], kk.x, s);
                                s = fmaf(qv[i][j][1], kk.y, s);
                                s = fmaf(qv[i][j][2], kk.z, s);
                                s = fmaf(qv[i][j][3], kk.w, s);
                                acc[i * 8 + r] = s;
                            }
                        }
                    }
                }
                const float sum = ds4_warp_reduce_scatter32(acc, lane);
                logit[(half * TILE_HEADS + 4u * hq + (lane >> 3)) * TILE_ROWS + ro + (lane & 7u)] = sum;
            }
        }
        __syncthreads();

        // Online softmax of head tid / 16 over the tile (row tid % 16).
        {
            const unsigned int row = tid & (TILE_ROWS - 1u);
            float s = __int_as_float(0xff800000);
            if (row < count) {
                s = (logit[tid] + logit[TILE_HEADS * TILE_ROWS + tid]) * scale;
            }
            float tile_max = s;
#pragma unroll
            for (int x = TILE_ROWS / 2; x > 0; x >>= 1) {
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, x));
            }
            const float m_new = fmaxf(m, tile_max);
            const float c = expf(m - m_new);
            // p weighs one row, and the rows' terms may cancel in O: the difference and
            // the exp in double keep p to f32 rounding (expf is off by up to 2 ulp).
            const float p = (float)exp((double)s - (double)m_new);
            float p_sum = p;
#pragma unroll
            for (int x = TILE_ROWS / 2; x > 0; x >>= 1) {
                p_sum += __shfl_xor_sync(0xffffffffu, p_sum, x);
            }
            l = l * c + p_sum;
            m = m_new;
            prob[row * TILE_HEADS + (tid >> 4)] = p;
            if (row == 0u) {
                corr[tid >> 4] = c;
            }
        }
        __syncthreads();

        // O = O·corr + Σ_rows p·V (rows past count have p = 0). The tile's sum has its own
        // accumulators (those of the logits, free by now), so that O takes one rounding
        // per tile instead of one per row: lists run to hundreds of rows.
        {
            float pv[4][2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        pv[i][j][e] = 0.0f;
                    }
                }
            }
#pragma unroll
            for (unsigned int ro = 0; ro < TILE_ROWS; ro += 8u) {
                if (ro < count) {
#pragma unroll
                    for (unsigned int r = 0; r < 8u; r++) {
                        const float4 p4 = ((const float4*)prob)[(ro + r) * (TILE_HEADS / 4) + hq];
                        const float ps[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                        for (unsigned int j = 0; j < 2u; j++) {
                            if (j < jn) {
                                const float4 vv = kv4[(ro + r) * (MAX_HD / 4) + dl + (MAX_HD / 8) * j];
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    pv[i][j][0] = fmaf(ps[i], vv.x, pv[i][j][0]);
                                    pv[i][j][1] = fmaf(ps[i], vv.y, pv[i][j][1]);
                                    pv[i][j][2] = fmaf(ps[i], vv.z, pv[i][j][2]);
                                    pv[i][j][3] = fmaf(ps[i], vv.w, pv[i][j][3]);
                                }
                            }
                        }
                    }
                }
            }
            const float4 c4 = ((const float4*)corr)[hq];
            const float cs[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        o[i][j][e] = fmaf(o[i][j][e], cs[i], pv[i][j][e]);
                    }
                }
            }
        }
        qhead = nhead;
        count = ncount;
        cur ^= 1u;
        // The next tile's rows have arrived, and it overwrites logit, prob and corr (and
        // then this tile's buffer).
        ds4_cp_wait();
        __syncthreads();
        if (count == 0u) {
            break;
        }
    }

    // The item ((token, head), chunk) of each head: hd sums, then max and sum.
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const usize head = g * TILE_HEADS + 4u * hq + i;
        if (head < heads) {
            float* dst = out + ((t * heads + head) * nc + chunk) * (hd + 2);
#pragma unroll
            for (int j = 0; j < 2; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const usize d = 4u * dl + (MAX_HD / 2) * j + e;
                    if (d < hd) {
                        dst[d] = o[i][j][e];
                    }
                }
            }
        }
    }
    if ((tid & (TILE_ROWS - 1u)) == 0u && shead < heads) {
        float* dst = out + ((t * heads + shead) * nc + chunk) * (hd + 2);
        dst[hd] = m;
        dst[hd + 1] = l;
    }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_tokens_head_groups_and_chunks() {
        assert_eq!(blocks(2048, 64, 1), 2048 * 4);
        assert_eq!(blocks(1, 3, 32), 32);
        assert_eq!(blocks(5, 17, 2), 5 * 2 * 2);
    }
}
