// CUDA RMSNorm kernels and the ops that launch them: y = x / sqrt(mean(x^2) + eps) * w. One block per row with
// block reductions. Semantics: kernels/cpu/rmsnorm.cpp.
//
// f32/f64: the weight gradient is the two-pass column reduction of bf16 below
// (in T), deterministic, no atomics.
// bf16 (x, w, out, dx bf16; rstd, dw f32): fp32 math through
// kernels/common/row_math.hpp, 16-byte accesses when C % 8 == 0 and the
// tensors are aligned. The weight gradient is a two-pass column reduction:
// pass 1, blocks of kDwRows rows (a count fixed by N alone, not by the GPU) sum
// their rows in order into f32 partials; pass 2 adds the partials to dw in
// row-block order. Deterministic and bitwise reproducible, and parallel over
// rows and columns. The residual form (x += y, then the norm) is one kernel.
//
// rmsnorm.cu (the CUDA backend's methods) and the host emulation's test
// (tests/kernel_sim/rmsnorm_sim_test.cpp) include this header.
#pragma once
#include <algorithm>

#include "kernels/common/row_math.hpp"
#include "kernels/cuda/cuda_common.cuh"

namespace adgt::cuda {
namespace {


constexpr int kThreads = 256;

template <class T>
__global__ void rmsnorm_fwd_kernel(T* __restrict__ out, T* __restrict__ rstd,
                                   const T* __restrict__ x, const T* __restrict__ w, int64_t C,
                                   T eps) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  const T* xr = x + i * C;
  T ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, red);
  const T r = T(1) / dsqrt(ss / T(C) + eps);
  if (threadIdx.x == 0) rstd[i] = r;
  T* o = out + i * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (xr[c] * r) * w[c];
}

// dx(row) += g*w*r - x*k, k = sum_c(g*w*x) r^3 / C.
template <class T>
__global__ void rmsnorm_bwd_dx_kernel(T* __restrict__ dx, const T* __restrict__ g,
                                      const T* __restrict__ x, const T* __restrict__ w,
                                      const T* __restrict__ rstd, int64_t C) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  const T* xr = x + i * C;
  const T* gr = g + i * C;
  const T r = rstd[i];
  T dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += gr[c] * w[c] * xr[c];
  dot = block_sum(dot, red);
  const T k = dot * r * r * r / T(C);
  T* d = dx + i * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += gr[c] * w[c] * r - xr[c] * k;
}

// The f32/f64 weight gradient, two passes like the bf16 one below (one
// thread per column over all N rows ran 16 ms for 65536 x 4096 f32 on an H200,
// 6% of copy bandwidth: C / 128 blocks of serial loops). Pass 1: block
// (cx, rb) sums g*x*r over rows [rb*rows, (rb+1)*rows), in order; one row
// block adds to dw directly. Pass 2: rmsnorm_dw_finish_kernel.
template <class T>
__global__ void rmsnorm_bwd_dw_partial_kernel(T* __restrict__ part, T* __restrict__ dw,
                                              const T* __restrict__ g, const T* __restrict__ x,
                                              const T* __restrict__ rstd, int64_t N, int64_t C,
                                              int64_t rows) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t i0 = int64_t(blockIdx.y) * rows;
  const int64_t i1 = i0 + rows < N ? i0 + rows : N;
  T acc = 0;
  for (int64_t i = i0; i < i1; ++i) acc += g[i * C + c] * x[i * C + c] * rstd[i];
  if (dw)
    dw[c] += acc;
  else
    part[int64_t(blockIdx.y) * C + c] = acc;
}

// ---- bf16 ----

