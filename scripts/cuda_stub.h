// Host-compiler stand-ins for CUDA's keywords and intrinsics, so that generated CUDA C++
// can be syntax- and type-checked with g++ on a machine without CUDA
// (scripts/cuda-syntax-check.sh). Nothing here runs; semantics are not modelled.
#pragma once
#include <cmath>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
struct ds4_dim3 { unsigned int x, y, z; };
static ds4_dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
struct int4 { int x, y, z, w; };
struct __half { unsigned short b; };
struct __half2 { __half x, y; };
inline void __syncthreads() {}
inline void __syncwarp(unsigned int = 0xffffffffu) {}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int, int = 32) { return v; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return v; }
template <class T> inline T __shfl_sync(unsigned, T v, int, int = 32) { return v; }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned, int = 32) { return v; }
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned, int = 32) { return v; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
inline float __uint_as_float(unsigned int) { return 0.0f; }
inline unsigned int __float_as_uint(float) { return 0u; }
inline float __int_as_float(int) { return 0.0f; }
inline int __float_as_int(float) { return 0; }
inline float __expf(float x) { return x; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __half2float(__half) { return 0.0f; }
inline __half __float2half_rn(float) { return __half{}; }
inline __half __float2half_rz(float) { return __half{}; }
inline unsigned short __half_as_ushort(__half h) { return h.b; }
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline int __float2int_rn(float) { return 0; }
unsigned int __byte_perm(unsigned int, unsigned int, unsigned int);
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int, unsigned int) { return lo; }
inline unsigned long long __cvta_generic_to_shared(const void* p) { return (unsigned long long)p; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float atomicAdd(float* p, float v) { return *p += v; }
inline int atomicAdd(int* p, int v) { return *p += v; }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { return *p += v; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return *p += v; }
inline int atomicMax(int* p, int v) { return *p = v; }
inline void __threadfence() {}
inline unsigned int __activemask() { return 0xffffffffu; }
inline unsigned int __ballot_sync(unsigned, int) { return 0u; }
inline int __all_sync(unsigned, int) { return 0; }
inline int __popc(unsigned int) { return 0; }
inline unsigned int __match_any_sync(unsigned, unsigned int) { return 0u; }
inline int __ffs(unsigned int) { return 0; }
inline unsigned int __vsub4(unsigned int a, unsigned int) { return a; }
inline int __dp4a(int a, int, int c) { return a + c; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline float __fmaf_rn(float a, float b, float c) { return a * b + c; }
