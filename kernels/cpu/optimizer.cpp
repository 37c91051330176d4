// CPU optimizer pieces: deterministic sum of squares and the AdamW update.
#include <cmath>
#include <vector>

#include "kernels/common/bf16.hpp"
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"

namespace adgt {

double CpuBackend::sum_squares(const Tensor& x) {
  // Fixed chunking, independent of the thread count, summed in order: the
  // result is bitwise reproducible however many threads run.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = x.numel(), nchunks = (n + kChunk - 1) / kChunk;
  if (x.dtype == DType::BF16) {  // exactly the sum of an f32 tensor holding the same values
    cpu::F32Scratch s;
    return sum_squares(s.in(x));
  }
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

namespace {
void check_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const char* op) {
  ADGT_CHECK(param.dtype != DType::BF16,
             op << ": param bf16, expected f32 master weights (adamw_cast writes the bf16 copy)");
  expect_same(param, grad, op);
  expect_same(param, m, op);
  expect_same(param, v, op);
}

// One AdamW pass; after each element's update, lowp[i] = bf16(p[i]) when lowp
// is given (adamw_cast's fused copy: the same update code, so bitwise adamw).
template <class T>
void adamw_pass(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                bf16_bits* lowp, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(h.step));
  T* p = param.ptr<T>();
  const T* g = grad.ptr<T>();
  T* mp = m.ptr<T>();
  T* vp = v.ptr<T>();
  const T lr = T(h.lr), b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay),
          c1 = T(bc1), sc2 = T(std::sqrt(bc2)), gs = T(h.grad_scale);
  const int64_t n = param.numel();
  if (!lowp) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      math::adamw_update(p[i], g[i] * gs, mp[i], vp[i], lr, b1, b2, eps, wd, c1, sc2);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      math::adamw_update(p[i], g[i] * gs, mp[i], vp[i], lr, b1, b2, eps, wd, c1, sc2);
      lowp[i] = float_to_bf16(float(p[i]));
    }
  }
}
}  // namespace

void CpuBackend::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) {
  check_adamw(param, grad, m, v, "adamw");
  cpu_dispatch(param.dtype, [&](auto z_) {
    using T = decltype(z_);
    adamw_pass<T>(param, grad, m, v, nullptr, h);
  });
}

void CpuBackend::adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                            const AdamWHyper& h) {
  check_adamw(param, grad, m, v, "adamw_cast");
  ADGT_CHECK(lowp.numel() == param.numel(),
             "adamw_cast: lowp" << lowp.shape_str() << " vs param" << param.shape_str());
  if (param.dtype == DType::F32 && lowp.dtype == DType::BF16) {  // the mixed-precision step
    adamw_pass<float>(param, grad, m, v, lowp.ptr<bf16_bits>(), h);
    return;
  }
  adamw(param, grad, m, v, h);  // other dtype pairs: unfused
  cast(lowp, param);
}

}  // namespace adgt