// One block per row: (kRes: x += y, rounded to bf16 and stored) ss = sum x^2;
// rstd = rmsnorm_rstd; out = rmsnorm_out(x, rstd, w).
template <int W, bool kRes>
__global__ void __launch_bounds__(256)
    rmsnorm_fwd_bf16_kernel(bf16_bits* __restrict__ out, float* __restrict__ rstd,
                            bf16_bits* __restrict__ x, const bf16_bits* __restrict__ y,
                            const bf16_bits* __restrict__ w, int64_t C, float eps) {
  __shared__ float red[32];
  const int64_t i = blockIdx.x;
  bf16_bits* xr = x + i * C;
  const int64_t step = int64_t(blockDim.x) * W;
  float ss = 0.f;
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += step) {
    float a[W];
    ldv<W>(xr + c, a);
    if constexpr (kRes) {
      float b[W];
      ldv<W>(y + i * C + c, b);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = round_bf(a[k] + b[k]);
      stv<W>(xr + c, a);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) ss += a[k] * a[k];
  }
  ss = block_sum(ss, red);
  const float r = math::rmsnorm_rstd(ss, float(C), eps);
  if (threadIdx.x == 0) rstd[i] = r;
  bf16_bits* o = out + i * C;
  // Same column mapping as above: in the residual form each thread re-reads
  // the x it wrote itself.
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += step) {
    float a[W], wv[W];
    ldv<W>(xr + c, a);
    ldv<W>(w + c, wv);
#pragma unroll
    for (int k = 0; k < W; ++k) a[k] = math::rmsnorm_out(a[k], r, wv[k]);
    stv<W>(o + c, a);
  }
}

// dx(row) += rmsnorm_dx(dy, w, x, rstd, k), k = rmsnorm_k(sum dy*w*x, rstd, C).
template <int W>
__global__ void __launch_bounds__(256)
    rmsnorm_bwd_dx_bf16_kernel(bf16_bits* __restrict__ dx, const bf16_bits* __restrict__ g,
                               const bf16_bits* __restrict__ x, const bf16_bits* __restrict__ w,
                               const float* __restrict__ rstd, int64_t C) {
  __shared__ float red[32];
  const int64_t i = blockIdx.x;
  const bf16_bits* xr = x + i * C;
  const bf16_bits* gr = g + i * C;
  const float r = rstd[i];
  const int64_t step = int64_t(blockDim.x) * W;
  float dot = 0.f;
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += step) {
    float a[W], b[W], wv[W];
    ldv<W>(gr + c, a);
    ldv<W>(xr + c, b);
    ldv<W>(w + c, wv);
#pragma unroll
    for (int k = 0; k < W; ++k) dot += a[k] * wv[k] * b[k];
  }
  dot = block_sum(dot, red);
  const float kk = math::rmsnorm_k(dot, r, float(C));
  bf16_bits* d = dx + i * C;
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += step) {
    float a[W], b[W], wv[W], o[W];
    ldv<W>(gr + c, a);
    ldv<W>(xr + c, b);
    ldv<W>(w + c, wv);
    ldv<W>(d + c, o);
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] += math::rmsnorm_dx(a[k], wv[k], b[k], r, kk);
    stv<W>(d + c, o);
  }
}

constexpr int kDwThreads = 128;
constexpr int64_t kDwRows = 128;  // rows per partial sum (raised only past 65535 row blocks)

// Pass 1: block (cx, rb) sums rows [rb*rows, (rb+1)*rows) of dy*x*rstd for W
// columns per thread, rows in order. One row block: added to dw directly.
template <int W>
__global__ void __launch_bounds__(kDwThreads)
    rmsnorm_dw_partial_kernel(float* __restrict__ part, float* __restrict__ dw,
                              const bf16_bits* __restrict__ g, const bf16_bits* __restrict__ x,
                              const float* __restrict__ rstd, int64_t N, int64_t C,
                              int64_t rows) {
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W;
  if (c >= C) return;
  const int64_t i0 = int64_t(blockIdx.y) * rows;
  const int64_t i1 = i0 + rows < N ? i0 + rows : N;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.f;
  for (int64_t i = i0; i < i1; ++i) {
    float a[W], b[W];
    ldv<W>(g + i * C + c, a);
    ldv<W>(x + i * C + c, b);
    const float r = rstd[i];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += math::rmsnorm_dw(a[k], b[k], r);
  }
  if (dw) {
#pragma unroll
    for (int k = 0; k < W; ++k) dw[c + k] += acc[k];
  } else {
    stv<W>(part + int64_t(blockIdx.y) * C + c, acc);
  }
}

