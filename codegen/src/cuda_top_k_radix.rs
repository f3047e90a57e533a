//! `top_k_radix`: `top_k` for CUDA over long rows, written as CUDA text: a block finds
//! the k-th largest sort key by radix selection, then sorts only the k keys it selects.
//! The same parameters and the same picks, in the same order, as the generated `top_k`
//! and `top_k_sort` (`cuda_top_k.rs`, whose sort keys and sort it uses).
//!
//! The indexer's top-k grows with the context: a decode token's row holds one score per
//! compressed row (ctx / 4), of which it keeps 512. `top_k_sort` sorts the whole row in
//! shared memory, log²(n)/2 passes with a barrier each: on the H200 ~150 µs a call for
//! 8,192 scores (ctx 32K, 21 calls a decode step, ~3 ms of a ~12 ms step), and rows past
//! its 16,384 keys fall back to the generated kernel, whose work grows with n·k.
//!
//! Here the keys (`ds4_top_k_key`: unique for the chosen scores, 0 for the others) are
//! never stored: each pass recomputes them from the scores (L2-resident). A pass takes 8
//! bits of the key, from the top: every key whose higher bits match the prefix found so
//! far adds to a 256-bin histogram in shared memory, one warp scans the bins from the top
//! to the bin holding the k-th key, and the prefix takes that bin. The passes stop when
//! the bin holds exactly as many keys as are still wanted (at the latest when the whole
//! 64-bit key is known). The keys whose masked bits are at least the prefix are then
//! exactly the k largest; they are gathered into shared memory and sorted descending
//! (`ds4_sort_keys`, log²(k)/2 passes). Rows with no more chosen scores than k take every
//! chosen key; places past them are -1.
//!
//! Any n fits; k up to [`MAX_K`] (its keys' sort in dynamic shared memory). Decode on the
//! H200 (synthetic q2, steady t/s, `DS4_TOP_K_RADIX=0` / on): ctx 2K 121.1 / 122.2, 8K
//! 111.9 / 114.2, 32K 87.8 / 110.0.
//!
//! A pass reads the whole row again: one block takes ~115 µs for 65,536 scores (ctx 256K);
//! rows that long would want the passes spread over blocks.

use crate::cuda_top_k;
use crate::Target;

/// The kernel's entry point.
pub const NAME: &str = "top_k_radix";
/// Threads a block: the scores strided over them in every pass.
pub const THREADS: u32 = 1024;
/// The most picks a row (the selected keys, sorted in shared memory: 32 KiB).
pub const MAX_K: usize = 4096;
/// Rows longer than this take the radix selection (`top_k_sort` up to it). On the H200,
/// k = 512, host-timed a launch (`cuda_kernels` prints both): 1,024 scores 19.0 µs sorted,
/// 19.3 selected; 2,048: 27.0 / 21.8; 8,192: 84.6 / 31.2; 16,384: 172.3 / 42.9; 65,536
/// (past the sort's rows): 116.7 selected.
pub const FROM_N: usize = 1024;

/// Whether picks of `k` fit.
pub fn fits(k: usize) -> bool {
    (1..=MAX_K).contains(&k)
}

/// Dynamic shared memory of a launch of rows of `n` scores, `k` picks: the sort of the
/// selected keys.
pub fn shared_bytes(n: usize, k: usize) -> u32 {
    (cuda_top_k::sort_len(n.min(k)) * 8) as u32
}

/// Dynamic shared memory the kernel may ask for.
pub const MAX_SHARED_BYTES: u32 = (MAX_K * 8) as u32;

/// The kernel's CUDA source for a CUDA target (`None` for the others).
pub fn source(target: Target) -> Option<String> {
    selection_source(target, NAME, SORTED)
}

/// `top_k_rows`: the same selection, its picks in row order (ascending indices, -1 after
/// them) instead of score order: no sort. For a selection whose only reader does not
/// depend on its order (an attention over the picked rows: the softmax adds the same
/// terms, in row order, as a causal attention does); the runtime takes it there
/// (`fusion_plan.rs`, `rows_top_k`). Any n; k up to [`MAX_K`]; no dynamic shared memory.
pub const ROWS_NAME: &str = "top_k_rows";

