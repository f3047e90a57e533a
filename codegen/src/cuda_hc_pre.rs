//! `hc_pre`: a decode token's hyper-connection "pre" chain in one launch, CUDA text.
//!
//! Before each attention and each FFN, the graph (`model/src/builder.rs`, `hc_mix`) runs
//! four ops on one token: a plain RMS norm of the flattened streams (nh·d values), their
//! projection to 2·nh + nh² mixing weights (an F16 mat-vec), the mix (`hc_mix`, Sinkhorn)
//! and the collapse (`hc_collapse`, the pre-weighted sum of the streams), then the
//! sublayer's weighted RMS norm of the collapse. At decode each is a kernel of a few µs
//! that mostly waits (H200, Nsight Compute: norm 7.0 µs in one block, projection 10.7 µs
//! in 24 blocks, mix 8.7, collapse 3.3, weighted norm 3.9-5.0), 86 times a step.
//!
//! Here block r of token t (1024 threads) reads the token's streams once, four floats a
//! load, for both the norm's Σ x² and projection row r's Σ w·x, scaled once by 1 / rms
//! (the normed streams' projection). Then the mix's three parts go separate ways, each
//! on its own SM, so that the collapse never waits for the Sinkhorn:
//! - blocks r < 2·nh write their own pre or post weight (`cuda_hc_mix`'s formulas, the
//!   same floats as `hc_mix` given the projection); the last pre block to finish (a
//!   ticket from `counters`, which it resets) makes the collapse (`hc_collapse`'s order)
//!   and, where the graph norms the collapse (`has_norm`), that norm (`rms_norm`'s
//!   arithmetic, its sum in another order), with all its threads;
//! - blocks r ≥ 2·nh store their projection; the last of them (a second ticket) runs the
//!   Sinkhorn in one warp (`cuda_hc_mix`'s lanes), which only `hc_expand` reads, after
//!   the sublayer.
//!
//! H200, standalone (back-to-back launches, ~3.5 µs each when empty): 13.3 µs with the
//! Sinkhorn beside the collapse in one block (its idle lanes on -inf, the division's slow
//! path), 10.0 with finite idle lanes, 8.3 split as above. (The Sinkhorn as a launch beside
//! the sublayer's, a side branch of the step's graph, measured no faster: RESULTS.md,
//! ninth stop.) The projections differ from the four kernels' in the last bits (other
//! orders of the sums, one scaling); `cuda_kernels` holds them to 2e-5. The runtime uses
//! it for the decode's few tokens (`MAX_TOKENS`), F16 projections and
//! nh ≤ `cuda_hc_mix::MAX_NH`; prefills keep the four kernels (their projection is a
//! tensor-core matmul).
//!
//! A launch may take its streams with an addend pending (`pending`). The FFN's y is the
//! routed experts' plus the shared expert's, which run on two lanes of a decode step's
//! graph, and the expand after the FFN (in the routed down's launch) needed both. The
//! shared expert's down waits for the routed gate and up's blocks to leave the SMs (three
//! an SM), so the routed down waited for it (~3.5 µs a layer, H200, a CUPTI trace). With the
//! addend pending, the routed down expands its own y, and the lanes meet at the next
//! `hc_pre`, which reads every stream value anyway and adds the shared expert's share there.

use crate::cuda_hc_mix;
use crate::quant::{BufElem, QParam};

/// Kernel name.
pub const NAME: &str = "hc_pre";
/// Threads per block.
pub const THREADS: u32 = 1024;
/// The most tokens a launch takes.
pub const MAX_TOKENS: usize = 8;
/// Ticket counters the launch needs (zeros, left zero): two a token.
pub const COUNTERS: usize = 2 * MAX_TOKENS;
/// Float4 loads of the streams a thread makes before the rest of its sums (in registers).
const PREFETCH: usize = 4;

/// Whether a launch holds every stream value in the registers of its first loads
/// (`held`: a float4 of each stream a thread), as the kernel decides: then the collapse
/// and its norm come from those registers, and the collapse is not written where the
/// launch norms it (`params`).
pub fn held(nh: usize, d: usize) -> bool {
    d == 4 * THREADS as usize && nh <= PREFETCH
}

