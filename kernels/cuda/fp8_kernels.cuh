// CUDA FP8 kernels (train.dtype: fp8, docs/fp8.md) and the ops that launch
// them: amax, the power-of-two scale, the cast to E4M3/E5M2 (with its
// transpose for the backward's GEMM operands) and the cast back. Semantics:
// kernels/cpu/fp8.cpp, with the per-element conversions of
// kernels/common/fp8.hpp (bit for bit what cvt.rn.satfinite gives).
//
// amax: a max over the bits of |x| as unsigned integers (the order of
// non-negative floats; a NaN's bits exceed +inf's, so a NaN wins, as on the
// CPU), in two launches without atomics: per-block maxima into scratch,
// then one block over those (and the old amax when accumulating). The
// scale: one thread, from the amax on the device (no host read). The
// transposed cast goes through 32x32 tiles in shared memory, so both the
// reads of x and the writes of qt are coalesced.
//
// cuda_backend.cu and the host emulation's test
// (tests/kernel_sim/fp8_sim_test.cpp) include this header.
#pragma once
#include "kernels/common/bf16.hpp"
#include "kernels/common/fp8.hpp"
#include "kernels/cuda/cuda_common.cuh"

namespace adgt::cuda {
namespace {

constexpr int kFp8Threads = 256;
constexpr unsigned kAmaxBlocks = 512;  // per-block maxima, at most

__device__ __forceinline__ float fp8_load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float fp8_load(const bf16_bits* p, int64_t i) { return bf16_to_float(p[i]); }
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <class T>
__global__ void fp8_amax_partial_kernel(unsigned* __restrict__ part, const T* __restrict__ x,
                                        int64_t n) {
  __shared__ unsigned red[32];
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const unsigned b = abs_bits(fp8_load(x, i));
    m = b > m ? b : m;
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) part[blockIdx.x] = m;
}

__global__ void fp8_amax_final_kernel(float* __restrict__ amax, const unsigned* __restrict__ part,
                                      int nparts, int accumulate) {
  __shared__ unsigned red[32];
  unsigned m = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) m = part[i] > m ? part[i] : m;
  m = block_max(m, red);
  if (threadIdx.x == 0) {
    if (accumulate) {
      const unsigned old = abs_bits(amax[0]);
      m = old > m ? old : m;
    }
    amax[0] = __uint_as_float(m);
  }
}

__global__ void fp8_scale_kernel(float* __restrict__ scale, const float* __restrict__ amax,
                                 int kind, int margin) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    scale[0] = pow2f(fp8_scale_exponent(amax[0], Fp8Kind(kind), margin));
}

template <class T>
__global__ void fp8_quantize_kernel(uint8_t* __restrict__ q, const T* __restrict__ x,
                                    const float* __restrict__ scale, int64_t n, int kind) {
  const float s = scale[0];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    q[i] = float_to_fp8(fp8_load(x, i) * s, Fp8Kind(kind));
}

// qt (C, R) = the codes of x (R, C) transposed: block (32 x 8 threads, 1-D)
// per 32x32 tile, tile (blockIdx.x, blockIdx.y) = (column, row) tiles.
template <class T>
__global__ void fp8_quantize_t_kernel(uint8_t* __restrict__ qt, const T* __restrict__ x,
                                      const float* __restrict__ scale, int64_t R, int64_t C,
                                      int kind) {
  __shared__ uint8_t tile[32][33];
  const float s = scale[0];
  const int tx = int(threadIdx.x & 31), ty = int(threadIdx.x >> 5);
  const int64_t c0 = int64_t(blockIdx.x) * 32, r0 = int64_t(blockIdx.y) * 32;
  for (int k = ty; k < 32; k += 8) {
    const int64_t r = r0 + k, c = c0 + tx;
    if (r < R && c < C) tile[k][tx] = float_to_fp8(fp8_load(x, r * C + c) * s, Fp8Kind(kind));
  }
  __syncthreads();
  for (int k = ty; k < 32; k += 8) {
    const int64_t c = c0 + k, r = r0 + tx;
    if (r < R && c < C) qt[c * R + r] = tile[tx][k];
  }
}

template <class D>
__global__ void fp8_dequantize_kernel(D* __restrict__ out, const uint8_t* __restrict__ q,
                                      const float* __restrict__ scale, int64_t n, int kind) {
  const float s = scale[0];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = fp8_to_float(q[i], Fp8Kind(kind)) / s;
    if constexpr (sizeof(D) == 2)
      out[i] = float_to_bf16(v);
    else
      out[i] = v;
  }
}

// out[0] = 1 / a[0], out[1] = 1 / b[0]: the GEMM's dequantization factors.
__global__ void fp8_inverse_kernel(float* __restrict__ out, const float* __restrict__ a,
                                   const float* __restrict__ b) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = 1.0f / a[0];
    out[1] = 1.0f / b[0];
  }
}