/// `top_k_rows`' CUDA source for a CUDA target (`None` for the others).
pub fn rows_source(target: Target) -> Option<String> {
    selection_source(target, ROWS_NAME, IN_ROW_ORDER)
}

/// A kernel `name` of the top k's contract: the radix selection, then `end` (what it
/// does with the picks).
fn selection_source(target: Target, name: &str, end: &str) -> Option<String> {
    crate::cuda::text_kernel(target, name, "codegen/src/cuda_top_k_radix.rs", &format!("{}{SCAN}", cuda_top_k::HELPERS), &THREADS.to_string(), &cuda_top_k::contract(), &format!("{SELECT}{end}"))
}

/// A warp's inclusive running sum of `v` (lane `lane` gets lanes 0..=lane's), both kernels'.
const SCAN: &str = r#"
__device__ __forceinline__ unsigned int ds4_warp_scan(unsigned int v, const unsigned int lane) {
    #pragma unroll
    for (unsigned int o = 1; o < 32u; o <<= 1) {
        const unsigned int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) {
            v += u;
        }
    }
    return v;
}
"#;

/// The selection: the prefix of the k-th largest key (both kernels).
const SELECT: &str = r#"    extern __shared__ unsigned long long ds4_keys[];
    __shared__ unsigned int ds4_hist[256];
    __shared__ unsigned int ds4_count, ds4_taken, ds4_bin, ds4_above;
    const usize item = blockIdx.x;
    const unsigned int nn = (unsigned int)n;
    const unsigned int kk = (unsigned int)k;
    const float* const row = scores + item * n;
    if (threadIdx.x == 0u) {
        ds4_count = 0u;
        ds4_taken = 0u;
    }
    __syncthreads();
    // The chosen scores (the others' key is 0).
    unsigned int mine = 0u;
    for (unsigned int i = threadIdx.x; i < nn; i += blockDim.x) {
        mine += ds4_top_k_key(row[i], i) != 0ull ? 1u : 0u;
    }
    if (mine != 0u) {
        atomicAdd(&ds4_count, mine);
    }
    __syncthreads();
    const unsigned int chosen = ds4_count;
    const unsigned int picked = chosen < kk ? chosen : kk;
    // The prefix (under `mask`) of the k-th largest key, 8 bits a pass; `need`: how many
    // keys under the prefix are still wanted.
    unsigned long long prefix = 0ull, mask = 0ull;
    unsigned int need = picked;
    for (int shift = 56; picked < chosen && shift >= 0; shift -= 8) {
        for (unsigned int b = threadIdx.x; b < 256u; b += blockDim.x) {
            ds4_hist[b] = 0u;
        }
        __syncthreads();
        // A lane per score, each group of lanes on one bin adding once (scores close
        // together share their top bits: one shared counter taking every lane's add in
        // turn would serialize the first passes).
        for (unsigned int base = 0u; base < nn; base += blockDim.x) {
            const unsigned int i = base + threadIdx.x;
            const unsigned long long key = i < nn ? ds4_top_k_key(row[i], i) : 0ull;
            const unsigned int bin = key != 0ull && (key & mask) == prefix ? (unsigned int)(key >> shift) & 255u : 256u;
            const unsigned int peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256u && (threadIdx.x & 31u) == (unsigned int)__ffs(peers) - 1u) {
                atomicAdd(&ds4_hist[bin], (unsigned int)__popc(peers));
            }
        }
        __syncthreads();
        // Warp 0 scans the bins from the top, eight a lane (lane l: bins 255 - 8l down).
        if (threadIdx.x < 32u) {
            const unsigned int lane = threadIdx.x;
            unsigned int h[8];
            unsigned int sum = 0u;
            #pragma unroll
            for (unsigned int j = 0; j < 8u; j++) {
                h[j] = ds4_hist[255u - 8u * lane - j];
                sum += h[j];
            }
            const unsigned int upto = ds4_warp_scan(sum, lane);
            unsigned int before = upto - sum;
            if (before < need && need <= upto) {
                #pragma unroll
                for (unsigned int j = 0; j < 8u; j++) {
                    if (before < need && need <= before + h[j]) {
                        ds4_bin = 255u - 8u * lane - j;
                        ds4_above = before;
                    }
                    before += h[j];
                }
            }
        }
        __syncthreads();
        const unsigned int bin = ds4_bin;
        need -= ds4_above;
        prefix |= (unsigned long long)bin << shift;
        mask |= 255ull << shift;
        const bool done = ds4_hist[bin] == need;
        // Every thread has read the bins before the next pass clears them.
        __syncthreads();
        if (done) {
            break;
        }
    }
