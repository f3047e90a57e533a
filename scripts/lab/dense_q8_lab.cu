// A standalone harness for the long-row Q8_0 decode mat-vec (not part of the build).
//
// It times, at DeepSeek-V4-Flash's dense decode shapes, the generated
// `matvec_dense_q8_0_r` (Q8_0_R: 68-byte blocks of 64 values, quants 4-byte aligned)
// against a plain 16-byte read of the same bytes and against a kernel over a layout of
// 256-value blocks (272 bytes: eight f16 scales, then 256 int8 quants, every lane's 16
// quants one aligned 16-byte load) that keeps its slice of x in registers across rows.
// Every call reads a different copy of the matrix (the copies fill 1 GiB), so each one
// streams from DRAM as a decode step does; calls are captured in a CUDA graph.
//
// nvcc -O3 -arch=sm_90 --fmad=false -I device-carry/lab scripts/lab/dense_q8_lab.cu
// (device-carry/lab holds `ds4 gen --target cuda-sm90`'s matvec_dense_q8_0_r.cu.)
#include "lab.h"
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cuda_fp16.h>

#include "matvec_dense_q8_0_r.cu"

// ---- R256: blocks of 256 values (8 f16 scales, then 256 quants).
__device__ __forceinline__ float q8_dot16(const uint4 q, const float* xv, const float d) {
    const unsigned int w[4] = {q.x, q.y, q.z, q.w};
    float a = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; u++) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const float ev = __uint_as_float(__byte_perm(w[u] ^ 0x80808080u, 0x4B000000u, 0x7540u + b)) - 8388736.0f;
            a = fmaf(ev, xv[4 * u + b], a);
        }
    }
    return a * d;
}

// T threads a block, R rows a pass, P passes a block (rows R·P·blockIdx.x + R·p ...), K
// values a row (K = 16·T·C: C chunks of 16 a thread); the next pass's weights loaded
// before this pass's arithmetic. The group of a row is row / ng; x of group g at g·K.
template <int T, int R, int P, int K>
__global__ void __launch_bounds__(T) mv_r256_pipe(float* __restrict__ out, const unsigned char* __restrict__ w, const float* __restrict__ x, const int n, const int ng) {
    constexpr int C = K / (16 * T);
    constexpr unsigned int RB = K / 256 * 272;
    const unsigned int row0 = blockIdx.x * R * P;
    const float* xg = x + (size_t)(row0 / ng) * K;
    uint4 q[2][R][C];
    unsigned short sc[2][R][C];
    auto load = [&](int buf, unsigned int rowa) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned char* wr = w + (size_t)(rowa + r) * RB;
#pragma unroll
            for (int c = 0; c < C; c++) {
                const unsigned int ch = c * T + threadIdx.x;
                const unsigned int blk = ch >> 4, j = ch & 15u;
                q[buf][r][c] = __ldg((const uint4*)(wr + blk * 272u + 16u + j * 16u));
                sc[buf][r][c] = __ldg((const unsigned short*)(wr + blk * 272u + (j >> 1) * 2u));
            }
        }
    };
    load(0, row0);
    float xv[C][16];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const unsigned int ch = c * T + threadIdx.x;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const float4 v = *(const float4*)(xg + ch * 16u + 4u * u);
            xv[c][4 * u] = v.x; xv[c][4 * u + 1] = v.y; xv[c][4 * u + 2] = v.z; xv[c][4 * u + 3] = v.w;
        }
    }
    __shared__ float red[2][T / 32][R];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (p + 1 < P) load((p + 1) & 1, row0 + (p + 1) * R);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float a = 0.0f;
#pragma unroll
            for (int c = 0; c < C; c++) a += q8_dot16(q[p & 1][r][c], xv[c], __half2float(__ushort_as_half(sc[p & 1][r][c])));
            acc[r] = a;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[p & 1][warp][r] = v;
        }
        __syncthreads();
        if (threadIdx.x < R) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < T / 32; i++) s += red[p & 1][i][threadIdx.x];
            out[row0 + p * R + threadIdx.x] = s;
        }
    }
}

// ---- host
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }

struct Shape { const char* what; int n, k, groups; };

typedef void (*Launch)(float*, const unsigned char*, const float*, const Shape&, cudaStream_t);

