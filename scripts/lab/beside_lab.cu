// Whether a mat-vec can run beside `hc_pre` instead of after it (thirty-fourth stop,
// bench/RESULTS.md): `attn_q_a` (1024 Q8_0_R rows of 4096) against the four streams and the
// pending share (five x vectors, its parts) on a second lane of a CUDA graph, while an
// `hc_pre`-shaped kernel (24 blocks of 1024 threads, one an SM, ~7 µs of dependent work)
// runs on the first. µs a pattern, the median of nine replays of a graph of 40 patterns.
//
//   nvcc -O3 -arch=sm_90 -Xptxas -v -I scripts/lab scripts/lab/beside_lab.cu -o /tmp/beside && /tmp/beside
#include "lab.h"
#include <cuda_fp16.h>
#include <initializer_list>

constexpr int K = 4096, N = 1024, ROWS = 4;
// Copies of the matrix, launches taking them in turn.
constexpr int COPIES = 8;
constexpr int ROW_BYTES = K / 64 * 68;  // Q8_0_R: two f16 scales, then 64 int8, a 64-value block

// The hc_pre stand-in: every thread runs dependent multiply-adds on 48 values until `ns`
// have passed (one block an SM at 1024 threads if it takes the registers hc_pre takes).
__global__ void __launch_bounds__(1024, 1) pre_like(float* out, unsigned long long ns, float seed) {
    float a[48];
#pragma unroll
    for (int j = 0; j < 48; j++) a[j] = seed + threadIdx.x * 1e-3f + j;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
#pragma unroll
        for (int j = 0; j < 48; j++) a[j] = fmaf(a[j], 0.999f, 0.25f);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 48; j++) s += a[j];
    if (s == 1234.5f) out[0] = s;
}

// A warp RW rows, `ROWS` warps a block: out[row · NX + i] = Σ_c w[row][c] · x_i[c] for NX x
// vectors (K floats each), a lane four values (a word of quants) of each row at a time, x's
// four values loaded once for the warp's RW rows.
template <int NX, int RW>
__global__ void __launch_bounds__(32 * ROWS) q8_rows(float* out, const unsigned char* w, const float* x) {
    const int lane = threadIdx.x & 31, row0 = (blockIdx.x * ROWS + (threadIdx.x >> 5)) * RW;
    float acc[RW][NX];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int i = 0; i < NX; i++) acc[r][i] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < K / 4; c += 32) {
        float4 v[NX];
#pragma unroll
        for (int i = 0; i < NX; i++) v[i] = __ldg((const float4*)(x + (size_t)i * K) + c);
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const unsigned char* const blk = w + (size_t)(row0 + r) * ROW_BYTES + (c / 16) * 68;
            const unsigned int q = __ldg((const unsigned int*)(blk + 4 + 4 * (c % 16)));
            const float s = __half2float(__ushort_as_half(__ldg((const unsigned short*)blk + (c % 16) / 8)));
            const float w0 = (float)(signed char)(q & 0xff) * s, w1 = (float)(signed char)((q >> 8) & 0xff) * s;
            const float w2 = (float)(signed char)((q >> 16) & 0xff) * s, w3 = (float)(signed char)(q >> 24) * s;
#pragma unroll
            for (int i = 0; i < NX; i++) acc[r][i] = fmaf(w3, v[i].w, fmaf(w2, v[i].z, fmaf(w1, v[i].y, fmaf(w0, v[i].x, acc[r][i]))));
        }
    }
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int i = 0; i < NX; i++) {
            float t = acc[r][i];
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0) out[(size_t)(row0 + r) * NX + i] = t;
        }
}

// A launch of q8_rows<NX, RW> over the matrix's copy i % COPIES (each launch reads its own
// copy, so that no launch finds the last one's rows in L2).
template <int NX, int RW>
void q8_launch(cudaStream_t s, int i, float* out, const unsigned char* w, const float* x) {
    q8_rows<NX, RW><<<N / ROWS / RW, 32 * ROWS, 0, s>>>(out, w + (size_t)(i % COPIES) * N * ROW_BYTES, x);
}

