// Hand-made forms of the routed experts' decode kernels for experts_lab.cu (prototypes, not
// generated): the generated text's arithmetic (the same floats, bit for bit, but for the
// regrouped down), with the weights read another way. Assumes gate/up k = 4096 (four
// passes of the lanes over a row) and down k = 2048 (two), as the harness. All measured
// slower than the generated kernels (H200, thirty-first stop, µs a call: gate and up
// 16.6, down 11.8):
// - `staged_gu` / `staged_dn`: each warp's rows copied into shared memory by cp.async
//   first (all of its bytes in flight at once, no registers held for them), then read
//   there; PIPE 1 waits for each pass's bytes alone. Gate and up 20.3 / 20.7, down 12.6 /
//   12.2: every warp's later passes queue ahead of the other warps' first, and the loop
//   from shared memory is no faster than from L1.
// - `ring_gu`: two passes in flight a warp (a ring of two stages): 17.8.
// - `regroup_dn`: the down on four Q2_K blocks regrouped so that a lane's 32 quant bytes
//   are two 16-byte loads: 12.9 (the floats differ: the bytes are read as another layout).
// Also measured by sed variants of the generated text (experts_lab.sh): the weights
// brought into L2 first by `cp.async.bulk.prefetch.L2` (gate and up 18.9), the grid in
// 32 or 16 copies so its loads have no bank conflicts (22.0 / 19.7: the fill costs more),
// the grid as pre-split halves (LDS.64, 18.0), other launch bounds (worse or spilling).
// Kept: the grid index by one prmt (16.3) and the down not unrolled (11.6).
// (Timed before their common parts were factored out here: `gu_parts`, `dn_parts`. The
// factored forms compile to the same registers but for a 4-8 byte spill in the gate and up
// forms, offline by scripts/sass/sass.py.)

