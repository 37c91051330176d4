// CUDA optimizer kernels and the ops that launch them: a deterministic sum of
// squares (two passes, double accumulation, fixed chunking; f32 and bf16 read
// 16 bytes at a time) and the AdamW update (PyTorch's order, the per-element
// math shared with the CPU backend), with adamw_cast's fused mixed-precision
// step: f32 master weights, gradients and moments, and the bf16 copy written
// in the same pass.
//
// optimizer.cu (the CUDA backend's methods, and sum_squares's read-back) and
// the host emulation's test (tests/kernel_sim/optimizer_sim_test.cpp) include
// this header.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/elementwise_math.hpp"
#include "kernels/cuda/cuda_common.cuh"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 1 << 14;  // elements per first-pass block

// Pass 1: block c sums x[c*kChunk, (c+1)*kChunk)^2 in double.
template <class T>
__global__ void sumsq_pass1(double* __restrict__ part, const T* __restrict__ x, int64_t n) {
  __shared__ double red[32];
  const int64_t lo = int64_t(blockIdx.x) * kChunk;
  const int64_t hi = lo + kChunk < n ? lo + kChunk : n;
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const double v = double(x[i]);
    s += v * v;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Pass 1 for f32/bf16 (S): as above, W elements per access. Chunks are
// multiples of 8, so with an aligned x every full group of 8 is aligned; the
// last chunk's remainder (< 8) is scalar.
template <class S, int W>
__global__ void __launch_bounds__(kThreads)
    sumsq_pass1_v(double* __restrict__ part, const S* __restrict__ x, int64_t n) {
  __shared__ double red[32];
  const int64_t lo = int64_t(blockIdx.x) * kChunk;
  const int64_t hi = lo + kChunk < n ? lo + kChunk : n;
  const int64_t body = lo + (hi - lo) / W * W;
  double s = 0;
  for (int64_t i = lo + threadIdx.x * int64_t(W); i < body; i += int64_t(blockDim.x) * W) {
    float f[W];
    ldv<W>(x + i, f);
#pragma unroll
    for (int k = 0; k < W; ++k) s += double(f[k]) * double(f[k]);
  }
  if (body + threadIdx.x < hi) {
    float f[1];
    ldv<1>(x + body + threadIdx.x, f);
    s += double(f[0]) * double(f[0]);
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Pass 2: one block sums the partials (fixed order); result in *dst.
__global__ void sumsq_pass2(const double* __restrict__ part, int64_t nparts, double* __restrict__ dst) {
  __shared__ double red[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *dst = s;
}

template <class T>
__global__ void adamw_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                             T* __restrict__ v, int64_t n, T lr, T b1, T b2, T eps, T wd, T c1,
                             T sc2, T gs) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    math::adamw_update(pi, g[i] * gs, mi, vi, lr, b1, b2, eps, wd, c1, sc2);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// adamw_cast on f32 p, g, m, v with the bf16 copy lo.
struct AdamWCastOp {
  float *p, *m, *v;
  const float* g;
  bf16_bits* lo;
  float lr, b1, b2, eps, wd, c1, sc2, gs;
  template <int W>
  __device__ void run(int64_t i) const {
    float pp[W], gg[W], mm[W], vv[W];
    ldv<W>(p + i, pp);
    ldv<W>(g + i, gg);
    ldv<W>(m + i, mm);
    ldv<W>(v + i, vv);
#pragma unroll
    for (int k = 0; k < W; ++k)
      math::adamw_update(pp[k], gg[k] * gs, mm[k], vv[k], lr, b1, b2, eps, wd, c1, sc2);
    stv<W>(p + i, pp);
    stv<W>(m + i, mm);
    stv<W>(v + i, vv);
    stv<W>(lo + i, pp);
  }
};

// ---- the ops ----

// First-pass blocks (partial sums) of a sum of squares over n elements.
int64_t sumsq_parts(int64_t n) { return (n + kChunk - 1) / kChunk; }

// The two passes of sum_squares, the result left at dst on the device; no
// synchronisation. The partials take the first sumsq_parts(n) doubles of the
// reduce scratch, which is requested at sumsq_parts(n) + 1 doubles: dst may be
// the one after them (CudaBackend::sum_squares's read-back slot). n == 0: 0.
void sum_squares_into(const OpCtx& c, double* dst, const Tensor& x) {
  const char* op = "sum_squares";
  const int64_t n = x.numel();
  if (!n) {
    ADGT_CUDA_OP(cudaMemsetAsync(dst, 0, sizeof(double), c.stream), op);
    return;
  }
  const int64_t nparts = sumsq_parts(n);
  ADGT_CHECK(nparts <= INT_MAX, op << ": " << n << " elements exceed the grid");
  auto* part = static_cast<double*>(
      c.scratch(CudaBackend::kScratchReduce, size_t(nparts + 1) * sizeof(double)));
  if (x.dtype == DType::BF16 || x.dtype == DType::F32) {
    const bool vec = aligned16(x.data);
    dispatch_lowp(x.dtype, op, "x", [&](auto z) {
      using S = decltype(z);
      launch("sum_squares (pass 1)", vec ? sumsq_pass1_v<S, 8> : sumsq_pass1_v<S, 1>,
             unsigned(nparts), kThreads, 0, c.stream, part, x.ptr<S>(), n);
    });
  } else {
    dispatch(x.dtype, op, [&](auto z) {
      using T = decltype(z);
      launch("sum_squares (pass 1)", sumsq_pass1<T>, unsigned(nparts), kThreads, 0, c.stream,
             part, x.ptr<T>(), n);
    });
  }
  launch("sum_squares (pass 2)", sumsq_pass2, 1, 1024, 0, c.stream, part, nparts, dst);
}

// out[i] = sum of squares of x[bounds[2i], bounds[2i+1]), each left on the device.
void sum_squares_ranges(const OpCtx& c, Tensor out, const Tensor& x,
                        const std::vector<int64_t>& bounds) {
  const size_t k = bounds.size() / 2;
  ADGT_CHECK(out.dtype == DType::F64 && size_t(out.numel()) >= k && bounds.size() % 2 == 0,
             "sum_squares_ranges: out " << out.shape_str() << " " << dtype_name(out.dtype)
                                        << " for " << k << " ranges (F64, one per range)");
  const size_t es = dtype_size(x.dtype);
  int64_t most = 0;  // the scratch sized once (growing it synchronises)
  for (size_t i = 0; i < k; ++i) most = std::max(most, bounds[2 * i + 1] - bounds[2 * i]);
  (void)c.scratch(CudaBackend::kScratchReduce, size_t(sumsq_parts(most) + 1) * sizeof(double));
  for (size_t i = 0; i < k; ++i) {
    const Tensor r(static_cast<char*>(x.data) + size_t(bounds[2 * i]) * es, x.dtype,
                   {bounds[2 * i + 1] - bounds[2 * i]});
    sum_squares_into(c, out.ptr<double>() + i, r);  // in stream order: the scratch is reused safely
  }
}

void adamw(const OpCtx& c, Tensor param, const Tensor& grad, Tensor m, Tensor v,
           const AdamWHyper& h) {
  const char* op = "adamw";
  expect_same(param, grad, op);
  expect_same(param, m, op);
  expect_same(param, v, op);
  const int64_t n = param.numel();
  if (!n) return;
  const double bc1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(h.step));
  dispatch(param.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, adamw_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream, param.ptr<T>(),
           grad.ptr<T>(), m.ptr<T>(), v.ptr<T>(), n, T(h.lr), T(h.beta1), T(h.beta2), T(h.eps),
           T(h.weight_decay), T(bc1), T(std::sqrt(bc2)), T(h.grad_scale));
  });
}

