// CUDA fused classifier kernels and the ops that launch them: softmax
// cross-entropy and its gradient, one block per row, and the vocab-parallel
// pieces (partial stats, combine, finish). Semantics: kernels/cpu/loss.cpp.
//
// bf16 logits (f32 losses and stats): one read pass per row computes (max,
// sum) with the online-softmax merge (kernels/common/row_math.hpp), then one
// pass writes the gradient in place in bf16 through the shared
// cross_entropy_grad formula. Rows are walked as an unaligned head, 16-byte
// vectors of 8, and a tail, so any V and any row start vectorise.
//
// Target range (target < V): checked on the device for every dtype; a bad row
// gets loss NaN and gradient 0, and the error (row, target, V) is written to
// the backend's mapped error words (OpCtx::err_dev), thrown at the next host
// synchronisation (the losses' read-back): no host copy of the targets, no
// synchronisation.
//
// loss.cu (the CUDA backend's methods) and the host emulation's test
// (tests/kernel_sim/classifier_sim_test.cpp) include this header.
#pragma once
#include "kernels/common/row_math.hpp"
#include "kernels/cuda/cuda_common.cuh"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 512;

// A target >= V: record it for the host (one bad row's row and target together
// in one 64-bit store: with several bad rows, whichever block stores last),
// loss NaN.
__device__ void report_bad_target(int64_t* err, int64_t row, int64_t tg, int64_t V) {
  err[1] = (row << 32) | int64_t(uint32_t(tg));
  err[2] = V;
  __threadfence_system();
  err[0] = 1;
}

template <class T>
__global__ void cross_entropy_kernel(T* __restrict__ logits, T* __restrict__ losses,
                                     const int32_t* __restrict__ targets, int64_t V, T gs,
                                     int64_t* err) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  T* row = logits + i * V;
  const int64_t tg = targets[i];
  if (tg < 0 || tg >= V) {
    if (threadIdx.x == 0) {
      losses[i] = tg < 0 ? T(0) : T(NAN);
      if (tg >= V) report_bad_target(err, i, tg, V);
    }
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) row[j] = T(0);
    return;
  }
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
  mx = block_max(mx, red);
  const T zt = row[tg] - mx;  // read before the row is overwritten
  __syncthreads();
  T sum = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const T e = dexp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  if (threadIdx.x == 0) losses[i] = dlog(sum) - zt;
  const T inv = gs / sum;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) row[j] *= inv;
  __syncthreads();
  if (threadIdx.x == 0) row[tg] -= gs;
}

template <class T>
__global__ void ce_stats_kernel(T* __restrict__ stats, const T* __restrict__ logits,
                                const int32_t* __restrict__ targets, int64_t Vl, int64_t valid,
                                int64_t vocab_start) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * Vl;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
  mx = block_max(mx, red);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += dexp(row[j] - mx);
  sum = block_sum(sum, red);
  if (threadIdx.x == 0) {
    const int64_t tg = targets[i], t = tg - vocab_start;
    stats[3 * i] = mx;
    stats[3 * i + 1] = sum;
    stats[3 * i + 2] = (tg >= 0 && t >= 0 && t < valid) ? row[t] : T(0);
  }
}

// One thread per row; ranks in order (gathered is (R, N, 3)).
template <class T>
__global__ void ce_combine_kernel(T* __restrict__ c, const T* __restrict__ g, int64_t N,
                                  int64_t R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  T M = g[3 * i];
  for (int64_t r = 1; r < R; ++r) {
    const T m = g[(r * N + i) * 3];
    M = m > M ? m : M;
  }
  T S = 0, tl = 0;
  for (int64_t r = 0; r < R; ++r) {
    const T* s = g + (r * N + i) * 3;
    S += s[1] * dexp(s[0] - M);
    tl += s[2];
  }
  c[3 * i] = M;
  c[3 * i + 1] = S;
  c[3 * i + 2] = tl;
}

template <class T>
__global__ void ce_finish_kernel(T* __restrict__ logits, T* __restrict__ losses,
                                 const T* __restrict__ c, const int32_t* __restrict__ targets,
                                 int64_t Vl, int64_t valid, int64_t vocab_start, T gs) {
  const int64_t i = blockIdx.x;
  T* row = logits + i * Vl;
  const int64_t tg = targets[i];
  if (tg < 0) {
    if (threadIdx.x == 0) losses[i] = T(0);
    for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) row[j] = T(0);
    return;
  }
  const T M = c[3 * i], S = c[3 * i + 1];
  if (threadIdx.x == 0) losses[i] = dlog(S) + M - c[3 * i + 2];
  const T inv = gs / S;
  for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x)
    row[j] = j < valid ? dexp(row[j] - M) * inv : T(0);
  __syncthreads();
  const int64_t t = tg - vocab_start;
  if (threadIdx.x == 0 && t >= 0 && t < valid) row[t] -= gs;
}