/// Parameters in launch order; `a` and `norm_w` are read and written only when
/// `has_norm` is 1; with `comb` 0 the combination blocks store their projections and
/// leave the Sinkhorn to an [`HC_COMB`] launch. With `pending` 1 the streams `x` still lack
/// an addend of the expand that made them: stream i's channel c is
/// `fmaf(post_i, sy[c], x_i[c])`, post_i the entry nh + i of mix `smix` (the FFN's expand
/// before this launch made `x` from the routed experts' y alone, and the shared expert's
/// y, `sy`, is added here: see the module's notes); every block reads the streams so, and
/// the mix's blocks write them whole to `xo`, a share each. The collapse `y` is written
/// unless the launch norms it (`has_norm`) from registers (`held`: DeepSeek-V4-Flash's
/// streams of 4 × 4096): the norm is then its only reader, and its stores were on the
/// grid's last block's path to its end.
pub fn params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "mix", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "y", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "a", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "proj", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "counters", elem: BufElem::I32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "w", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "scale", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "base", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "norm_w", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "nh" },
        QParam::Scalar { name: "d" },
        QParam::Scalar { name: "iters" },
        QParam::Float { name: "eps_norm" },
        QParam::Float { name: "eps_mix" },
        QParam::Scalar { name: "has_norm" },
        QParam::Float { name: "eps_a" },
        QParam::Scalar { name: "comb" },
        QParam::Buffer { name: "rw", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "rparts", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "ainv", elem: BufElem::F32, mutable: true },
        QParam::Scalar { name: "r_rows" },
        QParam::Buffer { name: "sy", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "smix", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "xo", elem: BufElem::F32, mutable: true },
        QParam::Scalar { name: "pending" },
    ]
}

/// Router rows a block of the launch's router part takes ([`router_blocks`]).
pub const ROUTER_ROWS: usize = 4;

/// Blocks of the router part for a router of `rows` experts (0: none): they follow the
/// mix's 2·nh + nh² blocks in the grid's x.
pub fn router_blocks(rows: usize) -> usize {
    rows.div_ceil(ROUTER_ROWS)
}

/// `hc_pre`'s Sinkhorn as a launch of its own: the combination entries of the mix from
/// the projections an `hc_pre` launch with `comb` 0 stored. Why: `hc_pre`'s grid ends with
/// the Sinkhorn (20 passes in one warp, 2.8 µs after its blocks' ticket; the collapse
/// block ends 1.5 µs before it, H200, a globaltimer read in the blocks), and the launch
/// after it (the router's mat-vec, `q_a`) waits for the whole grid, while only
/// `hc_expand`, after the sublayer, reads the entries. The runtime launches it on a side
/// lane that has time to spare (the shared expert's, `runtime/src/cuda/exec/hyper.rs`).
pub const HC_COMB: &str = "hc_comb";

/// [`HC_COMB`]'s parameters: the mix (its entries 2·nh.. written), the projections, the
/// mix's scale and base, nh, the Sinkhorn's passes and eps.
pub fn comb_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "mix", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "proj", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "scale", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "base", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "nh" },
        QParam::Scalar { name: "iters" },
        QParam::Float { name: "eps_mix" },
    ]
}

/// [`HC_COMB`]'s source: warp 0 of block t, token t's entries (`comb_helpers`). Launch:
/// grid (tokens), 32 threads.
pub fn comb_source() -> String {
    let mut s = format!("// {HC_COMB}: hc_pre's Sinkhorn as a launch of its own (codegen/src/cuda_hc_pre.rs).\n");
    s.push_str(&comb_helpers());
    s.push_str(&format!(
        "{entry}    ds4_hc_comb_item(ds4_mix, ds4_proj, ds4_scale, ds4_base, nh, iters, eps_mix, blockIdx.x);\n}}\n",
        entry = crate::cuda::own_entry(HC_COMB, "32", &comb_params()),
    ));
    s
}

