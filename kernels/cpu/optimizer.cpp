// CPU optimizer pieces: deterministic sum of squares and the AdamW update.
#include <cmath>
#include <vector>

#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt {

double CpuBackend::sum_squares(const Tensor& x) {
  // Fixed chunking, independent of the thread count, summed in order: the
  // result is bitwise reproducible however many threads run.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = x.numel(), nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(nchunks), 0.0);
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* p = x.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = lo; i < hi; ++i) s += double(p[i]) * double(p[i]);
      part[size_t(c)] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  return total;
}

void CpuBackend::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) {
  expect_same(param, grad, "adamw");
  expect_same(param, m, "adamw");
  expect_same(param, v, "adamw");
  const double bc1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(h.step));
  cpu_dispatch(param.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* p = param.ptr<T>();
    const T* g = grad.ptr<T>();
    T* mp = m.ptr<T>();
    T* vp = v.ptr<T>();
    const T lr = T(h.lr), b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay),
            c1 = T(bc1), sc2 = T(std::sqrt(bc2));
    const int64_t n = param.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      math::adamw_update(p[i], g[i], mp[i], vp[i], lr, b1, b2, eps, wd, c1, sc2);
  });
}

}  // namespace adgt
