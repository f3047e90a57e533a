// A standalone harness for a decode token's routed experts (not part of the build): the
// generated `matvec_digits_iq2_xxs_swiglu` (six picks' IQ2_XXS_R gate and up, 2048 × 4096,
// into the digits of their SwiGLU) and `matvec_digits_q2_k` (the picks' Q2_K down, 4096 ×
// 2048, weighted and summed), with variants made from their text by
// scripts/lab/experts_lab.sh, against a plain 16-byte read of the same experts' bytes.
// 256 experts of random bytes (timing does not depend on the values); each call of a graph
// picks six other experts, so that their rows come from DRAM as a decode step's do.
// Outputs are compared bit for bit with the first kernel's (a variant that should not
// change the floats must show 0).
//
// Hand-made forms beside the generated ones (rows staged through shared memory, a ring of
// two passes, the down on regrouped blocks: all slower, RESULTS.md, thirty-first stop) are
// on the branch experiment/routed-gate-up (`scripts/lab/experts_staged.cu`, 492571e); they
// restated the generated arithmetic, so they are not kept beside it.
//
// GEN=device-carry/lab [VARIANTS_GU=...] [VARIANTS_DN=...] [NCU=1] scripts/lab/experts_lab.sh
#include "lab.h"
#include <cstdint>
#include <cstring>
#include <cmath>

// Each generated file in a namespace of its own: they define the same helpers.
namespace gen_gu {
#include "matvec_digits_iq2_xxs_swiglu.cu"
}
namespace gen_dn {
#include "matvec_digits_q2_k.cu"
}
#ifdef VARIANTS
#include "variants.cu"
#endif

typedef void (*GateUpFn)(unsigned char*, float*, float*, const unsigned char*, const unsigned char*, const unsigned char*, const float*, const int*, unsigned long long, unsigned long long, unsigned long long, unsigned long long, float);
typedef void (*DownFn)(float*, const unsigned char*, const unsigned char*, const float*, const float*, const int*, const float*, const float*, unsigned long long, unsigned long long, unsigned long long, unsigned long long, unsigned long long, float*, const float*, const float*, unsigned long long);

// Random bytes from a hash of the index.
__global__ void fill_bytes(unsigned int* p, size_t words, unsigned int seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
        unsigned int h = (unsigned int)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = h;
    }
}

// Half-precision fields set to a small finite value (random bytes there make NaNs, whose
// arithmetic may run on other paths): `at` bytes into every `stride` bytes, `count` of them.
__global__ void set_halves(unsigned char* p, size_t stride, size_t at, size_t count, unsigned short h) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        *(unsigned short*)(p + i * stride + at) = h;
    }
}