// Pass 2: dw[c] += sum over row blocks, in order, of the partials (T: the
// f32 partials of bf16 and f32, or f64).
template <class T>
__global__ void __launch_bounds__(kDwThreads)
    rmsnorm_dw_finish_kernel(T* __restrict__ dw, const T* __restrict__ part, int64_t nrb,
                             int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  T s = 0;
  for (int64_t rb = 0; rb < nrb; ++rb) s += part[rb * C + c];
  dw[c] += s;
}

// The weight gradient's two passes, every dtype: row blocks of kDwRows (more
// only when the grid's y limit needs it); pass1(grid, part, direct, rows)
// launches pass 1 (W columns per thread) into the partials `part`, or, with
// one row block, adds to dw directly; pass 2 adds the partials (A: f32 for
// bf16 and f32, f64) to dw in row-block order.
template <class A, class Pass1>
void dw_two_pass(const OpCtx& c, A* dw, int64_t N, int64_t C, int W, Pass1&& pass1) {
  const int64_t rows = std::max<int64_t>(kDwRows, (N + 65534) / 65535);
  const int64_t nrb = (N + rows - 1) / rows;
  const int64_t per_block = int64_t(kDwThreads) * W;
  ADGT_CHECK((C + per_block - 1) / per_block <= INT_MAX,
             "rmsnorm_backward: C = " << C << " too large");
  const dim3 grid(unsigned((C + per_block - 1) / per_block), unsigned(nrb));
  A* part = nrb > 1 ? static_cast<A*>(c.scratch(CudaBackend::kScratchReduce,
                                                size_t(nrb * C) * sizeof(A)))
                    : nullptr;
  pass1(grid, part, nrb > 1 ? nullptr : dw, rows);
  if (nrb > 1)
    launch("rmsnorm_backward (dw pass 2)", rmsnorm_dw_finish_kernel<A>,
           unsigned((C + kDwThreads - 1) / kDwThreads), kDwThreads, 0, c.stream, dw, part, nrb, C);
}

// The bf16 forward, plain (y empty) or with the residual add.
void residual_rmsnorm_bf16(const OpCtx& c, Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                           const Tensor& w, double eps, const char* op) {
  const int64_t C = w.numel(), N = x.numel() / C;
  ADGT_CHECK(w.dtype == DType::BF16 && out.dtype == DType::BF16 && rstd.dtype == DType::F32,
             op << ": bf16 x needs bf16 w, out and f32 rstd; got w " << dtype_name(w.dtype)
                << ", out " << dtype_name(out.dtype) << ", rstd " << dtype_name(rstd.dtype));
  if (!N) return;
  const bool res = y.data != nullptr;
  const bool vec = C % 8 == 0 && aligned16(x.data) && aligned16(out.data) && aligned16(w.data) &&
                   (!res || aligned16(y.data));
  auto* o = out.ptr<bf16_bits>();
  auto* xp = x.ptr<bf16_bits>();
  const auto* yp = res ? y.ptr<bf16_bits>() : nullptr;
  const auto* wp = w.ptr<bf16_bits>();
  auto* r = rstd.ptr<float>();
  const unsigned grid = rows_grid(N, op);
  auto kernel = vec ? (res ? rmsnorm_fwd_bf16_kernel<8, true> : rmsnorm_fwd_bf16_kernel<8, false>)
                    : (res ? rmsnorm_fwd_bf16_kernel<1, true> : rmsnorm_fwd_bf16_kernel<1, false>);
  launch(op, kernel, grid, kThreads, 0, c.stream, o, r, xp, yp, wp, C, float(eps));
}


void rmsnorm_forward(const OpCtx& c, Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                  double eps) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(C > 0 && x.numel() == N * C && out.numel() == x.numel() && rstd.numel() == N,
             "rmsnorm_forward: x" << x.shape_str() << " w" << w.shape_str() << " rstd"
                                  << rstd.shape_str());
  if (x.dtype == DType::BF16) {
    residual_rmsnorm_bf16(c, x, Tensor(), out, rstd, w, eps, "rmsnorm_forward");
    return;
  }
  ADGT_CHECK(x.dtype == w.dtype && out.dtype == x.dtype && rstd.dtype == x.dtype,
             "rmsnorm_forward: dtype mismatch");
  if (!N) return;
  dispatch(x.dtype, "rmsnorm_forward", [&](auto z) {
    using T = decltype(z);
    launch("rmsnorm_forward", rmsnorm_fwd_kernel<T>, rows_grid(N, "rmsnorm_forward"), kThreads, 0,
           c.stream, out.ptr<T>(), rstd.ptr<T>(), x.ptr<T>(), w.ptr<T>(), C, T(eps));
  });
}

