// Shared pieces of the CUDA backend's .cu files: checked calls, dtype
// dispatch, launch sizing, the launcher, block reductions and the bf16
// load/store helpers.
//
// CUDA translation units, and the host emulation of CUDA: with ADGT_CUDA_SIM
// defined (tests/tools/cuda_sim/sim_cuda.hpp included first) the same
// kernels and launchers compile as plain C++ and run on the CPU (ctest
// kernel_sim_*); the CUDA headers and cuBLAS are left out.
#pragma once
#ifndef ADGT_CUDA_SIM
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cublas_lib.hpp"
#endif

#include <climits>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace adgt::cuda {

[[noreturn]] inline void call_failed(const char* call, const char* op, const std::string& err,
                                     const char* file, int line) {
  std::ostringstream os;
  os << "cuda backend: " << op << ": " << call << " failed: " << err << " [" << file << ":" << line
     << "]";
  throw std::runtime_error(os.str());
}

}  // namespace adgt::cuda

// Every CUDA runtime call: names the statement and the op it served.
#define ADGT_CUDA_OP(call, op)                                                         \
  do {                                                                                 \
    cudaError_t adgt_err_ = (call);                                                    \
    if (adgt_err_ != cudaSuccess)                                                      \
      ::adgt::cuda::call_failed(#call, (op),                                           \
                                std::string(cudaGetErrorName(adgt_err_)) + " (" +    \
                                    cudaGetErrorString(adgt_err_) + ")",               \
                                __FILE__, __LINE__);                                   \
  } while (0)

#ifndef ADGT_CUDA_SIM
// Every cuBLAS call; with ADGT_CUDA_SYNC=1 also the device work it enqueued.
#define ADGT_CUBLAS_OP(call, op)                                                           \
  do {                                                                                     \
    cublasStatus_t adgt_st_ = (call);                                                      \
    if (adgt_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::adgt::cuda::call_failed(#call, (op), ADGT_CUBLAS(cublasGetStatusString)(adgt_st_), \
                                __FILE__, __LINE__);                                       \
    if (::adgt::cuda::sync_debug()) ADGT_CUDA_OP(cudaDeviceSynchronize(), (op));           \
  } while (0)

namespace adgt::cuda {
// ADGT_CUDA_SYNC=1 (any value but 0): synchronise the device after every
// kernel launch and check, so a device fault (an illegal address) is named at
// the op that caused it rather than at a later one. Slow; for finding faults.
inline bool sync_debug() {
  static const bool on = [] {
    const char* v = std::getenv("ADGT_CUDA_SYNC");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}
}  // namespace adgt::cuda

// After every kernel launch: launch-configuration errors now, and errors of
// earlier asynchronous work that surface here; with ADGT_CUDA_SYNC=1 the
// launch's own execution errors too.
#define ADGT_LAUNCH_CHECK(op)                                                          \
  do {                                                                                 \
    ADGT_CUDA_OP(cudaGetLastError(), op);                                              \
    if (::adgt::cuda::sync_debug()) ADGT_CUDA_OP(cudaDeviceSynchronize(), op);        \
  } while (0)
#else
// The emulated launch has already run the kernel and checked its configuration.
#define ADGT_LAUNCH_CHECK(op) ((void)(op))
#endif

// Dynamic shared memory of a kernel (`name` is an unsigned char array or
// pointer, 16-byte aligned); the emulation defines its own.
#ifndef ADGT_CUDA_SIM
#define ADGT_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace adgt::cuda {

inline cudaStream_t as_stream(CUstream_st* s) { return s; }

// What an op of the kernel headers needs besides its tensors: the stream,
// the backend's grow-only scratch, the device error words, and a copy to the
// host (a synchronising read: for checks that need device data, e.g.
// combine's row indices). The CUDA backend makes it with op_ctx(); the
// emulation's tests with host memory.
struct OpCtx {
  cudaStream_t stream = nullptr;
  std::function<void*(CudaBackend::Scratch, size_t)> scratch;
  int64_t* err_dev = nullptr;
  std::function<void(void* dst, const void* src, size_t bytes)> to_host;
};
#ifndef ADGT_CUDA_SIM
inline OpCtx op_ctx(CudaBackend& b) {
  return {b.stream(), [&b](CudaBackend::Scratch w, size_t n) { return b.scratch(w, n); },
          b.device_error_words(),
          [&b](void* dst, const void* src, size_t n) { b.to_host(dst, src, n); }};
}
#endif

// Launches kernel<<<grid, block, smem, st>>>(args...) and checks it, naming
// `op` (ADGT_LAUNCH_CHECK). Under ADGT_CUDA_SIM the same call runs the kernel
// in the host emulation. Every launch of the kernel headers goes through here.
template <class... P, class... A>
void launch(const char* op, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t st, A... args) {
#ifdef ADGT_CUDA_SIM
  (void)st;
  ::adgt::cuda_sim::launch_kernel(op, grid, block, smem, [&] { kernel(args...); });
#else
  kernel<<<grid, block, smem, st>>>(args...);
  cudaError_t e = cudaGetLastError();
  const char* call = "kernel launch";
  if (e == cudaSuccess && sync_debug()) {
    e = cudaDeviceSynchronize();
    call = "kernel launch, then cudaDeviceSynchronize (ADGT_CUDA_SYNC)";
  }
  if (e != cudaSuccess) {
    std::ostringstream os;
    os << call << " <<<(" << grid.x << "," << grid.y << "," << grid.z << "), " << block.x << ", "
       << smem << " B>>>";
    call_failed(os.str().c_str(), op,
                std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")", __FILE__,
                __LINE__);
  }
#endif
}

// Calls f(T{}) with T = float or double according to `dt`.
template <class F>
void dispatch(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::F64:
      f(double{});
      break;
    default:
      ADGT_CHECK(false, "cuda backend: " << op << ": dtype " << dtype_name(dt)
                                         << " not supported (f32 or f64)");
  }
}


// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

// Grid dimension x for one block per row; checked against the hardware limit.
inline unsigned rows_grid(int64_t rows, const char* op) {
  ADGT_CHECK(rows > 0 && rows <= INT_MAX, op << ": " << rows << " rows do not fit one grid");
  return unsigned(rows);
}

// ---- per-type math (float: the single-precision functions, not fast-math) ----
__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return ::exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return ::log(x); }
__device__ __forceinline__ float dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dsqrt(double x) { return ::sqrt(x); }

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;  // lane 0 holds the sum
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) {
    const T u = __shfl_down_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

// Block-wide sum / max, result broadcast to every thread. `red` is 32 slots of
// shared memory; blockDim.x must be a multiple of 32. Fixed order: deterministic.
// Ends with a barrier, so `red` may be reused by the next call.
template <class T>
__device__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < nw ? red[lane] : T(0);
    s = warp_sum(s);
    if (lane == 0) red[0] = s;
  }
  __syncthreads();
  const T out = red[0];
  __syncthreads();
  return out;
}
template <class T>
__device__ T block_max(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < nw ? red[lane] : red[0];
    s = warp_max(s);
    if (lane == 0) red[0] = s;
  }
  __syncthreads();
  const T out = red[0];
  __syncthreads();
  return out;
}

