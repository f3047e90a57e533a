//! `indexer_scores_vec`: a decode token's indexer scores in one launch, CUDA text: every
//! head's dot with every visible compressed row, relu'd, weighted and summed over the
//! heads (`ir/src/kernels/compress.rs`: `indexer_head_dots`, then `indexer_combine`).
//!
//! For prefill the runtime takes the dots as one tensor-core matmul (the rows as an F32
//! "weight") and combines them in a second launch. For a decode token that matmul has 64
//! query rows (the heads) against ctx / 4 compressed rows, and its time grows with the
//! context (H200, `DS4_PROFILE=label`: ~30 µs a call at ctx 32K-64K, 21 calls a step).
//! Decode steady on the H200 (synthetic q2, `DS4_INDEXER_VEC=0` / on, two pairs): ctx 2K
//! 116.3 / 121.8 → 123.0 / 122.3 t/s, 32K 112.0 / 112.4 → 113.3 / 113.4.
//! Here block b takes tiles of [`tile_rows`] rows (tile b, b + grid, ...): the token's
//! queries sit in shared memory head by head (rows of dk + 4 floats, so that a warp's
//! lanes, consecutive heads, read a float4 each from different banks), a tile's rows beside
//! them; thread (head h, group g) makes the dots of head h with the tile's rows from R·g
//! to R·g + R (R = tile rows / 4), four dimensions a step (each row's float4 is one broadcast
//! load, each query float4 feeds 4·R products), and writes each relu'd, weighted term to
//! shared memory; then thread r adds row r's terms over the heads in the reference's order,
//! with the reference's products (relu(dot) · scale · (w · wscale)). The dots add their
//! products left to right, unfused (the reference's order and operations), and the terms
//! are the reference's, so the scores are the CPU's f32 floats bit for bit
//! (`cuda_kernels`); rows past the token's visible ones get -inf, as in `indexer_combine`.
//! The tiles are as small as fill the SMs: at ctx 2048 (~512 rows) 32-row tiles were 16
//! blocks on 132 SMs, each ~10 µs of products a thread after copying the queries; 4-row
//! tiles are ~128 blocks.

use crate::quant::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "indexer_scores_vec";
/// The most rows a tile (four thread groups of a head, up to eight rows each).
pub const TILE_ROWS: usize = 32;
/// The fewest rows a tile (a row a thread).
const MIN_TILE_ROWS: usize = 4;
/// Float4 loads a thread has in flight while it copies the queries and a tile's rows.
const Q_LOADS: usize = 8;
/// The most heads (four threads a head).
pub const MAX_HEADS: usize = 256;
/// The most threads a launch has.
pub const MAX_THREADS: u32 = 4 * MAX_HEADS as u32;
/// The longest query head (its copy in shared memory, a padded row a head).
pub const MAX_DK: usize = 256;
/// The most tokens a launch takes (grid y).
pub const MAX_TOKENS: usize = 4;
/// The most rows a launch takes ([`fits`]): its unfused products make it
/// bound by the SMs' FP32 issue at ~2·n_rows·heads·dk instructions (H200, host-timed a
/// launch, 64 heads of 128: 2,048 rows 22.9 µs, 8,192 27.7, 16,384 38.0, 65,536 95.2),
/// where the tensor-core matmul's share grows more slowly; past ctx 64K the matmul
/// path stays (not measured against it there).
pub const MAX_ROWS: usize = 16384;

/// Parameters in launch order.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "q", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "w", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "rows", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n_rows" },
        QParam::Scalar { name: "heads" },
        QParam::Scalar { name: "dk" },
        QParam::Scalar { name: "pos0" },
        QParam::Scalar { name: "ratio" },
        QParam::Scalar { name: "tile_rows" },
    ]
}

/// Whether `tokens` tokens of `heads` heads of `dk` dimensions against `n_rows` rows fit
/// (the rows' float4 loads want dk a multiple of 4 and 16-byte aligned rows, which the
/// runtime checks).
pub fn fits(tokens: usize, heads: usize, dk: usize, n_rows: usize) -> bool {
    (1..=MAX_TOKENS).contains(&tokens) && (1..=MAX_HEADS).contains(&heads) && dk > 0 && dk <= MAX_DK && dk.is_multiple_of(4) && shared_bytes(heads, dk) <= MAX_SHARED_BYTES && (1..=MAX_ROWS).contains(&n_rows)
}

/// Threads of a launch: four a head, in whole warps (a warp at least: the threads past
/// four a head only copy and sum).
pub fn threads(heads: usize) -> u32 {
    (4 * heads).next_multiple_of(32) as u32
}