// ---- bf16 ----

// A row of n bf16 split into an unaligned head (< 8 elements), nvec 16-byte
// vectors, and a tail (< 8): the scalar elements are j = s < head ? s :
// tail0 + s - head for s < nscalar.
struct RowSplit {
  int64_t head, nvec, tail0, nscalar;
  __device__ RowSplit(const bf16_bits* row, int64_t n) {
    const int64_t mis = int64_t((reinterpret_cast<uintptr_t>(row) & 15u) >> 1);
    head = mis ? 8 - mis : 0;
    if (head > n) head = n;
    nvec = (n - head) / 8;
    tail0 = head + nvec * 8;
    nscalar = head + (n - tail0);
  }
  __device__ int64_t scalar_index(int64_t s) const { return s < head ? s : tail0 + s - head; }
};

// Online (max, sum of exp(x - max)) of this thread's share of row[0, n).
__device__ __forceinline__ void row_stats(const bf16_bits* row, const RowSplit& sp, float& m,
                                          float& s) {
  m = -INFINITY;
  s = 0.f;
  for (int64_t v = threadIdx.x; v < sp.nvec; v += blockDim.x) {
    float x[8];
    ldv<8>(row + sp.head + v * 8, x);
    float m8 = x[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) m8 = fmaxf(m8, x[k]);
    float s8 = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s8 += expf(x[k] - m8);
    math::softmax_merge(m, s, m8, s8);
  }
  if (threadIdx.x < sp.nscalar) math::softmax_merge(m, s, bf(row[sp.scalar_index(threadIdx.x)]), 1.f);
}

// (m, s) merged over the block in a fixed order (deterministic), broadcast.
// Parts with s == 0 (threads that saw no element) are skipped.
__device__ __forceinline__ void merge_part(float& m, float& s, float m2, float s2) {
  if (s2 > 0.f) {
    if (s > 0.f)
      math::softmax_merge(m, s, m2, s2);
    else
      m = m2, s = s2;
  }
}
__device__ void block_softmax_stats(float& m, float& s, float* red_m, float* red_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, o);
    const float s2 = __shfl_down_sync(0xffffffffu, s, o);
    merge_part(m, s, m2, s2);
  }
  if (lane == 0) red_m[warp] = m, red_s[warp] = s;
  __syncthreads();
  if (warp == 0) {
    m = lane < nw ? red_m[lane] : -INFINITY;
    s = lane < nw ? red_s[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_down_sync(0xffffffffu, m, o);
      const float s2 = __shfl_down_sync(0xffffffffu, s, o);
      merge_part(m, s, m2, s2);
    }
    if (lane == 0) red_m[0] = m, red_s[0] = s;
  }
  __syncthreads();
  m = red_m[0];
  s = red_s[0];
  __syncthreads();
}

// The gradient of column j (x its logit): row_math's two-rounding formula.
__device__ __forceinline__ float ce_grad(float x, int64_t j, int64_t valid, int64_t tgt, float M,
                                        float gs_over_S, float gs) {
  if (j >= valid) return 0.f;
  const float g = math::cross_entropy_grad(expf(x - M), gs_over_S);
  return j == tgt ? math::cross_entropy_target_grad(g, gs) : g;
}

// row[0, n) = gradient for j < valid (tgt: the target's column, or -1), 0 beyond valid.
__device__ __forceinline__ void row_grad(bf16_bits* row, const RowSplit& sp, int64_t valid,
                                         int64_t tgt, float M, float gs_over_S, float gs) {
  for (int64_t v = threadIdx.x; v < sp.nvec; v += blockDim.x) {
    const int64_t j0 = sp.head + v * 8;
    float x[8];
    ldv<8>(row + j0, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = ce_grad(x[k], j0 + k, valid, tgt, M, gs_over_S, gs);
    stv<8>(row + j0, x);
  }
  if (threadIdx.x < sp.nscalar) {
    const int64_t j = sp.scalar_index(threadIdx.x);
    row[j] = to_bf(ce_grad(bf(row[j]), j, valid, tgt, M, gs_over_S, gs));
  }
}

__device__ __forceinline__ void row_zero(bf16_bits* row, const RowSplit& sp) {
  const float z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t v = threadIdx.x; v < sp.nvec; v += blockDim.x) stv<8>(row + sp.head + v * 8, z);
  if (threadIdx.x < sp.nscalar) row[sp.scalar_index(threadIdx.x)] = 0;
}