"#;

/// `top_k_radix`' end: the picks gathered and sorted.
const SORTED: &str = r#"    // The k largest keys: masked, at least the prefix (every chosen key when none is left
    // out).
    // A warp's selected keys take consecutive places (one add a warp).
    for (unsigned int base = 0u; base < nn; base += blockDim.x) {
        const unsigned int i = base + threadIdx.x;
        const unsigned long long key = i < nn ? ds4_top_k_key(row[i], i) : 0ull;
        const bool take = key != 0ull && (key & mask) >= prefix;
        const unsigned int lane = threadIdx.x & 31u;
        const unsigned int takers = __ballot_sync(0xffffffffu, take);
        unsigned int first = 0u;
        if (lane == 0u && takers != 0u) {
            first = atomicAdd(&ds4_taken, (unsigned int)__popc(takers));
        }
        first = __shfl_sync(0xffffffffu, first, 0);
        if (take) {
            ds4_keys[first + (unsigned int)__popc(takers & ((1u << lane) - 1u))] = key;
        }
    }
    __syncthreads();
    ds4_sort_and_pick(ds4_keys, picked, out + item * k, k, picked);
"#;

/// `top_k_rows`' end: the picks' rows in row order, a block-wide running count (a warp's
/// takers by ballot, the warps' counts scanned by warp 0), -1 past them.
const IN_ROW_ORDER: &str = r#"    __shared__ unsigned int ds4_warp_at[32];
    int* const dst = out + item * k;
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    unsigned int placed = 0u;
    for (unsigned int base = 0u; base < nn; base += blockDim.x) {
        const unsigned int i = base + threadIdx.x;
        const unsigned long long key = i < nn ? ds4_top_k_key(row[i], i) : 0ull;
        const bool take = key != 0ull && (key & mask) >= prefix;
        const unsigned int takers = __ballot_sync(0xffffffffu, take);
        if (lane == 0u) {
            ds4_warp_at[warp] = (unsigned int)__popc(takers);
        }
        __syncthreads();
        if (threadIdx.x < 32u) {
            const unsigned int c = threadIdx.x < blockDim.x / 32u ? ds4_warp_at[threadIdx.x] : 0u;
            const unsigned int upto = ds4_warp_scan(c, lane);
            ds4_warp_at[threadIdx.x] = upto - c;
            if (threadIdx.x == 31u) {
                ds4_taken = upto;
            }
        }
        __syncthreads();
        if (take) {
            dst[placed + ds4_warp_at[warp] + (unsigned int)__popc(takers & ((1u << lane) - 1u))] = (int)i;
        }
        placed += ds4_taken;
        // Every thread has its places before the next chunk's counts.
        __syncthreads();
    }
    for (unsigned int p = picked + threadIdx.x; p < kk; p += blockDim.x) {
        dst[p] = -1;
    }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_only_the_picks() {
        assert_eq!(shared_bytes(100_000, 512), 512 * 8);
        assert_eq!(shared_bytes(300, 512), 512 * 8);
        assert_eq!(shared_bytes(3, 512), 4 * 8);
        assert_eq!(shared_bytes(1 << 20, MAX_K), MAX_SHARED_BYTES);
        assert!(fits(1) && fits(MAX_K) && !fits(0) && !fits(MAX_K + 1));
    }
}