__device__ __forceinline__ void lab_cp16(void* to, const void* from) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned int)__cvta_generic_to_shared(to)), "l"(from) : "memory");
}
template <int N> __device__ __forceinline__ void lab_wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// A warp's `rows` rows (`row_bytes` apart at `src`) copied to `w` pass by pass (PASSES of
// `pass_bytes` a row, 16 bytes a copy), one commit group a pass.
template <unsigned int PASSES>
__device__ __forceinline__ void lab_stage_rows(unsigned char* w, const unsigned char* src, unsigned int lane, unsigned int rows, unsigned int row_bytes, unsigned int pass_bytes) {
    const unsigned int copies = pass_bytes / 16u;
    #pragma unroll
    for (unsigned int it = 0; it < PASSES; it++) {
        for (unsigned int c = lane; c < rows * copies; c += 32u) {
            const unsigned int off = (c / copies) * row_bytes + it * pass_bytes + (c % copies) * 16u;
            lab_cp16(w + off, src + off);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
}

// What the gate-and-up forms share with the generated text: a pass's x digits, a row's
// group (its 72-byte block at `blk`), and the end (the SwiGLU's digits).
namespace gu_parts {
using namespace gen_gu;
__device__ __forceinline__ void x_pass(uint4 (&xv)[3][2], float& xscale, const unsigned char* ds4_xd, const float* ds4_xs, unsigned long long kw, unsigned int ib) {
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    #pragma unroll
    for (unsigned int d = 0; d < 3u; d++) {
        xv[d][0] = *(const uint4*)(xw + d * kw + ib * 4ull);
        xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + ib * 4ull);
    }
    xscale = ds4_xs[ib];
}
__device__ __forceinline__ float row_group(const unsigned char* blk, unsigned int ib, const uint4 (&xv)[3][2], float xscale, const unsigned int* grid, float part) {
    const uint2 hd = *(const uint2*)blk;
    const uint2 qs = *(const uint2*)(blk + 8u + 8u * (ib % 8u));
    const float db = ds4_f16_to_f32_dot(hd.y & 0xffffu) * (0.5f + (float)((hd.x >> (4u * (ib % 8u))) & 15u)) * 0.25f;
    int acc[3] = {0, 0, 0};
    #pragma unroll
    for (int c = 0; c < 4; c++) {
        const unsigned int g = grid[(qs.x >> (8 * c)) & 255u];
        const int w0 = ds4_pick_bytes(ds4_sign_nibbles(qs.y, 2 * c) | g);
        const int w1 = ds4_pick_bytes(ds4_sign_nibbles(qs.y, 2 * c + 1) | (g >> 16));
        #pragma unroll
        for (unsigned int d = 0; d < 3u; d++) {
            const unsigned int* const x4 = (const unsigned int*)&xv[d][0];
            acc[d] = __dp4a(w0, (int)x4[2 * c], acc[d]);
            acc[d] = __dp4a(w1, (int)x4[2 * c + 1], acc[d]);
        }
    }
    const float sx = (((float)acc[2]) * 0.0078125f + (float)acc[1]) * 0.0078125f + (float)acc[0];
    return fmaf(db, sx * xscale, part);
}
// A pass of the lanes over the warp's 8 rows: group ib of each, row r's block at
// rows + r · stride + at.
__device__ __forceinline__ void pass(float (&part)[8], const unsigned char* rows, unsigned int stride, unsigned int at, unsigned int ib, const unsigned char* ds4_xd, const float* ds4_xs, unsigned long long kw, const unsigned int* grid) {
    uint4 xv[3][2];
    float xscale;
    x_pass(xv, xscale, ds4_xd, ds4_xs, kw, ib);
    #pragma unroll
    for (unsigned int r = 0; r < 8u; r++) part[r] = row_group(rows + r * stride + at, ib, xv, xscale, grid, part[r]);
}
__device__ __forceinline__ void end(const float (&part)[8], int pick, unsigned int lane, unsigned int warp, bool up, unsigned long long p, unsigned long long n, unsigned long long picks, float clamp, unsigned char* ds4_out_d, float* ds4_out_s, float* ds4_out_sum) {
    __shared__ float ds4_gu[2][32];
    #pragma unroll
    for (unsigned int r = 0; r < 8u; r++) {
        float v = pick >= 0 ? part[r] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0u) ds4_gu[up ? 1 : 0][(warp % 4u) * 8u + r] = v;
    }
    __syncthreads();
    if (warp == 0u) ds4_x_digits_value(swiglu_value(ds4_gu[0][lane], ds4_gu[1][lane], clamp), p * (n / 32ull) + blockIdx.x, ds4_out_d, ds4_out_s, ds4_out_sum, picks * n);
}
}

#define LAB_GU_PARAMS unsigned char* __restrict__ ds4_out_d, float* __restrict__ ds4_out_s, float* __restrict__ ds4_out_sum, const unsigned char* __restrict__ ds4_wg, const unsigned char* __restrict__ ds4_wu, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const int* __restrict__ ds4_sel, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const float clamp
// The block's start as the generated kernel's: its warp's rows (gate or up) of its pick.
#define LAB_GU_START \
    asm volatile("griddepcontrol.wait;" ::: "memory"); \
    extern __shared__ __align__(16) unsigned char stage[]; \
    __shared__ unsigned int grid[256]; \
    const unsigned int lane = threadIdx.x & 31u; \
    const unsigned int warp = threadIdx.x >> 5; \
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 32ull + (warp % 4u) * 8ull; \
    const bool up = warp >= 4u; \
    const unsigned long long p = blockIdx.y; \
    const int pick = ds4_sel[p]; \
    const unsigned char* const src = (up ? ds4_wu : ds4_wg) + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
#define LAB_GRID_FILL \
    for (unsigned int i = threadIdx.x; i < 256u; i += blockDim.x) grid[i] = gen_gu::DS4_GRID_NIBBLES[i]; \
    __syncthreads();

