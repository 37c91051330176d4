// CUDA fused classifier: softmax cross-entropy and its gradient, one block per
// row, and the vocab-parallel pieces (partial stats, combine, finish).
// Semantics: kernels/cpu/loss.cpp.
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

constexpr int kThreads = 512;

template <class T>
__global__ void cross_entropy_kernel(T* __restrict__ logits, T* __restrict__ losses,
                                     const int32_t* __restrict__ targets, int64_t V, T gs) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  T* row = logits + i * V;
  const int64_t tg = targets[i];
  if (tg < 0) {
    if (threadIdx.x == 0) losses[i] = T(0);
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

}  // namespace

void CudaBackend::cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                                double grad_scale) {
  const char* op = "cross_entropy";
  const int64_t N = targets.numel(), V = N ? logits.numel() / N : 0;
  ADGT_CHECK(N > 0 && logits.numel() == N * V && losses.numel() == N &&
                 targets.dtype == DType::I32 && losses.dtype == logits.dtype,
             "cross_entropy: logits" << logits.shape_str() << " targets" << targets.shape_str());
  // The CPU backend's range check, on a host copy of the targets.
  {
    std::vector<int32_t> tg(static_cast<size_t>(N));
    to_host(tg.data(), targets.data, size_t(N) * 4);
    for (int64_t i = 0; i < N; ++i)
      ADGT_CHECK(tg[size_t(i)] < V, "cross_entropy: target " << tg[size_t(i)] << " at row " << i
                                                            << " outside the vocabulary [0," << V
                                                            << ")");
  }
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    cross_entropy_kernel<T><<<rows_grid(N, op), kThreads, 0, stream_>>>(
        logits.ptr<T>(), losses.ptr<T>(), targets.ptr<int32_t>(), V, T(grad_scale));
  });
  ADGT_LAUNCH_CHECK(op);
}

void CudaBackend::ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                                   int64_t vocab_start, int64_t valid) {
  const char* op = "ce_partial_stats";
  const int64_t N = targets.numel(), Vl = N ? logits.numel() / N : 0;
  ADGT_CHECK(N > 0 && logits.numel() == N * Vl && stats.numel() == 3 * N && valid > 0 &&
                 valid <= Vl && stats.dtype == logits.dtype && targets.dtype == DType::I32,
             "ce_partial_stats: logits" << logits.shape_str() << " stats" << stats.shape_str()
                                        << " valid " << valid);
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    ce_stats_kernel<T><<<rows_grid(N, op), kThreads, 0, stream_>>>(
        stats.ptr<T>(), logits.ptr<T>(), targets.ptr<int32_t>(), Vl, valid, vocab_start);
  });
  ADGT_LAUNCH_CHECK(op);
}

void CudaBackend::ce_combine(Tensor combined, const Tensor& gathered) {
  const char* op = "ce_combine";
  const int64_t N = combined.numel() / 3, R = N ? gathered.numel() / (3 * N) : 0;
  ADGT_CHECK(N > 0 && combined.numel() == 3 * N && gathered.numel() == R * 3 * N && R > 0 &&
                 gathered.dtype == combined.dtype,
             "ce_combine: combined" << combined.shape_str() << " gathered"
                                    << gathered.shape_str());
  dispatch(combined.dtype, op, [&](auto z) {
    using T = decltype(z);
    const int threads = 256;
    ce_combine_kernel<T><<<unsigned((N + threads - 1) / threads), threads, 0, stream_>>>(
        combined.ptr<T>(), gathered.ptr<T>(), N, R);
  });
  ADGT_LAUNCH_CHECK(op);
}

void CudaBackend::ce_finish(Tensor logits, Tensor losses, const Tensor& combined,
                            const Tensor& targets, int64_t vocab_start, int64_t valid,
                            double grad_scale) {
  const char* op = "ce_finish";
  const int64_t N = targets.numel(), Vl = N ? logits.numel() / N : 0;
  ADGT_CHECK(N > 0 && losses.numel() == N && combined.numel() == 3 * N &&
                 logits.numel() == N * Vl && valid > 0 && valid <= Vl,
             "ce_finish: losses" << losses.shape_str() << " combined" << combined.shape_str()
                                 << " logits" << logits.shape_str() << " valid " << valid);
  dispatch(logits.dtype, op, [&](auto z) {
    using T = decltype(z);
    ce_finish_kernel<T><<<rows_grid(N, op), kThreads, 0, stream_>>>(
        logits.ptr<T>(), losses.ptr<T>(), combined.ptr<T>(), targets.ptr<int32_t>(), Vl, valid,
        vocab_start, T(grad_scale));
  });
  ADGT_LAUNCH_CHECK(op);
}

}  // namespace adgt
