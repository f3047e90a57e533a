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

__device__ __forceinline__ void lab_cp16(void* to, const void* from) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned int)__cvta_generic_to_shared(to)), "l"(from) : "memory");
}
template <int N> __device__ __forceinline__ void lab_wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

namespace staged_gu {
using namespace gen_gu;
template <int PIPE>
__global__ void __launch_bounds__(256, 3) gu(unsigned char* __restrict__ ds4_out_d, float* __restrict__ ds4_out_s, float* __restrict__ ds4_out_sum, const unsigned char* __restrict__ ds4_wg, const unsigned char* __restrict__ ds4_wu, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const int* __restrict__ ds4_sel, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const float clamp) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    extern __shared__ __align__(16) unsigned char stage[];
    __shared__ unsigned int grid[256];
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 32ull + (warp % 4u) * 8ull;
    const bool up = warp >= 4u;
    const unsigned long long p = blockIdx.y;
    const int pick = ds4_sel[p];
    const unsigned char* const src = (up ? ds4_wu : ds4_wg) + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    unsigned char* const w = stage + warp * 8u * (unsigned int)row_bytes;
    // Pass `it` reads blocks 4it..4it+3 of each row: 288 bytes, 18 copies of 16.
    #pragma unroll
    for (unsigned int it = 0; it < 4u; it++) {
        for (unsigned int c = lane; c < 8u * 18u; c += 32u) {
            const unsigned int off = (c / 18u) * (unsigned int)row_bytes + it * 288u + (c % 18u) * 16u;
            lab_cp16(w + off, src + off);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (unsigned int i = threadIdx.x; i < 256u; i += blockDim.x) grid[i] = DS4_GRID_NIBBLES[i];
    __syncthreads();
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = k / 4ull;
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
        uint4 xv[3][2];
        #pragma unroll
        for (unsigned int d = 0; d < 3u; d++) {
            xv[d][0] = *(const uint4*)(xw + d * kw + ib * 4ull);
            xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + ib * 4ull);
        }
        const float xscale = ds4_xs[ib];
        #pragma unroll
        for (unsigned int r = 0; r < 8u; r++) {
            const unsigned char* const blk = w + r * (unsigned int)row_bytes + (ib / 8u) * 72u;
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
            part[r] = fmaf(db, sx * xscale, part[r]);
        }
    }
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

namespace ring_gu {
using namespace gen_gu;
__global__ void __launch_bounds__(256, 3) gu(unsigned char* __restrict__ ds4_out_d, float* __restrict__ ds4_out_s, float* __restrict__ ds4_out_sum, const unsigned char* __restrict__ ds4_wg, const unsigned char* __restrict__ ds4_wu, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const int* __restrict__ ds4_sel, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const float clamp) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    extern __shared__ __align__(16) unsigned char stage[];
    __shared__ unsigned int grid[256];
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 32ull + (warp % 4u) * 8ull;
    const bool up = warp >= 4u;
    const unsigned long long p = blockIdx.y;
    const int pick = ds4_sel[p];
    const unsigned char* const src = (up ? ds4_wu : ds4_wg) + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    // Two stages of a warp's 8 rows × 288 bytes (pass `it`: blocks 4it..4it+3 of each
    // row, 18 copies of 16 a row), pass it in stage it % 2.
    unsigned char* const ring = stage + warp * 2u * 8u * 288u;
    auto issue = [&](unsigned int it) {
        for (unsigned int c = lane; c < 8u * 18u; c += 32u) {
            lab_cp16(ring + (it % 2u) * 2304u + (c / 18u) * 288u + (c % 18u) * 16u, src + (c / 18u) * (unsigned int)row_bytes + it * 288u + (c % 18u) * 16u);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    issue(0u);
    issue(1u);
    for (unsigned int i = threadIdx.x; i < 256u; i += blockDim.x) grid[i] = DS4_GRID_NIBBLES[i];
    __syncthreads();
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = k / 4ull;
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (unsigned int it = 0; it < 4u; it++) {
        if (it < 3u) lab_wait_group<1>(); else lab_wait_group<0>();
        __syncwarp();
        const unsigned int ib = lane + 32u * it;
        uint4 xv[3][2];
        #pragma unroll
        for (unsigned int d = 0; d < 3u; d++) {
            xv[d][0] = *(const uint4*)(xw + d * kw + ib * 4ull);
            xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + ib * 4ull);
        }
        const float xscale = ds4_xs[ib];
        #pragma unroll
        for (unsigned int r = 0; r < 8u; r++) {
            const unsigned char* const blk = ring + (it % 2u) * 2304u + r * 288u + ((ib / 8u) % 4u) * 72u;
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
            part[r] = fmaf(db, sx * xscale, part[r]);
        }
        // The stage is read: the pass after next goes there (an empty group past the end,
        // so that the waits above count alike).
        __syncwarp();
        if (it + 2u < 4u) issue(it + 2u); else asm volatile("cp.async.commit_group;" ::: "memory");
    }
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

namespace staged_dn {
using namespace gen_dn;
template <int PIPE>
__global__ void __launch_bounds__(256, 3) dn(float* __restrict__ ds4_out, const unsigned char* __restrict__ ds4_w, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const float* __restrict__ ds4_xsum, const int* __restrict__ ds4_sel, const float* __restrict__ ds4_wts, const float* __restrict__ ds4_addend, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const unsigned long long has_addend, float* __restrict__ ds4_eout, const float* __restrict__ ds4_er, const float* __restrict__ ds4_emix, const unsigned long long enh) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    extern __shared__ __align__(16) unsigned char stage[];
    __shared__ float parts[8][4];
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long p = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 4ull;
    const int pick = ds4_sel[p];
    const unsigned char* const src = ds4_w + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    unsigned char* const w = stage + (unsigned int)p * 4u * (unsigned int)row_bytes;
    // Pass `it` reads blocks 4it..4it+3 of each row: 336 bytes, 21 copies of 16.
    #pragma unroll
    for (unsigned int it = 0; it < 2u; it++) {
        for (unsigned int c = lane; c < 4u * 21u; c += 32u) {
            const unsigned int off = (c / 21u) * (unsigned int)row_bytes + it * 336u + (c % 21u) * 16u;
            lab_cp16(w + off, src + off);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    __shared__ float ds4_est[4 * DS4_EXPAND_NH][DS4_EXPAND_STAGED];
    if (enh != 0ull && threadIdx.x < 4u * (unsigned int)enh && row0 + threadIdx.x % 4u < n) {
        ds4_expand_stage(ds4_est[threadIdx.x], ds4_emix, ds4_er, (unsigned int)enh, n, 0u, threadIdx.x / 4u, row0 + threadIdx.x % 4u);
    }
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = picks * k / 4ull;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (unsigned int it = 0; it < 2u; it++) {
        // (the expand's group, where it is staged, comes after the weights': waiting for
        // the weights' groups waits for nothing of it.)
        const bool ex = enh != 0ull && threadIdx.x < 4u * (unsigned int)enh;
        if (PIPE) {
            if (it == 0) { if (ex) lab_wait_group<2>(); else lab_wait_group<1>(); } else { if (ex) lab_wait_group<1>(); else lab_wait_group<0>(); }
            __syncwarp();
        } else if (it == 0) {
            if (ex) lab_wait_group<1>(); else lab_wait_group<0>();
            __syncwarp();
        }
        const unsigned int ib = lane + 32u * it;
        const unsigned long long e0 = p * k + ib * 32ull;
        uint4 xv[3][2];
        #pragma unroll
        for (unsigned int d = 0; d < 3u; d++) {
            xv[d][0] = *(const uint4*)(xw + d * kw + e0 / 8ull);
            xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + e0 / 8ull);
        }
        const float xscale = ds4_xs[e0 / 32ull];
        const float xsum0 = ds4_xsum[e0 / 16ull], xsum1 = ds4_xsum[e0 / 16ull + 1ull];
        const unsigned int i = ib % 8u;
        const unsigned int shift = 2u * (i % 4u);
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {
            const unsigned char* const blk = w + r * (unsigned int)row_bytes + (ib / 8u) * 84u;
            const unsigned int* const qw = (const unsigned int*)(blk + 16u + 32u * (i / 4u));
            const unsigned int sc = *(const unsigned short*)(blk + 2u * i);
            const unsigned int dd = *(const unsigned int*)(blk + 80u);
            const float d = ds4_f16_to_f32_dot(dd & 0xffffu), dmin = ds4_f16_to_f32_dot(dd >> 16);
            int a0[3] = {0, 0, 0}, a1[3] = {0, 0, 0};
            #pragma unroll
            for (unsigned int c = 0; c < 8u; c++) {
                const int q = (int)((qw[c] >> shift) & 0x03030303u);
                #pragma unroll
                for (unsigned int dg = 0; dg < 3u; dg++) {
                    const unsigned int* const x4 = (const unsigned int*)&xv[dg][0];
                    if (c < 4u) a0[dg] = __dp4a(q, (int)x4[c], a0[dg]);
                    else a1[dg] = __dp4a(q, (int)x4[c], a1[dg]);
                }
            }
            const float s0 = (((float)a0[2]) * 0.0078125f + (float)a0[1]) * 0.0078125f + (float)a0[0];
            const float s1 = (((float)a1[2]) * 0.0078125f + (float)a1[1]) * 0.0078125f + (float)a1[0];
            part[r] = fmaf(d * (float)(sc & 15u), s0 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)((sc >> 4) & 15u)), xsum0, part[r]);
            part[r] = fmaf(d * (float)((sc >> 8) & 15u), s1 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)(sc >> 12)), xsum1, part[r]);
        }
    }
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
            const unsigned int q = threadIdx.x % 4u;
            const unsigned int j = threadIdx.x / 4u;
            ds4_eout[((unsigned long long)(0u) * enh + j) * n + row0 + q] = ds4_expand_value(ds4_est[threadIdx.x], y, (unsigned int)enh);
        }
    }
}
}