// Each warp's rows copied into shared memory whole, pass by pass (pass `it`: blocks
// 4it..4it+3 of each row, 288 bytes, 18 copies of 16), one commit group a pass.
namespace staged_gu {
template <int PIPE>
__global__ void __launch_bounds__(256, 3) gu(LAB_GU_PARAMS) {
    LAB_GU_START
    unsigned char* const w = stage + warp * 8u * (unsigned int)row_bytes;
    lab_stage_rows<4>(w, src, lane, 8u, (unsigned int)row_bytes, 288u);
    LAB_GRID_FILL
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (unsigned int it = 0; it < 4u; it++) {
        if (PIPE) {
            if (it == 0) lab_wait_group<3>(); else if (it == 1) lab_wait_group<2>(); else if (it == 2) lab_wait_group<1>(); else lab_wait_group<0>();
            __syncwarp();
        } else if (it == 0) {
            lab_wait_group<0>();
            __syncwarp();
        }
        const unsigned int ib = lane + 32u * it;
        gu_parts::pass(part, w, (unsigned int)row_bytes, (ib / 8u) * 72u, ib, ds4_xd, ds4_xs, k / 4ull, grid);
    }
    gu_parts::end(part, pick, lane, warp, up, p, n, picks, clamp, ds4_out_d, ds4_out_s, ds4_out_sum);
}
}

