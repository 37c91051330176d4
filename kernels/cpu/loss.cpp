// CPU fused classifier: softmax cross-entropy and its gradient in one pass per row.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace adgt {

void CpuBackend::cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                               double grad_scale) {
  const int64_t N = targets.numel(), V = logits.numel() / N;
  ADGT_CHECK(logits.numel() == N * V && losses.numel() == N && targets.dtype == DType::I32,
             "cross_entropy: logits" << logits.shape_str() << " targets" << targets.shape_str());
  const int32_t* tg = targets.ptr<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    ADGT_CHECK(tg[i] < V, "cross_entropy: target " << tg[i] << " at row " << i
                                                   << " outside the vocabulary [0," << V << ")");
  cpu_dispatch(logits.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* lp = logits.ptr<T>();
    T* out = losses.ptr<T>();
    const T gs = T(grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      T* row = lp + i * V;
      if (tg[i] < 0) {
        out[i] = 0;
        std::fill(row, row + V, T(0));
        continue;
      }
      T mx = row[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 1; j < V; ++j) mx = row[j] > mx ? row[j] : mx;
      const T zt = row[tg[i]] - mx;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        row[j] = cpu::vexp(row[j] - mx);
        sum += row[j];
      }
      out[i] = std::log(sum) - zt;
      const T inv = gs / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) row[j] *= inv;
      row[tg[i]] -= gs;
    }
  });
}

}  // namespace adgt