__global__ void __launch_bounds__(kThreads)
    cross_entropy_bf16_kernel(bf16_bits* __restrict__ logits, float* __restrict__ losses,
                              const int32_t* __restrict__ targets, int64_t V, float gs,
                              int64_t* err) {
  __shared__ float red_m[32], red_s[32];
  const int64_t i = blockIdx.x;
  bf16_bits* row = logits + i * V;
  const RowSplit sp(row, V);
  const int64_t tg = targets[i];
  if (tg < 0 || tg >= V) {
    if (threadIdx.x == 0) {
      losses[i] = tg < 0 ? 0.f : NAN;
      if (tg >= V) report_bad_target(err, i, tg, V);
    }
    row_zero(row, sp);
    return;
  }
  const float xt = bf(row[tg]);  // read before the row is overwritten (barriers below)
  float m, s;
  row_stats(row, sp, m, s);
  block_softmax_stats(m, s, red_m, red_s);
  if (threadIdx.x == 0) losses[i] = math::cross_entropy_loss(m, s, xt);
  row_grad(row, sp, V, tg, m, gs / s, gs);
}

// stats(i) = [max, sum exp(x - max), target logit if in this shard] over [0, valid).
__global__ void __launch_bounds__(kThreads)
    ce_stats_bf16_kernel(float* __restrict__ stats, const bf16_bits* __restrict__ logits,
                         const int32_t* __restrict__ targets, int64_t Vl, int64_t valid,
                         int64_t vocab_start) {
  __shared__ float red_m[32], red_s[32];
  const int64_t i = blockIdx.x;
  const bf16_bits* row = logits + i * Vl;
  const RowSplit sp(row, valid);
  float m, s;
  row_stats(row, sp, m, s);
  block_softmax_stats(m, s, red_m, red_s);
  if (threadIdx.x == 0) {
    const int64_t tg = targets[i], t = tg - vocab_start;
    stats[3 * i] = m;
    stats[3 * i + 1] = s;
    stats[3 * i + 2] = (tg >= 0 && t >= 0 && t < valid) ? bf(row[t]) : 0.f;
  }
}

__global__ void __launch_bounds__(kThreads)
    ce_finish_bf16_kernel(bf16_bits* __restrict__ logits, float* __restrict__ losses,
                          const float* __restrict__ c, const int32_t* __restrict__ targets,
                          int64_t Vl, int64_t valid, int64_t vocab_start, float gs) {
  const int64_t i = blockIdx.x;
  bf16_bits* row = logits + i * Vl;
  const RowSplit sp(row, Vl);
  const int64_t tg = targets[i];
  if (tg < 0) {
    if (threadIdx.x == 0) losses[i] = 0.f;
    row_zero(row, sp);
    return;
  }
  const float M = c[3 * i], S = c[3 * i + 1];
  if (threadIdx.x == 0) losses[i] = math::cross_entropy_loss(M, S, c[3 * i + 2]);
  const int64_t t = tg - vocab_start;
  row_grad(row, sp, valid, t >= 0 && t < valid ? t : -1, M, gs / S, gs);
}

// ---- the ops ----

void cross_entropy(const OpCtx& c, Tensor logits, Tensor losses, const Tensor& targets,
                   double grad_scale) {
  const char* op = "cross_entropy";
  const int64_t N = targets.numel(), V = N ? logits.numel() / N : 0;
  const bool lowp = logits.dtype == DType::BF16;
  ADGT_CHECK(N > 0 && logits.numel() == N * V && losses.numel() == N &&
                 targets.dtype == DType::I32 &&
                 (lowp ? losses.dtype == DType::F32 : losses.dtype == logits.dtype),
             "cross_entropy: logits" << logits.shape_str() << " " << dtype_name(logits.dtype)
                                     << ", losses " << dtype_name(losses.dtype) << ", targets"
                                     << targets.shape_str()
                                     << " (bf16 logits take f32 losses)");
  ADGT_CHECK(V <= INT32_MAX && N <= INT32_MAX, op << ": logits" << logits.shape_str()
                                                  << " exceed 32-bit rows or columns");
  // The target range check is on the device (see the top of the file).
  if (lowp) {
    launch(op, cross_entropy_bf16_kernel, rows_grid(N, op), kThreads, 0, c.stream,
           logits.ptr<bf16_bits>(), losses.ptr<float>(), targets.ptr<int32_t>(), V,
           float(grad_scale), c.err_dev);
    return;
  }
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, cross_entropy_kernel<T>, rows_grid(N, op), kThreads, 0, c.stream,
           logits.ptr<T>(), losses.ptr<T>(), targets.ptr<int32_t>(), V, T(grad_scale),
           c.err_dev);
  });
}

