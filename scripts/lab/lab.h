// What the lab harnesses share: error checks and the timing of a graph of launches.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <functional>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

// µs a call: `go(stream, i)` for i < calls captured in one CUDA graph, the median of nine
// replays.
static float time_graph(std::function<void(cudaStream_t, int)> go, cudaStream_t st, int calls) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; i++) go(st, i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int rep = 0; rep < 9; rep++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms * 1000.0f / calls);
    }
    std::sort(ts.begin(), ts.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ts[ts.size() / 2];
}

// The floor for a launch's reads: `bytes` (a multiple of 16) at `w`, or, where `sel` is
// given, at w + sel[y] · bytes for grid row y (a token's picked experts), summed in 16-byte
// loads.
__global__ void __launch_bounds__(256) plain_read(float* out, const unsigned char* w, const int* sel, size_t bytes) {
    uint32_t s = 0;
    const uint4* const p = (const uint4*)(w + (sel != nullptr ? (size_t)sel[blockIdx.y] * bytes : 0));
#pragma unroll 4
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes / 16; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        s += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x12345678u) out[0] = (float)s;
}