// Two passes in flight a warp: a ring of two stages of 8 rows × 288 bytes, pass it in
// stage it % 2, the pass after next issued once a stage is read.
namespace ring_gu {
__global__ void __launch_bounds__(256, 3) gu(LAB_GU_PARAMS) {
    LAB_GU_START
    unsigned char* const ring = stage + warp * 2u * 8u * 288u;
    auto issue = [&](unsigned int it) {
        for (unsigned int c = lane; c < 8u * 18u; c += 32u) {
            lab_cp16(ring + (it % 2u) * 2304u + (c / 18u) * 288u + (c % 18u) * 16u, src + (c / 18u) * (unsigned int)row_bytes + it * 288u + (c % 18u) * 16u);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    issue(0u);
    issue(1u);
    LAB_GRID_FILL
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (unsigned int it = 0; it < 4u; it++) {
        if (it < 3u) lab_wait_group<1>(); else lab_wait_group<0>();
        __syncwarp();
        const unsigned int ib = lane + 32u * it;
        gu_parts::pass(part, ring + (it % 2u) * 2304u, 288u, ((ib / 8u) % 4u) * 72u, ib, ds4_xd, ds4_xs, k / 4ull, grid);
        // The stage is read: the pass after next goes there (an empty group past the end,
        // so that the waits above count alike).
        __syncwarp();
        if (it + 2u < 4u) issue(it + 2u); else asm volatile("cp.async.commit_group;" ::: "memory");
    }
    gu_parts::end(part, pick, lane, warp, up, p, n, picks, clamp, ds4_out_d, ds4_out_s, ds4_out_sum);
}
}

// What the down forms share with the generated text: a pass's x digits and sums, a row's
// group from its quant words `qw`, scales `sc` and d / dmin `dd`, and the end (the picks'
// rows weighted and added, the expand).
namespace dn_parts {
using namespace gen_dn;
struct XPass { uint4 xv[3][2]; float xscale, xsum0, xsum1; };
__device__ __forceinline__ XPass x_pass(const unsigned char* ds4_xd, const float* ds4_xs, const float* ds4_xsum, unsigned long long kw, unsigned long long e0) {
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    XPass x;
    #pragma unroll
    for (unsigned int d = 0; d < 3u; d++) {
        x.xv[d][0] = *(const uint4*)(xw + d * kw + e0 / 8ull);
        x.xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + e0 / 8ull);
    }
    x.xscale = ds4_xs[e0 / 32ull];
    x.xsum0 = ds4_xsum[e0 / 16ull];
    x.xsum1 = ds4_xsum[e0 / 16ull + 1ull];
    return x;
}
__device__ __forceinline__ float row_group(const unsigned int (&qw)[8], unsigned int sc, unsigned int dd, unsigned int shift, const XPass& x, float part) {
    const float d = ds4_f16_to_f32_dot(dd & 0xffffu), dmin = ds4_f16_to_f32_dot(dd >> 16);
    int a0[3] = {0, 0, 0}, a1[3] = {0, 0, 0};
    #pragma unroll
    for (unsigned int c = 0; c < 8u; c++) {
        const int q = (int)((qw[c] >> shift) & 0x03030303u);
        #pragma unroll
        for (unsigned int dg = 0; dg < 3u; dg++) {
            const unsigned int* const x4 = (const unsigned int*)&x.xv[dg][0];
            if (c < 4u) a0[dg] = __dp4a(q, (int)x4[c], a0[dg]);
            else a1[dg] = __dp4a(q, (int)x4[c], a1[dg]);
        }
    }
    const float s0 = (((float)a0[2]) * 0.0078125f + (float)a0[1]) * 0.0078125f + (float)a0[0];
    const float s1 = (((float)a1[2]) * 0.0078125f + (float)a1[1]) * 0.0078125f + (float)a1[0];
    part = fmaf(d * (float)(sc & 15u), s0 * x.xscale, part);
    part = fmaf(-(dmin * (float)((sc >> 4) & 15u)), x.xsum0, part);
    part = fmaf(d * (float)((sc >> 8) & 15u), s1 * x.xscale, part);
    return fmaf(-(dmin * (float)(sc >> 12)), x.xsum1, part);
}
__device__ __forceinline__ void end(const float (&part)[4], float (&est)[4 * DS4_EXPAND_NH][DS4_EXPAND_STAGED], unsigned int lane, unsigned long long p, unsigned long long row0, float* ds4_out, const int* ds4_sel, const float* ds4_wts, const float* ds4_addend, unsigned long long n, unsigned long long picks, unsigned long long has_addend, float* ds4_eout, unsigned long long enh) {
    __shared__ float parts[8][4];
    asm volatile("griddepcontrol.launch_dependents;");
    #pragma unroll
    for (unsigned int r = 0; r < 4u; r++) {
        float v = part[r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0u) parts[p][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < 4u * (enh != 0ull ? (unsigned int)enh : 1u)) {
        const unsigned int r = threadIdx.x % 4u;
        float acc = 0.0f;
        for (unsigned long long q = 0; q < picks; q++) {
            if (ds4_sel[q] >= 0) acc = acc + ds4_wts[q] * parts[q][r];
        }
        const float y = has_addend != 0ull ? acc + ds4_addend[row0 + r] : acc;
        if (threadIdx.x < 4u) ds4_out[row0 + r] = y;
        if (enh != 0ull && threadIdx.x < 4u * (unsigned int)enh && row0 + threadIdx.x % 4u < n) {
            const unsigned int j = threadIdx.x / 4u;
            ds4_eout[j * n + row0 + r] = ds4_expand_value(est[threadIdx.x], y, (unsigned int)enh);
        }
    }
}
}

#define LAB_DN_PARAMS float* __restrict__ ds4_out, const unsigned char* __restrict__ ds4_w, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const float* __restrict__ ds4_xsum, const int* __restrict__ ds4_sel, const float* __restrict__ ds4_wts, const float* __restrict__ ds4_addend, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const unsigned long long has_addend, float* __restrict__ ds4_eout, const float* __restrict__ ds4_er, const float* __restrict__ ds4_emix, const unsigned long long enh
// The block's start as the generated kernel's: warp p the four rows of pick p, the
// expand's inputs on their way to shared memory.
#define LAB_DN_START \
    asm volatile("griddepcontrol.wait;" ::: "memory"); \
    const unsigned int lane = threadIdx.x & 31u; \
    const unsigned long long p = threadIdx.x >> 5; \
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 4ull; \
    __shared__ float ds4_est[4 * DS4_EXPAND_NH][DS4_EXPAND_STAGED]; \
    const int pick = ds4_sel[p]; \
    const unsigned char* const src = ds4_w + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes; \
    const unsigned long long kw = picks * k / 4ull; \
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#define LAB_DN_EXPAND_STAGE \
    if (enh != 0ull && threadIdx.x < 4u * (unsigned int)enh && row0 + threadIdx.x % 4u < n) { \
        gen_dn::ds4_expand_stage(ds4_est[threadIdx.x], ds4_emix, ds4_er, (unsigned int)enh, n, 0u, threadIdx.x / 4u, row0 + threadIdx.x % 4u); \
    }

// Each warp's rows copied into shared memory whole, pass by pass (pass `it`: blocks
// 4it..4it+3 of each row, 336 bytes, 21 copies of 16), one commit group a pass; the
// expand's group after them.
namespace staged_dn {
template <int PIPE>
__global__ void __launch_bounds__(256, 3) dn(LAB_DN_PARAMS) {
    LAB_DN_START
    extern __shared__ __align__(16) unsigned char stage[];
    unsigned char* const w = stage + (unsigned int)p * 4u * (unsigned int)row_bytes;
    lab_stage_rows<2>(w, src, lane, 4u, (unsigned int)row_bytes, 336u);
    LAB_DN_EXPAND_STAGE
    const bool ex = enh != 0ull && threadIdx.x < 4u * (unsigned int)enh;
    #pragma unroll
    for (unsigned int it = 0; it < 2u; it++) {
        // (Waiting for the weights' groups waits for nothing of the expand's.)
        if (PIPE) {
            if (it == 0) { if (ex) lab_wait_group<2>(); else lab_wait_group<1>(); } else { if (ex) lab_wait_group<1>(); else lab_wait_group<0>(); }
            __syncwarp();
        } else if (it == 0) {
            if (ex) lab_wait_group<1>(); else lab_wait_group<0>();
            __syncwarp();
        }
        const unsigned int ib = lane + 32u * it;
        const dn_parts::XPass x = dn_parts::x_pass(ds4_xd, ds4_xs, ds4_xsum, kw, p * k + ib * 32ull);
        const unsigned int i = ib % 8u;
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {
            const unsigned char* const blk = w + r * (unsigned int)row_bytes + (ib / 8u) * 84u;
            const unsigned int* const q = (const unsigned int*)(blk + 16u + 32u * (i / 4u));
            const unsigned int qw[8] = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
            part[r] = dn_parts::row_group(qw, *(const unsigned short*)(blk + 2u * i), *(const unsigned int*)(blk + 80u), 2u * (i % 4u), x, part[r]);
        }
    }
    dn_parts::end(part, ds4_est, lane, p, row0, ds4_out, ds4_sel, ds4_wts, ds4_addend, n, picks, has_addend, ds4_eout, enh);
}
}

// The down on a regrouped layout (the harness's bytes are random, so only the addressing
// differs): four Q2_K blocks a 336-byte block, their d and dmin (16 bytes), then their
// scales (64), then their quants (256), every field 16-byte aligned, so that a lane's 32
// quant bytes are two 16-byte loads where Q2_K's 84-byte blocks make them eight of 4.
namespace regroup_dn {
__global__ void __launch_bounds__(256, 3) dn(LAB_DN_PARAMS) {
    LAB_DN_START
    LAB_DN_EXPAND_STAGE
    #pragma unroll 2
    for (unsigned int ib = lane; ib < (unsigned int)(k / 32ull); ib += 32u) {
        const dn_parts::XPass x = dn_parts::x_pass(ds4_xd, ds4_xs, ds4_xsum, kw, p * k + ib * 32ull);
        const unsigned int i = ib % 8u, b = ib / 8u;
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {
            const unsigned char* const rb = src + r * row_bytes + (b / 4u) * 336u;
            const uint4* const qv = (const uint4*)(rb + 80u + 64u * (b % 4u) + 32u * (i / 4u));
            const uint4 q0 = qv[0], q1 = qv[1];
            const unsigned int qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            part[r] = dn_parts::row_group(qw, *(const unsigned short*)(rb + 16u + 16u * (b % 4u) + 2u * i), *(const unsigned int*)(rb + 4u * (b % 4u)), 2u * (i % 4u), x, part[r]);
        }
    }
    dn_parts::end(part, ds4_est, lane, p, row0, ds4_out, ds4_sel, ds4_wts, ds4_addend, n, picks, has_addend, ds4_eout, enh);
}
}