void ce_partial_stats(const OpCtx& c, Tensor stats, const Tensor& logits, const Tensor& targets,
                      int64_t vocab_start, int64_t valid) {
  const char* op = "ce_partial_stats";
  const int64_t N = targets.numel(), Vl = N ? logits.numel() / N : 0;
  const bool lowp = logits.dtype == DType::BF16;
  ADGT_CHECK(N > 0 && logits.numel() == N * Vl && stats.numel() == 3 * N && valid > 0 &&
                 valid <= Vl &&
                 (lowp ? stats.dtype == DType::F32 : stats.dtype == logits.dtype) &&
                 targets.dtype == DType::I32,
             "ce_partial_stats: logits" << logits.shape_str() << " " << dtype_name(logits.dtype)
                                        << ", stats" << stats.shape_str() << " "
                                        << dtype_name(stats.dtype) << ", valid " << valid
                                        << " (bf16 logits take f32 stats)");
  if (lowp) {
    launch(op, ce_stats_bf16_kernel, rows_grid(N, op), kThreads, 0, c.stream, stats.ptr<float>(),
           logits.ptr<bf16_bits>(), targets.ptr<int32_t>(), Vl, valid, vocab_start);
    return;
  }
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, ce_stats_kernel<T>, rows_grid(N, op), kThreads, 0, c.stream, stats.ptr<T>(),
           logits.ptr<T>(), targets.ptr<int32_t>(), Vl, valid, vocab_start);
  });
}

void ce_combine(const OpCtx& c, Tensor combined, const Tensor& gathered) {
  const char* op = "ce_combine";
  const int64_t N = combined.numel() / 3, R = N ? gathered.numel() / (3 * N) : 0;
  ADGT_CHECK(N > 0 && combined.numel() == 3 * N && gathered.numel() == R * 3 * N && R > 0 &&
                 gathered.dtype == combined.dtype,
             "ce_combine: combined" << combined.shape_str() << " gathered"
                                    << gathered.shape_str());
  dispatch(combined.dtype, op, [&](auto z) {
    using T = decltype(z);
    const int threads = 256;
    launch(op, ce_combine_kernel<T>, unsigned((N + threads - 1) / threads), threads, 0, c.stream,
           combined.ptr<T>(), gathered.ptr<T>(), N, R);
  });
}

void ce_finish(const OpCtx& c, Tensor logits, Tensor losses, const Tensor& combined,
               const Tensor& targets, int64_t vocab_start, int64_t valid, double grad_scale) {
  const char* op = "ce_finish";
  const int64_t N = targets.numel(), Vl = N ? logits.numel() / N : 0;
  ADGT_CHECK(N > 0 && losses.numel() == N && combined.numel() == 3 * N &&
                 logits.numel() == N * Vl && valid > 0 && valid <= Vl &&
                 targets.dtype == DType::I32,
             "ce_finish: losses" << losses.shape_str() << " combined" << combined.shape_str()
                                 << " logits" << logits.shape_str() << " targets "
                                 << dtype_name(targets.dtype) << " valid " << valid);
  // losses and combined: f32 for bf16 logits, else the logits' dtype (the
  // kernels read them as such).
  const DType sd = logits.dtype == DType::BF16 ? DType::F32 : logits.dtype;
  ADGT_CHECK(losses.dtype == sd && combined.dtype == sd,
             op << ": " << dtype_name(logits.dtype) << " logits take " << dtype_name(sd)
                << " losses and combined stats, got " << dtype_name(losses.dtype) << " and "
                << dtype_name(combined.dtype));
  if (logits.dtype == DType::BF16) {
    launch(op, ce_finish_bf16_kernel, rows_grid(N, op), kThreads, 0, c.stream,
           logits.ptr<bf16_bits>(), losses.ptr<float>(), combined.ptr<float>(),
           targets.ptr<int32_t>(), Vl, valid, vocab_start, float(grad_scale));
    return;
  }
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, ce_finish_kernel<T>, rows_grid(N, op), kThreads, 0, c.stream, logits.ptr<T>(),
           losses.ptr<T>(), combined.ptr<T>(), targets.ptr<int32_t>(), Vl, valid, vocab_start,
           T(grad_scale));
  });
}

}  // namespace
}  // namespace adgt::cuda