/// The Sinkhorn of one token by warp 0 of a block (`ds4_hc_comb_item`): the combination
/// entries of its mix from the projections the `hc_pre` blocks stored (read from L2: in
/// `hc_pre`'s own grid other blocks wrote them). The last combination block of an
/// `hc_pre` launch with `comb` 1 runs it; [`HC_COMB`] is a launch of it; a launch of
/// `matvec_dense_q8_0_r` may take it in a block of its own (`ride_params`).
pub fn comb_helpers() -> String {
    format!(
        r#"
#define DS4_MAX_NH {max_nh}u
{mix_helpers}
// Token `item`'s Sinkhorn (mix entries 2·nh ..) from its projections, by warp 0 (the
// block's other threads do nothing).
__device__ __forceinline__ void ds4_hc_comb_item(float* const mix, const float* __restrict__ proj, const float* __restrict__ scale, const float* __restrict__ base, const unsigned long long nh, const unsigned long long iters, const float eps_mix, const unsigned long long item) {{
    __shared__ float m[2 * DS4_MAX_NH + DS4_MAX_NH * DS4_MAX_NH];
    if (threadIdx.x >= 32u) return;
    const unsigned int h = (unsigned int)nh;
    const unsigned int mw = 2 * h + h * h;
    if (threadIdx.x < h * h) m[2 * h + threadIdx.x] = __ldcg(proj + item * mw + 2 * h + threadIdx.x);
    __syncwarp();
    ds4_hc_comb_lane(mix + item * mw, m, scale, base, h, iters, eps_mix, threadIdx.x);
}}
"#,
        max_nh = cuda_hc_mix::MAX_NH,
        mix_helpers = cuda_hc_mix::HELPERS,
    )
}

/// The parameters of a launch that takes a Sinkhorn in a block of its own (the first of
/// its grid's x, one a token): [`comb_params`]' with a `c` in front (`cnh` 0: none).
pub fn ride_params() -> Vec<QParam> {
    const NAMES: [&str; 7] = ["cmix", "cproj", "cscale", "cbase", "cnh", "citers", "ceps_mix"];
    comb_params()
        .into_iter()
        .zip(NAMES)
        .map(|(p, name)| match p {
            QParam::Buffer { elem, mutable, .. } => QParam::Buffer { name, elem, mutable },
            QParam::Scalar { .. } => QParam::Scalar { name },
            QParam::Float { .. } => QParam::Float { name },
        })
        .collect()
}

/// The kernel text that runs the Sinkhorn in block 0 of a riding launch's grid x and
/// returns (`row_block`: the launch's own block index, `blockIdx.x` less that block).
pub const RIDE_CALL: &str = "if (cnh != 0ull && blockIdx.x == 0u) {\n        ds4_hc_comb_item(ds4_cmix, ds4_cproj, ds4_cscale, ds4_cbase, cnh, citers, ceps_mix, blockIdx.y);\n        return;\n    }\n    const unsigned int row_block = blockIdx.x - (cnh != 0ull ? 1u : 0u);";

/// Whether a chain of `nh` streams of `d` values and `tokens` tokens can take the fused
/// kernel (it reads the streams four floats at a time: `d` a multiple of 4, and the
/// streams 16-byte aligned, which the runtime checks).
pub fn fits(nh: usize, d: usize, tokens: usize) -> bool {
    cuda_hc_mix::fits(nh) && d.is_multiple_of(4) && (1..=MAX_TOKENS).contains(&tokens)
}