int main() {
    cudaStream_t st, side;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    // Each pattern reads its own copy of the matrix (so that none comes from L2).
    unsigned char* w;
    float *x, *out;
    CK(cudaMalloc(&w, (size_t)COPIES * N * ROW_BYTES));
    CK(cudaMemset(w, 0x11, (size_t)COPIES * N * ROW_BYTES));
    CK(cudaMalloc(&x, 5 * K * sizeof(float)));
    CK(cudaMemset(x, 0, 5 * K * sizeof(float)));
    CK(cudaMalloc(&out, N * 5 * sizeof(float)));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, pre_like));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pre_like, 1024, 0));
    printf("pre_like: %d registers, %d blocks an SM; %d SMs\n", fa.numRegs, per_sm, sms);
    cudaEvent_t fork, joined;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    const int calls = 40;
    for (unsigned long long ns : {5000ull, 7000ull}) {
        auto pre = [&](cudaStream_t s) { pre_like<<<24, 1024, 0, s>>>(out, ns, 1.0f); };
        auto q1 = [&](cudaStream_t s, int i) { q8_launch<1, 1>(s, i, out, w, x); };
        auto q5 = [&](cudaStream_t s, int i) { q8_launch<5, 2>(s, i, out, w, x); };
        auto q5r1 = [&](cudaStream_t s, int i) { q8_launch<5, 1>(s, i, out, w, x); };
        auto q5r4 = [&](cudaStream_t s, int i) { q8_launch<5, 4>(s, i, out, w, x); };
        auto q1r2 = [&](cudaStream_t s, int i) { q8_launch<1, 2>(s, i, out, w, x); };
        // A fork: `first` then `second` made on the two lanes, joined before the next pattern.
        auto beside = [&](cudaStream_t s, int i, bool pre_first) {
            CK(cudaEventRecord(fork, s));
            CK(cudaStreamWaitEvent(side, fork, 0));
            if (pre_first) {
                pre(s);
                q5(side, i);
            } else {
                q5(side, i);
                pre(s);
            }
            CK(cudaEventRecord(joined, side));
            CK(cudaStreamWaitEvent(s, joined, 0));
        };
        const float t_pre = time_graph([&](cudaStream_t s, int) { pre(s); }, st, calls);
        const float t_q1 = time_graph([&](cudaStream_t s, int i) { q1(s, i); }, st, calls);
        const float t_q5 = time_graph([&](cudaStream_t s, int i) { q5(s, i); }, st, calls);
        printf("  q_a forms alone: 1 x, a row a warp %.2f, two %.2f | 5 x, a row a warp %.2f, two %.2f, four %.2f\n", t_q1,
               time_graph([&](cudaStream_t s, int i) { q1r2(s, i); }, st, calls), time_graph([&](cudaStream_t s, int i) { q5r1(s, i); }, st, calls), t_q5,
               time_graph([&](cudaStream_t s, int i) { q5r4(s, i); }, st, calls));
        const float t_then_q1 = time_graph([&](cudaStream_t s, int i) { pre(s); q1(s, i); }, st, calls);
        const float t_then_q5 = time_graph([&](cudaStream_t s, int i) { pre(s); q5(s, i); }, st, calls);
        const float t_pre_first = time_graph([&](cudaStream_t s, int i) { beside(s, i, true); }, st, calls);
        const float t_q5_first = time_graph([&](cudaStream_t s, int i) { beside(s, i, false); }, st, calls);
        printf("pre %llu ns: pre %.2f | q_a %.2f | q_a, 5 x (two rows a warp) %.2f | pre then q_a %.2f | pre then q_a 5 x %.2f | beside, pre made first %.2f | beside, q_a made first %.2f\n",
               ns, t_pre, t_q1, t_q5, t_then_q1, t_then_q5, t_pre_first, t_q5_first);
    }
    return 0;
}
