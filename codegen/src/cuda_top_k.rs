//! `top_k_sort`: `top_k` for CUDA, written as CUDA text: a block sorts its row in shared
//! memory, with the same parameters and the same picks as the generated `top_k`.
//!
//! The generated kernel ranks by counting (`ir/src/kernels/compress.rs`): every candidate
//! scans the row until k candidates are ahead of it, so the picks scan the whole row, one
//! score after another, and the work grows with n·k. On the H200 (a standalone timing of
//! one launch) that is 19 µs for the router's 6 of 256 experts and 183 µs for the
//! indexer's 512 of 2048 compressed rows (decode at ctx 8192), 40 and 21 calls a decode
//! step. Here each candidate is one 64-bit key (its score made orderable as an unsigned
//! integer, then its index reversed, so that a higher key means a higher score, then a
//! lower index: the reference's order, ties included), the block sorts the row's keys
//! descending with a bitonic network in shared memory (log²(n)/2 passes, a compare and
//! exchange per pair each, a barrier between passes), and the first k keys name the picks.
//!
//! Scores that are never chosen (-inf and NaN, as in the reference: `s > -inf` fails) get
//! the key 0, below every other; the places past the number of chosen scores are -1.
//! -0 is keyed as +0 (they are equal scores, so their tie goes to the lower index).
//!
//! The row's keys take 8 bytes each, rounded up to a power of two ([`sort_len`]): rows of
//! up to [`MAX_N`] scores fit ([`fits`]). The runtime takes it for rows of up to
//! `cuda_top_k_radix::FROM_N` scores (the router's); longer rows (the indexer's) take
//! `top_k_radix`, whose time grows with n rather than n·log²(n).

use crate::Target;
use ds4_ir::kir::Kernel;

/// The kernel's entry point.
pub const NAME: &str = "top_k_sort";
/// Most threads a block: each takes `sort_len / 2 / threads` pairs a pass.
pub const MAX_THREADS: u32 = 1024;
/// Longest row sorted (its keys: 128 KiB of dynamic shared memory).
pub const MAX_N: usize = 16384;
/// Dynamic shared memory the kernel may ask for (the keys of a row of `MAX_N`).
pub const MAX_SHARED_BYTES: u32 = (MAX_N * 8) as u32;

/// Whether a row of `n` scores fits the sort.
pub fn fits(n: usize) -> bool {
    n <= MAX_N
}