/// Dynamic shared memory of a launch: the queries (rows of dk + 4), a tile's rows, its
/// terms (a row of heads + 1, so that the sums' threads take different banks).
pub fn shared_bytes(heads: usize, dk: usize) -> u32 {
    (4 * (heads * (dk + 4) + TILE_ROWS * dk + TILE_ROWS * (heads + 1))) as u32
}

/// The most dynamic shared memory a launch may ask for (what an sm_120 block can have).
pub const MAX_SHARED_BYTES: u32 = 96 * 1024;

/// Rows a tile (the launch's `tile_rows`) for `n_rows` rows on `sms` SMs: the fewest of 4,
/// 8, 16 and 32 whose tiles are no more than two blocks an SM.
pub fn tile_rows(n_rows: usize, sms: usize) -> usize {
    let mut t = MIN_TILE_ROWS;
    while t < TILE_ROWS && n_rows.div_ceil(t) > 2 * sms.max(1) {
        t *= 2;
    }
    t
}

/// Blocks of a launch over `n_rows` rows in tiles of `tile_rows` on `sms` SMs: a tile
/// each, at most two an SM (each copies the queries into shared memory first).
pub fn blocks(n_rows: usize, tile_rows: usize, sms: usize) -> u32 {
    n_rows.div_ceil(tile_rows).clamp(1, 2 * sms.max(1)) as u32
}

