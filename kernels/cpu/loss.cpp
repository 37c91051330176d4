// CPU fused classifier: softmax cross-entropy and its gradient in one pass per row.
// The per-row formulas are kernels/common/row_math.hpp's (shared with CUDA).
#include <algorithm>
#include <cmath>

#include "kernels/common/row_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
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
  const DType a = logits.dtype;
  expect_dtype(losses, stat_dtype(a), a, "cross_entropy", "losses");
  if (a == DType::BF16) {  // the gradient replaces the logits in bf16; losses fp32
    cpu::F32Scratch s;
    const Tensor lf = s.in(logits);
    cross_entropy(lf, losses, targets, grad_scale);
    s.store(logits, lf);
    return;
  }
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
      out[i] = math::cross_entropy_loss(T(0), sum, zt);  // the row is already shifted by mx
      const T inv = gs / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) row[j] = math::cross_entropy_grad(row[j], inv);
      row[tg[i]] = math::cross_entropy_target_grad(row[tg[i]], gs);
    }
  });
}

}  // namespace adgt

namespace adgt {

void CpuBackend::ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                                  int64_t vocab_start, int64_t valid) {
  const int64_t N = targets.numel(), Vl = logits.numel() / N;
  ADGT_CHECK(logits.numel() == N * Vl && stats.numel() == 3 * N && valid > 0 && valid <= Vl &&
                 targets.dtype == DType::I32,
             "ce_partial_stats: logits" << logits.shape_str() << " stats" << stats.shape_str()
                                        << " valid " << valid);
  const DType a = logits.dtype;
  expect_dtype(stats, stat_dtype(a), a, "ce_partial_stats", "stats");
  if (a == DType::BF16) {
    cpu::F32Scratch s;
    ce_partial_stats(stats, s.in(logits), targets, vocab_start, valid);
    return;
  }
  const int32_t* tg = targets.ptr<int32_t>();
  cpu_dispatch(logits.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* lp = logits.ptr<T>();
    T* st = stats.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* row = lp + i * Vl;
      T mx = row[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 1; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < valid; ++j) sum += cpu::vexp(row[j] - mx);
      const int64_t t = int64_t(tg[i]) - vocab_start;
      st[3 * i] = mx;
      st[3 * i + 1] = sum;
      st[3 * i + 2] = (tg[i] >= 0 && t >= 0 && t < valid) ? row[t] : T(0);
    }
  });
}

void CpuBackend::ce_combine(Tensor combined, const Tensor& gathered) {
  const int64_t N = combined.numel() / 3, R = gathered.numel() / (3 * N);
  ADGT_CHECK(combined.numel() == 3 * N && gathered.numel() == R * 3 * N,
             "ce_combine: combined" << combined.shape_str() << " gathered"
                                    << gathered.shape_str());
  ADGT_CHECK(combined.dtype != DType::BF16,
             "ce_combine: combined bf16, expected f32 (the statistics are fp32 with bf16 logits)");
  expect_dtype(gathered, combined.dtype, combined.dtype, "ce_combine", "gathered");
  cpu_dispatch(combined.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* g = gathered.ptr<T>();
    T* c = combined.ptr<T>();
    for (int64_t i = 0; i < N; ++i) {
      T M = g[3 * i];
      for (int64_t r = 1; r < R; ++r) M = std::max(M, g[(r * N + i) * 3]);
      T S = 0, tl = 0;
      for (int64_t r = 0; r < R; ++r) {
        const T* s = g + (r * N + i) * 3;
        S += s[1] * cpu::vexp(s[0] - M);
        tl += s[2];
      }
      c[3 * i] = M;
      c[3 * i + 1] = S;
      c[3 * i + 2] = tl;
    }
  });
}

void CpuBackend::ce_finish(Tensor logits, Tensor losses, const Tensor& combined,
                           const Tensor& targets, int64_t vocab_start, int64_t valid,
                           double grad_scale) {
  const int64_t N = targets.numel(), Vl = logits.numel() / N;
  ADGT_CHECK(losses.numel() == N && combined.numel() == 3 * N,
             "ce_finish: losses" << losses.shape_str() << " combined" << combined.shape_str());
  ADGT_CHECK(logits.numel() == N * Vl && valid > 0 && valid <= Vl && targets.dtype == DType::I32,
             "ce_finish: logits" << logits.shape_str() << " targets" << targets.shape_str()
                                 << " valid " << valid);
  const DType a = logits.dtype;
  expect_dtype(losses, stat_dtype(a), a, "ce_finish", "losses");
  expect_dtype(combined, stat_dtype(a), a, "ce_finish", "combined");
  if (a == DType::BF16) {  // the gradient replaces the logits in bf16
    cpu::F32Scratch s;
    const Tensor lf = s.in(logits);
    ce_finish(lf, losses, combined, targets, vocab_start, valid, grad_scale);
    s.store(logits, lf);
    return;
  }
  const int32_t* tg = targets.ptr<int32_t>();
  cpu_dispatch(logits.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* lp = logits.ptr<T>();
    T* out = losses.ptr<T>();
    const T* c = combined.ptr<T>();
    const T gs = T(grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      T* row = lp + i * Vl;
      if (tg[i] < 0) {
        out[i] = 0;
        std::fill(row, row + Vl, T(0));
        continue;
      }
      const T M = c[3 * i], S = c[3 * i + 1];
      out[i] = math::cross_entropy_loss(M, S, c[3 * i + 2]);
      const T inv = gs / S;
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j)
        row[j] = math::cross_entropy_grad(cpu::vexp(row[j] - M), inv);
      std::fill(row + valid, row + Vl, T(0));
      const int64_t t = int64_t(tg[i]) - vocab_start;
      if (t >= 0 && t < valid) row[t] = math::cross_entropy_target_grad(row[t], gs);
    }
  });
}

}  // namespace adgt
