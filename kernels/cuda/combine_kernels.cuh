// CUDA mixture-of-experts combine (combine_rows) and its backward: the
// kernels and the ops that launch them. One block per token row t, threads
// over columns; out[t] sums its k rows of y in ascending j, as the CPU
// backend does (kernels/cpu/embedding.cpp). bf16 rows are combined in fp32
// (CombineMath), each output rounded once; dw is fp32 with bf16 rows.
//
// combine.cu (the CUDA backend's methods) and
// the host emulation's test (tests/kernel_sim/combine_sim_test.cpp) include
// this header.
#pragma once
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_checks.hpp"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 256;

// Storage S, math A: bf16 rows are combined in fp32 (each output rounded
// once, backend.hpp's mixed-precision rules), f32/f64 in their own type.
template <class S> struct CombineMath { using A = S; };
template <> struct CombineMath<bf16_bits> { using A = float; };
__device__ __forceinline__ float load_a(bf16_bits v) { return bf(v); }
__device__ __forceinline__ float load_a(float v) { return v; }
__device__ __forceinline__ double load_a(double v) { return v; }
__device__ __forceinline__ void store_a(bf16_bits* p, float v) { *p = to_bf(v); }
__device__ __forceinline__ void store_a(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_a(double* p, double v) { *p = v; }

// A row index past y's M rows (kind 3: [slot, pos, M]); the slot is skipped.
__device__ void report_bad_pos(int64_t* err, int64_t i, int64_t r, int64_t M) {
  err[1] = i;
  err[2] = r;
  err[3] = M;
  __threadfence_system();
  err[0] = 3;
}

// out[t] (=|+=) sum_j w[t,j] y[pos[t,j]] over 0 <= pos < M, j ascending.
template <class S>
__global__ void combine_kernel(S* __restrict__ out, const S* __restrict__ y,
                               const int32_t* __restrict__ pos, const S* __restrict__ w, int64_t k,
                               int64_t C, bool accumulate, int64_t M, int64_t* err) {
  using A = typename CombineMath<S>::A;
  const int64_t t = blockIdx.x;
  S* o = out + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    A acc = accumulate ? load_a(o[c]) : A(0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = pos[t * k + j];
      if (r < 0) continue;
      if (r >= M) {
        if (c == threadIdx.x) report_bad_pos(err, t * k + j, r, M);
        continue;
      }
      const A wt = w ? load_a(w[t * k + j]) : A(1);
      acc += wt * load_a(y[r * C + c]);
    }
    store_a(o + c, acc);
  }
}

// One block per token row t: dw[t,j] = <dout[t], y[pos]> (in A: fp32 for bf16
// rows), dy[pos] = w dout[t].
template <class S>
__global__ void combine_bwd_kernel(S* __restrict__ dy, typename CombineMath<S>::A* __restrict__ dw,
                                   const S* __restrict__ dout, const S* __restrict__ y,
                                   const int32_t* __restrict__ pos, const S* __restrict__ w,
                                   int64_t k, int64_t C, int64_t M, int64_t* err) {
  using A = typename CombineMath<S>::A;
  __shared__ A red[32];
  const int64_t t = blockIdx.x;
  const S* g = dout + t * C;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = pos[t * k + j];  // uniform over the block
    if (r >= M) {
      if (threadIdx.x == 0) report_bad_pos(err, t * k + j, r, M);
    }
    if (r < 0 || r >= M) {
      if (dw && threadIdx.x == 0) dw[t * k + j] = A(0);
      continue;
    }
    if (dw) {
      const S* yr = y + r * C;
      A s = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += load_a(g[c]) * load_a(yr[c]);
      s = block_sum(s, red);
      if (threadIdx.x == 0) dw[t * k + j] = s;
    }
    if (dy) {
      const A wt = w ? load_a(w[t * k + j]) : A(1);
      S* dr = dy + r * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_a(dr + c, wt * load_a(g[c]));
    }
  }
}

// ---- the ops ----

// The CPU backend's shape and dtype checks (kernels/op_checks.hpp). pos < M
// is checked on the device (pos is made there, by moe_dispatch_plan): a row
// past y is skipped and written to the error words (kind 3), thrown at the
// next host synchronisation; no host copy of pos, no synchronisation.
void check_combine(const OpCtx& c, const Tensor& rows_nc, const Tensor& y, const Tensor& pos,
                   const Tensor& w, const char* op) {
  (void)c;
  check_combine_shapes(rows_nc, y, pos, w, op);
}

// Calls f(S{}) for the storage type of y: bf16, f32 or f64.
template <class F>
void dispatch_combine(DType dt, const char* op, F&& f) {
  if (dt == DType::BF16)
    f(bf16_bits{});
  else
    dispatch(dt, op, f);
}

void combine_rows(const OpCtx& c, Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                  bool accumulate) {
  const char* op = "combine_rows";
  check_combine(c, out, y, pos, w, op);
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || !C) return;
  dispatch_combine(y.dtype, op, [&](auto z) {
    using S = decltype(z);
    launch(op, combine_kernel<S>, rows_grid(N, op), kThreads, 0, c.stream, out.ptr<S>(),
           y.ptr<S>(), pos.ptr<int32_t>(), w.data ? w.ptr<S>() : nullptr, k, C, accumulate,
           y.dim(0), c.err_dev);
  });
}

void combine_rows_backward(const OpCtx& c, Tensor dy, Tensor dw, const Tensor& dout,
                           const Tensor& y, const Tensor& pos, const Tensor& w) {
  const char* op = "combine_rows_backward";
  check_combine(c, dout, y, pos, w, op);
  ADGT_CHECK(!dy.data || (dy.numel() == y.numel() && dy.dtype == y.dtype),
             op << ": dy" << dy.shape_str() << " must match y" << y.shape_str());
  const DType dwt = y.dtype == DType::BF16 ? DType::F32 : y.dtype;  // fp32 with bf16 rows
  ADGT_CHECK(!dw.data || (dw.numel() == pos.numel() && dw.dtype == dwt),
             op << ": dw" << dw.shape_str() << " " << dtype_name(dw.dtype) << " must match pos"
                << pos.shape_str() << " in " << dtype_name(dwt) << " (f32 with bf16 rows)");
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || (!dy.data && !dw.data)) return;
  dispatch_combine(y.dtype, op, [&](auto z) {
    using S = decltype(z);
    using A = typename CombineMath<S>::A;
    launch(op, combine_bwd_kernel<S>, rows_grid(N, op), kThreads, 0, c.stream,
           dy.data ? dy.ptr<S>() : nullptr, dw.data ? dw.ptr<A>() : nullptr, dout.ptr<S>(),
           y.ptr<S>(), pos.ptr<int32_t>(), w.data ? w.ptr<S>() : nullptr, k, C, y.dim(0),
           c.err_dev);
  });
}

}  // namespace
}  // namespace adgt::cuda