// ---- bf16 storage, fp32 math (the mixed-precision paths) ----
//
// Kernels read W consecutive elements into fp32 registers and write W back:
// W = 8 is one 16-byte access for bf16 (two for fp32) and needs 16-byte
// aligned addresses; W = 1 is the scalar fallback (tails, odd sizes,
// misaligned views). Each bf16 store rounds once, to nearest even
// (cvt.rn.bf16x2.f32: the rounding of kernels/common/bf16.hpp's float_to_bf16).

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A 16-byte vector access must be 16-byte aligned (the GPU faults otherwise);
// the emulation checks every one, the GPU build compiles this away.
__device__ __forceinline__ void check_vec16(const void* p) {
#ifdef ADGT_CUDA_SIM
  if (!aligned16(p)) ::adgt::cuda_sim::fail("misaligned 16-byte vector access (ldv/stv<8>)");
#else
  (void)p;
#endif
}

__device__ __forceinline__ float bf(bf16_bits h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ bf16_bits to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// f rounded to the nearest bf16 value (a bf16 store then load).
__device__ __forceinline__ float round_bf(float f) { return bf(to_bf(f)); }
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

template <int W>
__device__ __forceinline__ void ldv(const bf16_bits* p, float* f) {
  if constexpr (W == 8) {
    check_vec16(p);
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) f[k] = bf(p[k]);
  }
}
template <int W>
__device__ __forceinline__ void ldv(const float* p, float* f) {
  if constexpr (W == 8) {
    check_vec16(p);
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) f[k] = p[k];
  }
}
template <int W>
__device__ __forceinline__ void stv(bf16_bits* p, const float* f) {
  if constexpr (W == 8) {
    check_vec16(p);
    *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf2(f[0], f[1]), pack_bf2(f[2], f[3]),
                                              pack_bf2(f[4], f[5]), pack_bf2(f[6], f[7]));
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = to_bf(f[k]);
  }
}
template <int W>
__device__ __forceinline__ void stv(float* p, const float* f) {
  if constexpr (W == 8) {
    check_vec16(p);
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = f[k];
  }
}

// Elementwise map over n elements: op.run<8>(i) handles [i, i+8) (i a multiple
// of 8, below nvec*8), op.run<1>(i) one element of the tail. nvec = n / 8 when
// every pointer the op touches is 16-byte aligned, else 0 (all scalar).
template <class Op>
__global__ void __launch_bounds__(256) map_kernel(Op op, int64_t n, int64_t nvec) {
  const int64_t t0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = t0; v < nvec; v += stride) op.template run<8>(v * 8);
  for (int64_t i = nvec * 8 + t0; i < n; i += stride) op.template run<1>(i);
}
template <class Op>
void launch_map(const Op& op, int64_t n, bool vec, cudaStream_t st, const char* name) {
  if (n <= 0) return;
  const int64_t nvec = vec ? n / 8 : 0, tail = n - nvec * 8;
  const int threads = 256;
  launch(name, map_kernel<Op>, grid_for(nvec > tail ? nvec : tail, threads), threads, 0, st, op, n,
         nvec);
}

// Calls f(bf16_bits{}) for BF16 or f(float{}) for F32; refuses other dtypes,
// naming what the op accepts.
template <class F>
void dispatch_lowp(DType dt, const char* op, const char* what, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::BF16:
      f(bf16_bits{});
      break;
    default:
      ADGT_CHECK(false, "cuda backend: " << op << ": " << what << " is " << dtype_name(dt)
                                         << " (f32 or bf16 expected)");
  }
}

}  // namespace adgt::cuda