// The down on a regrouped layout (a prototype: the harness's bytes are random, so only
// the addressing differs): four Q2_K blocks a 336-byte block, their d and dmin (16
// bytes), then their scales (64), then their quants (256), every field 16-byte aligned,
// so a lane's 32 quant bytes are two 16-byte loads where Q2_K's 84-byte blocks make them
// eight of 4 bytes.
namespace regroup_dn {
using namespace gen_dn;
__global__ void __launch_bounds__(256, 3) dn(float* __restrict__ ds4_out, const unsigned char* __restrict__ ds4_w, const unsigned char* __restrict__ ds4_xd, const float* __restrict__ ds4_xs, const float* __restrict__ ds4_xsum, const int* __restrict__ ds4_sel, const float* __restrict__ ds4_wts, const float* __restrict__ ds4_addend, const unsigned long long n, const unsigned long long k, const unsigned long long row_bytes, const unsigned long long picks, const unsigned long long has_addend, float* __restrict__ ds4_eout, const float* __restrict__ ds4_er, const float* __restrict__ ds4_emix, const unsigned long long enh) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    __shared__ float parts[8][4];
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long p = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 4ull;
    __shared__ float ds4_est[4 * DS4_EXPAND_NH][DS4_EXPAND_STAGED];
    if (enh != 0ull && threadIdx.x < 4u * (unsigned int)enh && row0 + threadIdx.x % 4u < n) {
        ds4_expand_stage(ds4_est[threadIdx.x], ds4_emix, ds4_er, (unsigned int)enh, n, 0u, threadIdx.x / 4u, row0 + threadIdx.x % 4u);
    }
    const int pick = ds4_sel[p];
    const unsigned char* const w = ds4_w + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = picks * k / 4ull;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll 2
    for (unsigned int ib = lane; ib < (unsigned int)(k / 32ull); ib += 32u) {
        const unsigned long long e0 = p * k + ib * 32ull;
        uint4 xv[3][2];
        #pragma unroll
        for (unsigned int d = 0; d < 3u; d++) {
            xv[d][0] = *(const uint4*)(xw + d * kw + e0 / 8ull);
            xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + e0 / 8ull);
        }
        const float xscale = ds4_xs[e0 / 32ull];
        const float xsum0 = ds4_xsum[e0 / 16ull], xsum1 = ds4_xsum[e0 / 16ull + 1ull];
        const unsigned int i = ib % 8u;
        const unsigned int shift = 2u * (i % 4u);
        const unsigned int b = ib / 8u;
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {
            const unsigned char* const rb = w + r * row_bytes + (b / 4u) * 336u;
            const uint4* const qv = (const uint4*)(rb + 80u + 64u * (b % 4u) + 32u * (i / 4u));
            const uint4 q0 = qv[0], q1 = qv[1];
            const unsigned int qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            const unsigned int sc = *(const unsigned short*)(rb + 16u + 16u * (b % 4u) + 2u * i);
            const unsigned int dd = *(const unsigned int*)(rb + 4u * (b % 4u));
            const float d = ds4_f16_to_f32_dot(dd & 0xffffu), dmin = ds4_f16_to_f32_dot(dd >> 16);
            int a0[3] = {0, 0, 0}, a1[3] = {0, 0, 0};
            #pragma unroll
            for (unsigned int c = 0; c < 8u; c++) {
                const int q = (int)((qw[c] >> shift) & 0x03030303u);
                #pragma unroll
                for (unsigned int dg = 0; dg < 3u; dg++) {
                    const unsigned int* const x4 = (const unsigned int*)&xv[dg][0];
                    if (c < 4u) a0[dg] = __dp4a(q, (int)x4[c], a0[dg]);
                    else a1[dg] = __dp4a(q, (int)x4[c], a1[dg]);
                }
            }
            const float s0 = (((float)a0[2]) * 0.0078125f + (float)a0[1]) * 0.0078125f + (float)a0[0];
            const float s1 = (((float)a1[2]) * 0.0078125f + (float)a1[1]) * 0.0078125f + (float)a1[0];
            part[r] = fmaf(d * (float)(sc & 15u), s0 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)((sc >> 4) & 15u)), xsum0, part[r]);
            part[r] = fmaf(d * (float)((sc >> 8) & 15u), s1 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)(sc >> 12)), xsum1, part[r]);
        }
    }
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
            const unsigned int q = threadIdx.x % 4u;
            const unsigned int j = threadIdx.x / 4u;
            ds4_eout[((unsigned long long)(0u) * enh + j) * n + row0 + q] = ds4_expand_value(ds4_est[threadIdx.x], y, (unsigned int)enh);
        }
    }
}
}