// The fused form only: f32 param, grad, m, v and a bf16 copy (other dtypes:
// the backend's adamw, then cast).
void adamw_cast(const OpCtx& c, Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                const AdamWHyper& h) {
  const char* op = "adamw_cast";
  ADGT_CHECK(param.dtype == DType::F32 && lowp.dtype == DType::BF16,
             op << ": the fused step takes f32 master weights and a bf16 copy, got "
                << dtype_name(param.dtype) << " and " << dtype_name(lowp.dtype));
  expect_same(param, grad, op);
  expect_same(param, m, op);
  expect_same(param, v, op);
  ADGT_CHECK(lowp.numel() == param.numel(),
             op << ": bf16 copy" << lowp.shape_str() << " vs master" << param.shape_str());
  const int64_t n = param.numel();
  if (!n) return;
  const double bc1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(h.step));
  const AdamWCastOp o{param.ptr<float>(), m.ptr<float>(), v.ptr<float>(), grad.ptr<float>(),
                      lowp.ptr<bf16_bits>(), float(h.lr), float(h.beta1), float(h.beta2),
                      float(h.eps), float(h.weight_decay), float(bc1), float(std::sqrt(bc2)),
                      float(h.grad_scale)};
  launch_map(o, n,
             aligned16(param.data) && aligned16(grad.data) && aligned16(m.data) &&
                 aligned16(v.data) && aligned16(lowp.data),
             c.stream, op);
}

}  // namespace
}  // namespace adgt::cuda