Fp8Kind fp8_kind_of(const Tensor& q, const char* op) {
  ADGT_CHECK(q.dtype == DType::E4M3 || q.dtype == DType::E5M2,
             op << ": the FP8 tensor is " << dtype_name(q.dtype) << ", not e4m3 or e5m2");
  return q.dtype == DType::E4M3 ? Fp8Kind::E4M3 : Fp8Kind::E5M2;
}
void fp8_expect_scalar(const Tensor& t, const char* op, const char* what) {
  ADGT_CHECK(t.data && t.dtype == DType::F32 && t.numel() == 1,
             op << ": " << what << " must be one f32, got " << dtype_name(t.dtype) << t.shape_str());
}
// f(const T*) for x in BF16 or F32.
template <class F>
void fp8_lowp(const Tensor& x, const char* op, F&& f) {
  if (x.dtype == DType::F32) return f(x.ptr<float>());
  ADGT_CHECK(x.dtype == DType::BF16, op << ": x is " << dtype_name(x.dtype) << ", not bf16 or f32");
  f(x.ptr<bf16_bits>());
}

void fp8_amax(const OpCtx& c, Tensor amax, const Tensor& x, bool accumulate) {
  const char* op = "fp8_amax";
  fp8_expect_scalar(amax, op, "amax");
  const int64_t n = x.numel();
  const unsigned blocks = n ? std::min(grid_for(n, kFp8Threads), kAmaxBlocks) : 0u;
  unsigned* part = static_cast<unsigned*>(
      c.scratch(CudaBackend::kScratchReduce, size_t(blocks > 0 ? blocks : 1) * sizeof(unsigned)));
  fp8_lowp(x, op, [&](const auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    if (blocks)
      launch(op, fp8_amax_partial_kernel<T>, blocks, kFp8Threads, 0, c.stream, part, p, n);
  });
  launch(op, fp8_amax_final_kernel, 1u, kFp8Threads, 0, c.stream, amax.ptr<float>(),
         static_cast<const unsigned*>(part), int(blocks), accumulate ? 1 : 0);
}

void fp8_scale(const OpCtx& c, Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) {
  const char* op = "fp8_scale";
  fp8_expect_scalar(scale, op, "scale");
  fp8_expect_scalar(amax, op, "amax");
  launch(op, fp8_scale_kernel, 1u, 32, 0, c.stream, scale.ptr<float>(),
         static_cast<const float*>(amax.ptr<float>()), int(kind), margin);
}

void fp8_quantize(const OpCtx& c, Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) {
  const char* op = "fp8_quantize";
  const Fp8Kind k = fp8_kind_of(q, op);
  fp8_expect_scalar(scale, op, "scale");
  ADGT_CHECK(q.numel() == x.numel(),
             op << ": q" << q.shape_str() << " and x" << x.shape_str() << " differ in size");
  const int64_t n = x.numel();
  if (qt.data)
    ADGT_CHECK(qt.dtype == q.dtype && x.ndim == 2 && qt.numel() == n,
               op << ": qt" << qt.shape_str() << " " << dtype_name(qt.dtype)
                  << " is not the transpose of x" << x.shape_str());
  if (!n) return;
  fp8_lowp(x, op, [&](const auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    launch(op, fp8_quantize_kernel<T>, grid_for(n, kFp8Threads), kFp8Threads, 0, c.stream,
           q.ptr<uint8_t>(), p, static_cast<const float*>(scale.ptr<float>()), n, int(k));
    if (!qt.data) return;
    const int64_t R = x.dim(0), C = x.dim(1);
    ADGT_CHECK((R + 31) / 32 <= 65535 && (C + 31) / 32 <= INT_MAX,
               op << ": x" << x.shape_str() << " has too many rows for the transposed cast's grid");
    launch(op, fp8_quantize_t_kernel<T>, dim3(unsigned((C + 31) / 32), unsigned((R + 31) / 32)),
           kFp8Threads, 0, c.stream, qt.ptr<uint8_t>(), p,
           static_cast<const float*>(scale.ptr<float>()), R, C, int(k));
  });
}

// out[0..1] = 1 / a[0], 1 / b[0] (device pointers).
void fp8_inverse_pair(const OpCtx& c, float* out, const float* a, const float* b) {
  launch("fp8_inverse", fp8_inverse_kernel, 1u, 32, 0, c.stream, out, a, b);
}

void fp8_dequantize(const OpCtx& c, Tensor out, const Tensor& q, const Tensor& scale) {
  const char* op = "fp8_dequantize";
  const Fp8Kind k = fp8_kind_of(q, op);
  fp8_expect_scalar(scale, op, "scale");
  ADGT_CHECK(q.numel() == out.numel(),
             op << ": out" << out.shape_str() << " and q" << q.shape_str() << " differ in size");
  const int64_t n = q.numel();
  if (!n) return;
  const float* s = scale.ptr<float>();
  if (out.dtype == DType::F32) {
    launch(op, fp8_dequantize_kernel<float>, grid_for(n, kFp8Threads), kFp8Threads, 0, c.stream,
           out.ptr<float>(), static_cast<const uint8_t*>(q.ptr<uint8_t>()), s, n, int(k));
    return;
  }
  ADGT_CHECK(out.dtype == DType::BF16, op << ": out is " << dtype_name(out.dtype) << ", not bf16 or f32");
  launch(op, fp8_dequantize_kernel<bf16_bits>, grid_for(n, kFp8Threads), kFp8Threads, 0, c.stream,
         out.ptr<bf16_bits>(), static_cast<const uint8_t*>(q.ptr<uint8_t>()), s, n, int(k));
}

}  // namespace
}  // namespace adgt::cuda