/// The CUDA source. Launch: grid ([`blocks`], tokens), [`threads`], [`shared_bytes`].
pub fn source() -> String {
    format!(
        r#"// {NAME}: a decode token's indexer scores in one launch (codegen/src/cuda_indexer_scores.rs).

// v[u] = src[i0 + u · blockDim.x] for the indices below n: {Q_LOADS} loads in flight together.
__device__ __forceinline__ void ds4_load_f4s(float4* const v, const float4* const src, const unsigned int i0, const unsigned int n) {{
    #pragma unroll
    for (unsigned int u = 0; u < {Q_LOADS}u; u++) {{
        const unsigned int i = i0 + u * blockDim.x;
        if (i < n) v[u] = src[i];
    }}
}}

// Head h's dots with the live rows of R·g .. R·g + R of the tile, left to right, unfused,
// and their relu'd, weighted terms into row r's terms (heads + 1 a row).
template <unsigned int R>
__device__ __forceinline__ void ds4_head_terms(float* const terms, const float* const qh, const float* const tile, const unsigned int h, const unsigned int g, const unsigned int h_n, const unsigned int d_n, const unsigned int live, const float scale, const float wh) {{
    float dot[R];
    #pragma unroll
    for (unsigned int j = 0; j < R; j++) dot[j] = 0.0f;
    if (R * g < live) {{
        for (unsigned int c = 0; c < d_n; c += 4u) {{
            const float4 q = *(const float4*)(qh + c);
            #pragma unroll
            for (unsigned int j = 0; j < R; j++) {{
                const float4 k = *(const float4*)(tile + (R * g + j) * d_n + c);
                dot[j] += q.x * k.x;
                dot[j] += q.y * k.y;
                dot[j] += q.z * k.z;
                dot[j] += q.w * k.w;
            }}
        }}
    }}
    #pragma unroll
    for (unsigned int j = 0; j < R; j++) terms[(R * g + j) * (h_n + 1u) + h] = fmaxf(dot[j], 0.0f) * scale * wh;
}}

{entry}    extern __shared__ float ds4_smem[];
    const unsigned int h_n = (unsigned int)heads;
    const unsigned int d_n = (unsigned int)dk;
    const unsigned int t = blockIdx.y;
    const unsigned int tr = (unsigned int)tile_rows;
    const unsigned int qs = d_n + 4u;                    // a query row's floats in shared memory
    float* const qsh = ds4_smem;                         // [heads][dk + 4]
    float* const tile = qsh + h_n * qs;                  // [{TILE_ROWS}][dk]
    float* const terms = tile + {TILE_ROWS}u * d_n;      // [{TILE_ROWS}][heads + 1]
    // The token's queries: eight float4 loads a thread in flight before their stores.
    const float4* const q4 = (const float4*)(ds4_q + (unsigned long long)t * h_n * d_n);
    const unsigned int n4 = h_n * d_n / 4u, row4 = d_n / 4u;
    for (unsigned int i0 = threadIdx.x; i0 < n4; i0 += {Q_LOADS}u * blockDim.x) {{
        float4 v[{Q_LOADS}];
        ds4_load_f4s(v, q4, i0, n4);
        #pragma unroll
        for (unsigned int u = 0; u < {Q_LOADS}u; u++) {{
            const unsigned int i = i0 + u * blockDim.x;
            if (i < n4) *(float4*)(qsh + (i / row4) * qs + 4u * (i % row4)) = v[u];
        }}
    }}
    const unsigned int h = threadIdx.x % h_n;
    const unsigned int g = threadIdx.x / h_n;
    const float scale = 1.0f / sqrtf((float)d_n);
    const float wscale = 1.0f / sqrtf((float)h_n);
    const float wh = ds4_w[(unsigned long long)t * h_n + h] * wscale;
    const unsigned long long visible = (pos0 + t + 1ull) / ratio;
    const unsigned long long seen = visible < n_rows ? visible : n_rows;
    float* const out = ds4_out + (unsigned long long)t * n_rows;
    for (unsigned long long r0 = (unsigned long long)blockIdx.x * tr; r0 < n_rows; r0 += (unsigned long long)gridDim.x * tr) {{
        // Every thread is done with the last tile's terms (and the queries are in).
        __syncthreads();
        const unsigned int live = r0 < seen ? (unsigned int)(seen - r0 < tr ? seen - r0 : tr) : 0u;
        const float4* const src = (const float4*)(ds4_rows + r0 * d_n);
        const unsigned int t4 = live * d_n / 4u;
        for (unsigned int i0 = threadIdx.x; i0 < t4; i0 += {Q_LOADS}u * blockDim.x) {{
            float4 v[{Q_LOADS}];
            ds4_load_f4s(v, src, i0, t4);
            #pragma unroll
            for (unsigned int u = 0; u < {Q_LOADS}u; u++) {{
                const unsigned int i = i0 + u * blockDim.x;
                if (i < t4) ((float4*)tile)[i] = v[u];
            }}
        }}
        __syncthreads();
        if (g < 4u) {{
            const float* const qh = qsh + h * qs;
            switch (tr) {{
                case 4u: ds4_head_terms<1u>(terms, qh, tile, h, g, h_n, d_n, live, scale, wh); break;
                case 8u: ds4_head_terms<2u>(terms, qh, tile, h, g, h_n, d_n, live, scale, wh); break;
                case 16u: ds4_head_terms<4u>(terms, qh, tile, h, g, h_n, d_n, live, scale, wh); break;
                default: ds4_head_terms<{max_r}u>(terms, qh, tile, h, g, h_n, d_n, live, scale, wh); break;
            }}
        }}
        __syncthreads();
        // Row r's terms over the heads in order; -inf past the visible rows.
        for (unsigned int r = threadIdx.x; r < tr && r0 + r < n_rows; r += blockDim.x) {{
            float s = __int_as_float(0xff800000);
            if (r < live) {{
                s = 0.0f;
                for (unsigned int k = 0; k < h_n; k++) s += terms[r * (h_n + 1u) + k];
            }}
            out[r0 + r] = s;
        }}
    }}
}}
"#,
        entry = crate::cuda::own_entry(NAME, &MAX_THREADS.to_string(), &params()),
        max_r = TILE_ROWS / 4
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_decode_tokens_of_the_indexers_heads() {
        assert!(fits(1, 64, 128, 1) && fits(MAX_TOKENS, 64, 192, MAX_ROWS) && fits(1, 128, 64, 300));
        assert!(!fits(0, 64, 128, 1) && !fits(MAX_TOKENS + 1, 64, 128, 1) && !fits(1, MAX_HEADS + 1, 128, 1) && !fits(1, 64, 130, 1) && !fits(1, 64, MAX_DK + 4, 1));
        assert!(!fits(1, 64, 128, 0) && !fits(1, 64, 128, MAX_ROWS + 1));
        assert!(!fits(1, MAX_HEADS, MAX_DK, 1), "the queries would not fit shared memory");
        assert!(shared_bytes(64, 128) <= 64 * 1024);
        assert_eq!(threads(64), 256);
        assert_eq!(threads(7), 32);
        assert_eq!(threads(9), 64);
        assert_eq!((tile_rows(1, 132), blocks(1, 4, 132)), (4, 1));
        assert_eq!((tile_rows(513, 132), blocks(513, 4, 132)), (4, 129), "ctx ~2048: a block an SM");
        assert_eq!((tile_rows(2048, 132), blocks(2048, 8, 132)), (8, 256));
        assert_eq!((tile_rows(16384, 132), blocks(16384, 32, 132)), (32, 264));
    }
}
