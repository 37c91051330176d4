// The rest of the CUDA surface the handwritten kernels of kernels/cuda/*_kernels.cuh
// use, emulated on the host on top of sim_runtime.hpp: dim3 and streams, the
// vector types, bf16 conversions (round to nearest even, as cvt.rn.bf16.f32),
// warp shuffles of any 4- or 8-byte type, __popc/__ffs, and the launcher
// that adgt::cuda::launch (kernels/cuda/device_common.cuh) calls under
// ADGT_CUDA_SIM. Include this, then the kernel header under test.
//
// Launches run in the warp order of `launch_order` (tests run every case in
// both orders, see sim_runtime.hpp), and every launch is recorded (op name,
// grid, block) so a test can check which kernels an op chose.
#pragma once
#ifndef ADGT_CUDA_SIM
#define ADGT_CUDA_SIM 1
#endif
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/bf16.hpp"
#include "tests/tools/cuda_sim/sim_runtime.hpp"

// ---- types -------------------------------------------------------------------
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct __nv_bfloat16 {
  uint16_t x;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {adgt::float_to_bf16(f)}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline float __bfloat162float(__nv_bfloat16 h) { return adgt::bf16_to_float(h.x); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

// The runtime calls an op may make between launches (device memory is host
// memory here; every call is in stream order, i.e. immediate).
enum cudaError_t { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
inline const char* cudaGetErrorName(cudaError_t) { return "cudaSuccess"; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t = nullptr) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
template <class K>
inline cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) {
  return cudaSuccess;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline void __threadfence() {}
inline void __threadfence_system() {}

// ---- shuffles ------------------------------------------------------------------
namespace adgt::cuda_sim {
// Every lane deposits var and reads lane src(lane)'s (its own when src is
// out of range, as the hardware does for shfl.down past the warp's end).
template <class T, class Src>
T shuffle(unsigned mask, T var, int width, Src src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle: 4- or 8-byte values");
  if (mask != 0xffffffffu || width != 32) fail("shuffle: only full warps are emulated");
  Slot in{Op::Shfl, {}};
  std::memcpy(in.w, &var, sizeof(T));
  const Slot* s = collective(in);
  const int lane = int(threadIdx.x % 32), from = src(lane);
  T out;
  std::memcpy(&out, s[(from >= 0 && from < 32) ? from : lane].w, sizeof(T));
  return out;
}
}  // namespace adgt::cuda_sim

template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return adgt::cuda_sim::shuffle(mask, var, width, [&](int l) { return l + int(delta); });
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return adgt::cuda_sim::shuffle(mask, var, width, [&](int l) { return l - int(delta); });
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
  return adgt::cuda_sim::shuffle(mask, var, width, [&](int) { return src & 31; });
}
// __shfl_xor_sync (float) is sim_runtime.hpp's; other types here.
template <class T, class = std::enable_if_t<!std::is_same_v<T, float>>>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32) {
  return adgt::cuda_sim::shuffle(mask, var, width, [&](int l) { return l ^ (laneMask & 31); });
}

// ---- launches ------------------------------------------------------------------
namespace adgt::cuda_sim {
struct Launch {
  std::string op;
  dim3 grid, block;
  size_t smem;
};
inline WarpOrder launch_order = WarpOrder::Ascending;
inline std::vector<Launch> launches;

// A kernel launch: checks the configuration as the driver would, then runs
// every CTA. `body` calls the kernel with its arguments.
template <class F>
void launch_kernel(const char* op, dim3 grid, dim3 block, size_t smem, const F& body) {
  if (block.y != 1 || block.z != 1) fail("launch: only 1-D blocks are emulated");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    std::fprintf(stderr, "cuda-sim: %s: empty grid (%u,%u,%u): cudaErrorInvalidConfiguration\n",
                 op, grid.x, grid.y, grid.z);
    std::abort();
  }
  if (grid.y > 65535 || grid.z > 65535) {
    std::fprintf(stderr, "cuda-sim: %s: grid (%u,%u,%u) past the y/z limit of 65535\n", op,
                 grid.x, grid.y, grid.z);
    std::abort();
  }
  launches.push_back({op, grid, block, smem});
  const std::function<void()> fn = body;
  launch(uint3{grid.x, grid.y, grid.z}, block.x, smem, launch_order, fn);
}
}  // namespace adgt::cuda_sim