int main(int argc, char** argv) {
    const Shape shapes[] = {
        {"attn_output_b 4096x8192", 4096, 8192, 1},
        {"attn_output_a 8x1024x4096", 8192, 4096, 8},
        {"shexp gate+up 4096x4096", 4096, 4096, 1},
        {"q_a+kv 1536x4096", 1536, 4096, 1},
    };
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const size_t pool = 1ull << 30;
    unsigned char *wa, *wb;  // Q8_0_R copies, R256 copies (the same numbers)
    CK(cudaMalloc(&wa, pool));
    CK(cudaMalloc(&wb, pool));
    float *x, *oa, *ob;
    CK(cudaMalloc(&x, 8 * 8192 * sizeof(float)));
    CK(cudaMalloc(&oa, 8192 * sizeof(float) * 64));
    CK(cudaMalloc(&ob, 8192 * sizeof(float) * 64));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    printf("%-28s %-26s %9s %9s\n", "shape", "kernel", "us/call", "GB/s");
    for (const Shape& s : shapes) {
        const int nb = s.k / 64;  // 64-value blocks a row
        const size_t ra = (size_t)nb * 68, rb = (size_t)s.k / 256 * 272;
        const size_t bytes = ra * s.n;
        const int copies = (int)std::min<size_t>(24, pool / bytes);
        // One matrix, random scales in [0.5, 1) · 2^-6 and quants; written in both layouts.
        std::vector<unsigned char> ha(bytes), hb(rb * s.n);
        std::vector<float> hx((size_t)s.groups * s.k);
        for (auto& v : hx) v = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        for (int r = 0; r < s.n; r++) {
            for (int b = 0; b < nb; b++) {
                for (int sb = 0; sb < 2; sb++) {
                    const __half d = __float2half((0.5f + (rnd() % 1000) / 2000.0f) / 64.0f);
                    unsigned short du; memcpy(&du, &d, 2);
                    memcpy(&ha[r * ra + b * 68 + sb * 2], &du, 2);
                    const int s32 = b * 2 + sb;  // 32-value sub-block index in the row
                    memcpy(&hb[r * rb + (s32 / 8) * 272 + (s32 % 8) * 2], &du, 2);
                    for (int j = 0; j < 32; j++) {
                        const unsigned char q = (unsigned char)(rnd() & 0xff);
                        ha[r * ra + b * 68 + 4 + sb * 32 + j] = q;
                        hb[r * rb + (s32 / 8) * 272 + 16 + (s32 % 8) * 32 + j] = q;
                    }
                }
            }
        }
        for (int c = 0; c < copies; c++) {
            CK(cudaMemcpy(wa + c * bytes, ha.data(), bytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(wb + c * rb * s.n, hb.data(), rb * s.n, cudaMemcpyHostToDevice));
        }
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        // Reference outputs in double from the host copy.
        std::vector<double> ref(s.n);
        const int ng = s.n / s.groups;
        for (int r = 0; r < s.n; r++) {
            double acc = 0;
            const float* xg = hx.data() + (size_t)(r / ng) * s.k;
            for (int b = 0; b < nb; b++)
                for (int sb = 0; sb < 2; sb++) {
                    __half d; memcpy(&d, &ha[r * ra + b * 68 + sb * 2], 2);
                    const double dd = (double)__half2float(d);
                    for (int j = 0; j < 32; j++) acc += dd * (double)(signed char)ha[r * ra + b * 68 + 4 + sb * 32 + j] * xg[b * 64 + sb * 32 + j];
                }
            ref[r] = acc;
        }
        struct V { const char* name; int layout; std::function<void(int, cudaStream_t)> go; };
        std::vector<V> vs;
        const unsigned long long n = s.n, k = s.k, rbytes = ra, groups = s.groups, ngu = ng;
        vs.push_back({"generated dense", 0, [&, n, k, rbytes, groups, ngu](int c, cudaStream_t t) {
            matvec_dense_q8_0_r<<<dim3((s.n + 3) / 4, 1), 128, 0, t>>>(oa, wa + c * bytes, x, n, k, rbytes, groups, ngu, nullptr, nullptr, nullptr, 0ull, nullptr, nullptr, nullptr, nullptr, 0ull, 0ull, 0.0f);
        }});
        vs.push_back({"plain read", 2, [&](int c, cudaStream_t t) {
            plain_read<<<prop.multiProcessorCount * 8, 256, 0, t>>>(ob, wa + c * bytes, nullptr, bytes);
        }});
#define R256(T_, R_, K_) PIPE(T_, R_, 1, K_)
#define PIPE(T_, R_, P_, K_) if (s.k == K_) vs.push_back({"r256 T" #T_ " R" #R_ " P" #P_, 1, [&](int c, cudaStream_t t) { \
            mv_r256_pipe<T_, R_, P_, K_><<<s.n / (R_ * P_), T_, 0, t>>>(ob, wb + c * rb * s.n, x, s.n, ng); }});
        R256(512, 4, 8192) R256(512, 8, 8192) R256(256, 4, 8192) R256(256, 8, 8192)
        PIPE(512, 4, 2, 8192) PIPE(512, 4, 4, 8192) PIPE(256, 4, 4, 8192)
        R256(256, 4, 4096) R256(256, 8, 4096) R256(128, 4, 4096) R256(128, 8, 4096)
        PIPE(256, 4, 2, 4096) PIPE(256, 4, 4, 4096) PIPE(128, 4, 4, 4096)
        for (auto& v : vs) {
            // Check (kernels that compute), then time a graph of calls over the copies.
            v.go(0, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            double worst = 0;
            if (v.layout != 2) {
                std::vector<float> got(s.n);
                CK(cudaMemcpy(got.data(), v.layout == 0 ? oa : ob, s.n * 4, cudaMemcpyDeviceToHost));
                for (int r = 0; r < s.n; r++) worst = std::max(worst, std::fabs(got[r] - ref[r]) / (1e-3 + std::fabs(ref[r])));
            }
            const float us = time_graph([&](cudaStream_t t, int i) { v.go(i % copies, t); }, st, copies * 4);
            printf("%-28s %-26s %9.2f %9.0f  rel.err %.1e\n", s.what, v.name, us, bytes / (us * 1e3), worst);
        }
    }
    return 0;
}