/// Keys the kernel sorts for a row of `n` scores: the next power of two (at least 1).
pub fn sort_len(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Dynamic shared memory of a launch for rows of `n` scores.
pub fn shared_bytes(n: usize) -> u32 {
    (sort_len(n) * 8) as u32
}

/// Threads of a launch for rows of `n` scores: a pair of keys each (a warp at least).
pub fn threads(n: usize) -> u32 {
    ((sort_len(n) / 2) as u32).clamp(32, MAX_THREADS)
}

/// The IR kernel whose parameters and picks `top_k_sort` shares.
pub fn contract() -> Kernel {
    ds4_ir::kernels::compress::top_k_kir()
}

/// The kernel's CUDA source for a CUDA target (`None` for the others).
pub fn source(target: Target) -> Option<String> {
    crate::cuda::text_kernel(target, NAME, "codegen/src/cuda_top_k.rs", HELPERS, &MAX_THREADS.to_string(), &contract(), BODY)
}

/// The sort key and the block-wide sort, shared with `cuda_router.rs`.
pub(crate) const HELPERS: &str = r#"
// Candidate j's sort key: its score's bits made orderable (a higher score, a higher
// key), then j reversed (equal scores: the lower index higher). 0 for a score that is
// never chosen (-inf, NaN); every other key is above 2^55.
__device__ __forceinline__ unsigned long long ds4_top_k_key(const float s, const unsigned int j) {
    if (!(s > __int_as_float(0xff800000))) {
        return 0ull;
    }
    const unsigned int b = __float_as_uint(s + 0.0f);
    const unsigned int o = (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
    return ((unsigned long long)o << 32) | (unsigned long long)(0xffffffffu - j);
}

// The candidate a key names.
__device__ __forceinline__ int ds4_top_k_index(const unsigned long long key) {
    return (int)(0xffffffffu - (unsigned int)key);
}

// The largest of the warp's lanes' keys `best`, in every lane: the largest high word
// (one `redux.sync`), then the largest low word of the lanes holding it (a second), where
// a shuffle tree took five rounds of two 32-bit shuffles each.
__device__ __forceinline__ unsigned long long ds4_warp_max_key(const unsigned long long best) {
    const unsigned int hi = __reduce_max_sync(0xffffffffu, (unsigned int)(best >> 32));
    const unsigned int lo = __reduce_max_sync(0xffffffffu, (unsigned int)(best >> 32) == hi ? (unsigned int)best : 0u);
    return ((unsigned long long)hi << 32) | (unsigned long long)lo;
}

// Sorts `len` keys (a power of two) descending, by the whole block: a bitonic network,
// merges of `span` keys each a pass per `stride`, the pair (lo, lo + stride) ordered
// descending where lo's bit `span` is clear; a barrier after every pass.
__device__ __forceinline__ void ds4_sort_keys(unsigned long long* const keys, const unsigned int len) {
    for (unsigned int span = 2u; span <= len; span <<= 1) {
        for (unsigned int stride = span >> 1; stride > 0u; stride >>= 1) {
            for (unsigned int t = threadIdx.x; t < len / 2u; t += blockDim.x) {
                const unsigned int lo = 2u * t - (t & (stride - 1u));
                const unsigned long long a = keys[lo];
                const unsigned long long b = keys[lo + stride];
                if ((a < b) == ((lo & span) == 0u)) {
                    keys[lo] = b;
                    keys[lo + stride] = a;
                }
            }
            __syncthreads();
        }
    }
}

// The least power of two at or above n (1 for 0): the length a row's keys sort in.
__device__ __forceinline__ unsigned int ds4_sort_len(const unsigned int n) {
    unsigned int len = 1u;
    while (len < n) {
        len <<= 1;
    }
    return len;
}

// Pads the `count` keys written to `ds4_sort_len(count)` with 0 (never chosen), sorts them
// descending and writes the candidates of the first `picked` to out[0 .. k], -1 past
// them: the picks of a row, by the whole block.
__device__ __forceinline__ void ds4_sort_and_pick(unsigned long long* const keys, const unsigned int count, int* const out, const unsigned long long k, const unsigned int picked) {
    const unsigned int len = ds4_sort_len(count);
    for (unsigned int i = count + threadIdx.x; i < len; i += blockDim.x) {
        keys[i] = 0ull;
    }
    __syncthreads();
    ds4_sort_keys(keys, len);
    for (unsigned long long p = threadIdx.x; p < k; p += blockDim.x) {
        out[p] = p < picked ? ds4_top_k_index(keys[p]) : -1;
    }
}
"#;

const BODY: &str = r#"    extern __shared__ unsigned long long ds4_keys[];
    __shared__ unsigned int ds4_chosen;
    const usize item = blockIdx.x;
    const unsigned int nn = (unsigned int)n;
    if (threadIdx.x == 0u) {
        ds4_chosen = 0u;
    }
    __syncthreads();
    unsigned int mine = 0u;
    for (unsigned int i = threadIdx.x; i < nn; i += blockDim.x) {
        const unsigned long long key = ds4_top_k_key(scores[item * n + i], i);
        mine += key != 0ull ? 1u : 0u;
        ds4_keys[i] = key;
    }
    if (mine != 0u) {
        atomicAdd(&ds4_chosen, mine);
    }
    __syncthreads();
    ds4_sort_and_pick(ds4_keys, nn, out + item * k, k, ds4_chosen);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_fit_the_sort() {
        assert_eq!(sort_len(0), 1);
        assert_eq!(sort_len(256), 256);
        assert_eq!(sort_len(257), 512);
        assert_eq!(threads(1), 32);
        assert_eq!(threads(256), 128);
        assert_eq!(threads(MAX_N), MAX_THREADS);
        assert_eq!(shared_bytes(MAX_N), MAX_SHARED_BYTES);
        assert!(fits(MAX_N) && !fits(MAX_N + 1));
    }
}