/// The CUDA source. Launch: grid (2·nh + nh² + [`router_blocks`]`(r_rows)`, tokens),
/// `THREADS` threads.
pub fn source() -> String {
    let mut s = format!("// {NAME}: a token's plain RMS norm, projection, mix and collapse in one launch (codegen/src/cuda_hc_pre.rs).\n\n");
    s.push_str(&comb_helpers());
    s.push_str(crate::cuda::BLOCK_SUM);
    s.push_str(crate::cuda::BLOCK_SUM2);
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    s.push_str(&crate::cuda::text_helpers("rms_norm"));
    s.push_str(&format!(
        r#"
// Four halves (8 bytes) as floats.
__device__ __forceinline__ float4 ds4_half4(const uint2 h) {{
    return make_float4(ds4_f16_to_f32_dot(h.x & 0xffffu), ds4_f16_to_f32_dot(h.x >> 16), ds4_f16_to_f32_dot(h.y & 0xffffu), ds4_f16_to_f32_dot(h.y >> 16));
}}

// Stream values v with the pending addend p · a (`pending`: a stream's post weight p, the
// shared expert's y a) added.
__device__ __forceinline__ float4 ds4_with_share(float4 v, const float p, const float4 a) {{
    v.x = fmaf(p, a.x, v.x); v.y = fmaf(p, a.y, v.y); v.z = fmaf(p, a.z, v.z); v.w = fmaf(p, a.w, v.w);
    return v;
}}

// Float4 i of a token's streams (d4 float4s a stream), with the pending addend post_s · sy
// added where `pend` (`pending`).
__device__ __forceinline__ float4 ds4_stream4(const float4* const x, const unsigned int i, const unsigned int d4, const float* const spost, const float4* const sy, const bool pend) {{
    if (!pend) return x[i];
    const unsigned int s = i / d4;
    return ds4_with_share(x[i], spost[s], sy[i - s * d4]);
}}

// Four streams' values v and the projection row's halves h added to Σ x² and Σ w·x.
__device__ __forceinline__ void ds4_add_terms(const float4 v, const uint2 h, float& ss, float& dot) {{
    const float4 w = ds4_half4(h);
    ss += v.x * v.x; ss += v.y * v.y; ss += v.z * v.z; ss += v.w * v.w;
    dot = fmaf(w.x, v.x, dot); dot = fmaf(w.y, v.y, dot);
    dot = fmaf(w.z, v.z, dot); dot = fmaf(w.w, v.w, dot);
}}

{entry}    const unsigned int item = blockIdx.y;
    const unsigned int row = blockIdx.x;
    const unsigned int h = (unsigned int)nh;
    const unsigned int mw = 2 * h + h * h;
    const unsigned int n4 = h * (unsigned int)d / 4;
    const float4* const x = (const float4*)(ds4_x + (unsigned long long)item * nh * d);
    const unsigned int d4 = (unsigned int)d / 4;
    // The addend the expand before left pending (`pending`).
    const bool pend = pending != 0ull;
    const float* const spost = ds4_smix + (unsigned long long)item * mw + h;
    const float4* const sy = (const float4*)(ds4_sy + (unsigned long long)item * d);
    if (row >= mw) {{
        // The router's part: rows j0 .. j0 + ROUTER_ROWS of the router's F16 weights
        // (r_rows rows of d) against each stream scaled by the collapse's norm weight,
        // P[j][i] = Σ_c W[j][c]·g[c]·x_i[c]. The router's logits are the normed collapse's
        // products, inv · Σ_i pre_i · P[j][i] (`ainv`, the pre weights in `mix`), which
        // `router_select` adds: the router's mat-vec needs only the streams, so it runs
        // here beside the projection rows instead of as a launch after this one.
        const unsigned int j0 = (row - mw) * {RR}u;
        const uint2* const rw = (const uint2*)(ds4_rw + (unsigned long long)j0 * d * 2);
        uint2 rfirst[{RR}];
        #pragma unroll
        for (unsigned int jj = 0; jj < {RR}u; jj++) rfirst[jj] = make_uint2(0u, 0u);
{guard_open_r}        #pragma unroll
        for (unsigned int jj = 0; jj < {RR}u; jj++) {{
            if (j0 + jj < (unsigned int)r_rows && threadIdx.x < d4) rfirst[jj] = __ldg(rw + jj * d4 + threadIdx.x);
        }}
{guard_close}{wait}        float acc[{RR} * DS4_MAX_NH];
        #pragma unroll
        for (unsigned int q = 0; q < {RR}u * DS4_MAX_NH; q++) acc[q] = 0.0f;
        const float4* const g4 = (const float4*)ds4_norm_w;
        for (unsigned int c = threadIdx.x; c < d4; c += blockDim.x) {{
            const float4 g = has_norm != 0ull ? g4[c] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            // The streams' values at c once for the block's rows (in the loop below, 4x the
            // loads and the pending share's multiply-adds: ptxas did not share them).
            float4 vs[DS4_MAX_NH];
            #pragma unroll
            for (unsigned int i = 0; i < DS4_MAX_NH; i++) vs[i] = i < h ? ds4_stream4(x, i * d4 + c, d4, spost, sy, pend) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            #pragma unroll
            for (unsigned int jj = 0; jj < {RR}u; jj++) {{
                if (j0 + jj >= (unsigned int)r_rows) continue;
                const float4 w = ds4_half4(c == threadIdx.x ? rfirst[jj] : __ldg(rw + jj * d4 + c));
                const float4 wg = make_float4(w.x * g.x, w.y * g.y, w.z * g.z, w.w * g.w);
                #pragma unroll
                for (unsigned int i = 0; i < DS4_MAX_NH; i++) {{
                    if (i < h) {{
                        const float4 v = vs[i];
                        float t = acc[jj * DS4_MAX_NH + i];
                        t = fmaf(wg.x, v.x, t); t = fmaf(wg.y, v.y, t); t = fmaf(wg.z, v.z, t); t = fmaf(wg.w, v.w, t);
                        acc[jj * DS4_MAX_NH + i] = t;
                    }}
                }}
            }}
        }}
        // The block's sums: each warp's by shuffles, then the warps' in order.
        __shared__ float rsum[32][{RR} * DS4_MAX_NH];
        const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
        #pragma unroll
        for (unsigned int q = 0; q < {RR}u * DS4_MAX_NH; q++) {{
            float t = acc[q];
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0u) rsum[warp][q] = t;
        }}
        __syncthreads();
        if (threadIdx.x < {RR}u * DS4_MAX_NH) {{
            const unsigned int jj = threadIdx.x / DS4_MAX_NH, i = threadIdx.x % DS4_MAX_NH;
            float t = 0.0f;
            for (unsigned int w = 0; w < blockDim.x / 32u; w++) t += rsum[w][threadIdx.x];
            if (j0 + jj < (unsigned int)r_rows && i < h) ds4_rparts[((unsigned long long)item * r_rows + j0 + jj) * h + i] = t;
        }}
        return;
    }}
    const uint2* const wr = (const uint2*)(ds4_w + (unsigned long long)row * nh * d * 2);
    // The row's first weights before the wait (no kernel writes them): in a decode step's
    // graph the kernel before this one lets it start while its last blocks add and store.
    uint2 w_first[{PREFETCH}];
    #pragma unroll
    for (unsigned int j = 0; j < {PREFETCH}u; j++) w_first[j] = make_uint2(0u, 0u);
{guard_open}    #pragma unroll
    for (unsigned int j = 0; j < {PREFETCH}u; j++) {{
        const unsigned int i = threadIdx.x + j * blockDim.x;
        if (i < n4) w_first[j] = __ldg(wr + i);
    }}
{guard_close}{wait}    // One pass: Σ x² (the norm) and Σ w·x (the projection row), four values a load.
    // The first loads stay in registers for the collapse (`held`, below). There thread t
    // loads channel t of each stream, so a pending addend (`ds4_stream4`'s arithmetic) is
    // one load of sy[t] and a post weight a stream, where `ds4_stream4` finds both a value
    // (a division, a load of sy each).
    float ss_part = 0.0f, dot_part = 0.0f;
    const bool held = d4 == blockDim.x && h <= {PREFETCH}u;
    float4 xr[{PREFETCH}];
    if (held) {{
        const float4 a = pend ? sy[threadIdx.x] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        #pragma unroll
        for (unsigned int j = 0; j < {PREFETCH}u; j++) {{
            const float4 v = j < h ? x[j * d4 + threadIdx.x] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xr[j] = pend && j < h ? ds4_with_share(v, spost[j], a) : v;
        }}
    }} else {{
        #pragma unroll
        for (unsigned int j = 0; j < {PREFETCH}u; j++) {{
            const unsigned int i = threadIdx.x + j * blockDim.x;
            xr[j] = i < n4 ? ds4_stream4(x, i, d4, spost, sy, pend) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }}
    }}
    // The streams with the addend (`pending`), for the launches after this one: each mix
    // block stores its share, values [lo, lo + share), from these loads. Stored by the
    // collapse block alone, its 64 KB (DeepSeek-V4-Flash) were on the grid's last block's
    // path to its end.
    float4* const xo = (float4*)(ds4_xo + (unsigned long long)item * nh * d);
    const unsigned int share = (n4 + mw - 1u) / mw, lo = row * share;
    #pragma unroll
    for (unsigned int j = 0; j < {PREFETCH}u; j++) {{
        const unsigned int i = threadIdx.x + j * blockDim.x;
        if (i < n4) ds4_add_terms(xr[j], w_first[j], ss_part, dot_part);
        if (pend && i < n4 && i - lo < share) xo[i] = xr[j];
    }}
    #pragma unroll 4
    for (unsigned int i = threadIdx.x + {PREFETCH}u * blockDim.x; i < n4; i += blockDim.x) {{
        const float4 v = ds4_stream4(x, i, d4, spost, sy, pend);
        ds4_add_terms(v, wr[i], ss_part, dot_part);
        if (pend && i - lo < share) xo[i] = v;
    }}
    const float2 sums = ds4_block_sum2(ss_part, dot_part);
    const float ss = sums.x, dot = sums.y;
    // The normed streams' projection: Σ w·x scaled by the norm's 1 / rms.
    const float p = dot * rms_inv(ss, (usize)(4 * n4), eps_norm);
    float* const mix = ds4_mix + item * mw;
    __shared__ bool last;
    if (row >= 2 * h) {{
        // A combination entry: the last of the nh² blocks (ticket nh² - 1) runs the
        // Sinkhorn in warp 0, on the projections from L2.
        if (threadIdx.x == 0) ds4_proj[item * mw + row] = p;
        if (comb == 0ull) return;
        if (threadIdx.x == 0) {{
            __threadfence();
            last = atomicAdd(&ds4_counters[2 * item + 1], 1) == (int)(h * h) - 1;
        }}
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (threadIdx.x == 0) ds4_counters[2 * item + 1] = 0;
        ds4_hc_comb_item(ds4_mix, ds4_proj, ds4_scale, ds4_base, nh, iters, eps_mix, item);
        return;
    }}
    // A pre or post weight, this block's own entry of the mix; the last of the nh pre
    // blocks (ticket nh - 1) goes on to the collapse.
    if (threadIdx.x == 0) mix[row] = ds4_hc_pre_post_entry(p, ds4_scale, ds4_base, h, eps_mix, row);
    if (row >= h) return;
    if (threadIdx.x == 0) {{
        __threadfence();
        last = atomicAdd(&ds4_counters[2 * item], 1) == (int)h - 1;
    }}
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) ds4_counters[2 * item] = 0;
    // The collapse (`hc_collapse`): the streams weighted by the pre weights (from L2:
    // other blocks wrote them), added left to right, four outputs a thread at a time.
    float pre[DS4_MAX_NH];
    #pragma unroll
    for (unsigned int i = 0; i < DS4_MAX_NH; i++) pre[i] = i < h ? __ldcg(mix + i) : 0.0f;
    float4* const y = (float4*)(ds4_y + (unsigned long long)item * d);
    const float4* const nw = (const float4*)ds4_norm_w;
    float4* const a = (float4*)(ds4_a + (unsigned long long)item * d);
    // A stream of one float4 a thread and no more streams than the sums' first loads
    // (`held`): thread t holds x[i·d4 + t] of every stream i in xr[i] (DeepSeek-V4-Flash: 4
    // streams of 4096, 1024 threads), its one output is made from those and normed from
    // the register it is in, where otherwise the 64 KB of streams are read again from L2
    // in one block and the outputs read back (1.0 of the kernel's 4.7 µs, H200, a
    // globaltimer read in the block). The same floats either way.
    float4 mine = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float yy_part = 0.0f;
    for (unsigned int c = threadIdx.x; c < d4; c += blockDim.x) {{
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        #pragma unroll
        for (unsigned int i = 0; i < DS4_MAX_NH; i++) {{
            if (i < h) {{
                const float4 v = held && i < {PREFETCH}u ? xr[i < {PREFETCH}u ? i : 0u] : ds4_stream4(x, i * d4 + c, d4, spost, sy, pend);
                acc.x += pre[i] * v.x; acc.y += pre[i] * v.y; acc.z += pre[i] * v.z; acc.w += pre[i] * v.w;
            }}
        }}
        if (!held || has_norm == 0ull) y[c] = acc;
        mine = acc;
        yy_part += acc.x * acc.x; yy_part += acc.y * acc.y; yy_part += acc.z * acc.z; yy_part += acc.w * acc.w;
    }}
    if (has_norm == 0) {{
        if (r_rows != 0ull && threadIdx.x == 0) ds4_ainv[item] = 1.0f;
        return;
    }}
    // The collapse's weighted RMS norm (`rms_norm`: y · inv · w), each thread re-reading
    // the outputs it wrote (held: its one output, kept).
    const float yy = ds4_block_sum(yy_part);
    const float inv_a = rms_inv(yy, d, eps_a);
    // The router part's scale (`r_rows`): its logits are the normed collapse's.
    if (r_rows != 0ull && threadIdx.x == 0) ds4_ainv[item] = inv_a;
    for (unsigned int c = threadIdx.x; c < d4; c += blockDim.x) {{
        const float4 v = held ? mine : y[c];
        const float4 g = nw[c];
        a[c] = make_float4(rms_scaled(v.x, inv_a, g.x), rms_scaled(v.y, inv_a, g.y), rms_scaled(v.z, inv_a, g.z), rms_scaled(v.w, inv_a, g.w));
    }}
}}
"#,
        entry = crate::cuda::own_entry_unwaited(NAME, &THREADS.to_string(), &params()),
        wait = crate::cuda::GRID_WAIT,
        guard_open = crate::cuda::before_wait_open("n4 != 0u"),
        guard_open_r = crate::cuda::before_wait_open("d4 != 0u"),
        guard_close = crate::cuda::BEFORE_WAIT_CLOSE,
        PREFETCH = PREFETCH,
        RR = ROUTER_ROWS,
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A riding launch's Sinkhorn parameters are `hc_comb`'s, each named with a `c` in front.
    #[test]
    fn ride_params_are_comb_params_with_a_c() {
        let (ride, comb) = (ride_params(), comb_params());
        assert_eq!(ride.len(), comb.len());
        for (r, c) in ride.iter().zip(&comb) {
            assert_eq!(r.name(), format!("c{}", c.name()));
            assert_eq!(std::mem::discriminant(r), std::mem::discriminant(c));
        }
    }

    #[test]
    fn fits_decode_tokens_of_a_warp_sized_mix() {
        assert!(fits(4, 4096, 1) && fits(4, 4096, MAX_TOKENS));
        assert!(!fits(4, 4096, 0) && !fits(4, 4096, MAX_TOKENS + 1) && !fits(6, 4096, 1) && !fits(4, 4098, 1));
    }

    /// The first weights' loads, the projection rows' and the router part's, each sit in a
    /// branch of their own ahead of their path's wait: straight-line loads ptxas issued
    /// after it (`cuda::before_wait_open`).
    #[test]
    fn first_weights_load_in_a_branch_before_the_wait() {
        let src = source();
        for (cond, load) in [("if (n4 != 0u) {", "w_first[j] = __ldg(wr + i);"), ("if (d4 != 0u) {", "rfirst[jj] = __ldg(rw + jj * d4 + threadIdx.x);")] {
            let open = src.find(cond).unwrap();
            let load = src.find(load).unwrap();
            let close = open + src[open..].find(crate::cuda::BEFORE_WAIT_CLOSE).unwrap();
            let wait = open + src[open..].find("griddepcontrol.wait").unwrap();
            assert!(open < load && load < close && close < wait, "{cond}: the loads are not in a branch before the wait");
        }
    }
}