void rmsnorm_backward(const OpCtx& c, Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                   const Tensor& w, const Tensor& rstd) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(C > 0 && dx.numel() == N * C && dout.numel() == N * C && dw.numel() == C &&
                 rstd.numel() == N,
             "rmsnorm_backward: shapes dx" << dx.shape_str() << " dout" << dout.shape_str());
  if (!N) return;
  if (x.dtype == DType::BF16) {
    const char* op = "rmsnorm_backward";
    ADGT_CHECK(w.dtype == DType::BF16 && dout.dtype == DType::BF16 && dx.dtype == DType::BF16 &&
                   rstd.dtype == DType::F32 && dw.dtype == DType::F32,
               op << ": bf16 x needs bf16 w, dout, dx and f32 rstd, dw; got w "
                  << dtype_name(w.dtype) << ", dout " << dtype_name(dout.dtype) << ", dx "
                  << dtype_name(dx.dtype) << ", rstd " << dtype_name(rstd.dtype) << ", dw "
                  << dtype_name(dw.dtype));
    const auto* g = dout.ptr<bf16_bits>();
    const auto* xp = x.ptr<bf16_bits>();
    const bool vec = C % 8 == 0 && aligned16(dx.data) && aligned16(g) && aligned16(xp) &&
                     aligned16(w.data);
    launch("rmsnorm_backward (dx)",
           vec ? rmsnorm_bwd_dx_bf16_kernel<8> : rmsnorm_bwd_dx_bf16_kernel<1>, rows_grid(N, op),
           kThreads, 0, c.stream, dx.ptr<bf16_bits>(), g, xp, w.ptr<bf16_bits>(),
           rstd.ptr<float>(), C);
    dw_two_pass(c, dw.ptr<float>(), N, C, vec ? 8 : 1,
                [&](dim3 grid, float* part, float* direct, int64_t rows) {
                  launch("rmsnorm_backward (dw pass 1)",
                         vec ? rmsnorm_dw_partial_kernel<8> : rmsnorm_dw_partial_kernel<1>, grid,
                         kDwThreads, 0, c.stream, part, direct, g, xp, rstd.ptr<float>(), N, C,
                         rows);
                });
    return;
  }
  dispatch(x.dtype, "rmsnorm_backward", [&](auto z) {
    using T = decltype(z);
    launch("rmsnorm_backward (dx)", rmsnorm_bwd_dx_kernel<T>, rows_grid(N, "rmsnorm_backward"),
           kThreads, 0, c.stream, dx.ptr<T>(), dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(),
           rstd.ptr<T>(), C);
    dw_two_pass(c, dw.ptr<T>(), N, C, 1, [&](dim3 grid, T* part, T* direct, int64_t rows) {
      launch("rmsnorm_backward (dw pass 1)", rmsnorm_bwd_dw_partial_kernel<T>, grid, kDwThreads,
             0, c.stream, part, direct, dout.ptr<T>(), x.ptr<T>(), rstd.ptr<T>(), N, C, rows);
    });
  });
}

// bf16 only (the f32/f64 form is add_inplace then rmsnorm_forward).
void residual_rmsnorm_forward(const OpCtx& c, Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                              const Tensor& w, double eps) {
  expect_same(x, y, "residual_rmsnorm_forward");
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(C > 0 && x.numel() == N * C && out.numel() == x.numel() && rstd.numel() == N,
             "residual_rmsnorm_forward: x" << x.shape_str() << " w" << w.shape_str() << " rstd"
                                           << rstd.shape_str());
  residual_rmsnorm_bf16(c, x, y, out, rstd, w, eps, "residual_rmsnorm_forward");
}

}  // namespace
}  // namespace adgt::cuda
