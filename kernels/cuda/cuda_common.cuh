// Shared pieces of the CUDA backend's .cu files: checked calls, dtype
// dispatch, launch sizing and block reductions. CUDA translation units only.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/check.hpp"
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

// Every cuBLAS call.
#define ADGT_CUBLAS_OP(call, op)                                                       \
  do {                                                                                 \
    cublasStatus_t adgt_st_ = (call);                                                  \
    if (adgt_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::adgt::cuda::call_failed(#call, (op), cublasGetStatusString(adgt_st_), __FILE__, \
                                __LINE__);                                             \
  } while (0)

// After every kernel launch: launch-configuration errors now, and errors of
// earlier asynchronous work that surface here.
#define ADGT_LAUNCH_CHECK(op) ADGT_CUDA_OP(cudaGetLastError(), op)

namespace adgt::cuda {

inline cudaStream_t as_stream(CUstream_st* s) { return s; }

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

inline void expect_same(const Tensor& a, const Tensor& b, const char* op) {
  ADGT_CHECK(a.dtype == b.dtype,
             op << ": dtype mismatch " << dtype_name(a.dtype) << " vs " << dtype_name(b.dtype));
  ADGT_CHECK(a.numel() == b.numel(),
             op << ": size mismatch " << a.shape_str() << " vs " << b.shape_str());
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

}  // namespace adgt::cuda