int main() {
    const unsigned long long experts = 256, picks = 6, d = 4096, ff = 2048;
    const unsigned long long gu_rb = d / 256 * 72;   // IQ2_XXS_R: 72 bytes a 256-value block
    const unsigned long long dn_rb = ff / 256 * 84;  // Q2_K: 84 bytes a 256-value block
    const size_t gu_expert = ff * gu_rb, dn_expert = d * dn_rb;
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    unsigned char *wg, *wu, *wd, *xd, *hd;
    float *xs, *hs, *hsum, *wts, *out, *sink, *streams, *mix, *expanded;
    int* sels;
    CK(cudaMalloc(&wg, experts * gu_expert));
    CK(cudaMalloc(&wu, experts * gu_expert));
    CK(cudaMalloc(&wd, experts * dn_expert));
    CK(cudaMalloc(&xd, 3 * d));
    CK(cudaMalloc(&xs, d / 32 * 4));
    CK(cudaMalloc(&hd, 3 * picks * ff));
    CK(cudaMalloc(&hs, picks * ff / 32 * 4));
    CK(cudaMalloc(&hsum, picks * ff / 16 * 4));
    CK(cudaMalloc(&wts, picks * 4));
    CK(cudaMalloc(&out, d * 4));
    CK(cudaMalloc(&sink, d * 4));
    // The down expands its sum into the hyper-connection's 4 streams, as in the step.
    const unsigned long long nh = 4;
    CK(cudaMalloc(&streams, nh * d * 4));
    CK(cudaMalloc(&expanded, nh * d * 4));
    CK(cudaMalloc(&mix, (2 * nh + nh * nh) * 4));
    CK(cudaMemset(streams, 0, nh * d * 4));
    CK(cudaMemset(mix, 0, (2 * nh + nh * nh) * 4));
    const int sets = 40;
    CK(cudaMalloc(&sels, sets * picks * 4));
    fill_bytes<<<1024, 256>>>((unsigned int*)wg, experts * gu_expert / 4, 1u);
    fill_bytes<<<1024, 256>>>((unsigned int*)wu, experts * gu_expert / 4, 2u);
    fill_bytes<<<1024, 256>>>((unsigned int*)wd, experts * dn_expert / 4, 3u);
    fill_bytes<<<16, 256>>>((unsigned int*)xd, 3 * d / 4, 4u);
    // IQ2_XXS_R's d at byte 4 of each 72-byte block; Q2_K's d and dmin at bytes 80 and 82
    // of each 84-byte block: 2^-8 (0x1c00).
    set_halves<<<1024, 256>>>(wg, 72, 4, experts * gu_expert / 72, 0x1c00);
    set_halves<<<1024, 256>>>(wu, 72, 4, experts * gu_expert / 72, 0x1c00);
    set_halves<<<1024, 256>>>(wd, 84, 80, experts * dn_expert / 84, 0x1c00);
    set_halves<<<1024, 256>>>(wd, 84, 82, experts * dn_expert / 84, 0x1c00);
    {
        std::vector<float> ones(d / 32, 1.0f / 128.0f), w(picks, 1.0f / picks);
        CK(cudaMemcpy(xs, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(wts, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        std::vector<int> s(sets * picks);
        for (int i = 0; i < sets; i++)
            for (unsigned long long p = 0; p < picks; p++) s[i * picks + p] = (int)((i * 37 + p * 41 + i * p * 7) % experts);
        CK(cudaMemcpy(sels, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreate(&st));

    struct GU { const char* name; GateUpFn fn; };
    struct DN { const char* name; DownFn fn; };
    std::vector<GU> gus = {{"matvec_digits_iq2_xxs_swiglu", gen_gu::matvec_digits_iq2_xxs_swiglu}};
    std::vector<DN> dns = {{"matvec_digits_q2_k", gen_dn::matvec_digits_q2_k}};
#ifdef VARIANTS
    GATE_UP_VARIANTS
    DOWN_VARIANTS
#endif
    printf("%-34s %9s %9s %9s\n", "kernel", "us/call", "GB/s", "max|diff|");
    const double gu_bytes = 2.0 * picks * gu_expert, dn_bytes = (double)picks * dn_expert;
    // A plain read of the picks' rows of the matrices `mats` (`bytes` an expert), a launch
    // each (the kernels read gate and up in one).
    auto plain = [&](const char* what, std::vector<const unsigned char*> mats, size_t bytes) {
        const float us = time_graph([&](cudaStream_t t, int i) {
            for (const unsigned char* w : mats) plain_read<<<dim3(prop.multiProcessorCount * 4 / (unsigned)picks, (unsigned)picks), 256, 0, t>>>(sink, w, sels + (i % sets) * picks, bytes);
        }, st, 2 * sets);
        printf("%-34s %9.2f %9.0f\n", what, us, mats.size() * picks * bytes / (us * 1e3));
    };
    // Gate and up (one launch), then a plain read of the same bytes.
    std::vector<unsigned char> ref_d;
    for (auto& g : gus) {
        auto go = [&](cudaStream_t t, int i) {
            g.fn<<<dim3((unsigned)(ff / 32), (unsigned)picks), 256, 0, t>>>(hd, hs, hsum, wg, wu, xd, xs, sels + (i % sets) * picks, ff, d, gu_rb, picks, 10.0f);
        };
        go(st, 0);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        std::vector<unsigned char> got(3 * picks * ff);
        CK(cudaMemcpy(got.data(), hd, got.size(), cudaMemcpyDeviceToHost));
        if (ref_d.empty()) ref_d = got;
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); i++) differ += got[i] != ref_d[i];
        const float us = time_graph(go, st, 2 * sets);
        printf("%-34s %9.2f %9.0f %6zu bytes differ\n", g.name, us, gu_bytes / (us * 1e3), differ);
    }
    plain("plain read, gate + up", {wg, wu}, gu_expert);
    // The down on the last gate-and-up's digits.
    std::vector<float> ref_o;
    for (auto& dn : dns) {
        auto go = [&](cudaStream_t t, int i) {
            dn.fn<<<(unsigned)(d / 4), (unsigned)(32 * picks), 0, t>>>(out, wd, hd, hs, hsum, sels + (i % sets) * picks, wts, sink, d, ff, dn_rb, picks, 0ull, expanded, streams, mix, nh);
        };
        go(st, 0);
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        std::vector<float> got(d);
        CK(cudaMemcpy(got.data(), out, d * 4, cudaMemcpyDeviceToHost));
        if (ref_o.empty()) ref_o = got;
        float diff = 0;
        for (size_t i = 0; i < got.size(); i++) diff = std::max(diff, std::fabs(got[i] - ref_o[i]));
        const float us = time_graph(go, st, 2 * sets);
        printf("%-34s %9.2f %9.0f %9.1e\n", dn.name, us, dn_bytes / (us * 1e3), diff);
    }
    plain("plain read, down", {wd}, dn_expert);
    return 0;
}
