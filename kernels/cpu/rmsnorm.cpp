// CPU RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"

namespace adgt {

void CpuBackend::rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                 double eps) {
  const int64_t C = w.numel(), N = x.numel() / C;
  ADGT_CHECK(x.numel() == N * C && out.numel() == x.numel() && rstd.numel() == N,
             "rmsnorm_forward: x" << x.shape_str() << " w" << w.shape_str() << " rstd"
                                  << rstd.shape_str());
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    T* op = out.ptr<T>();
    T* rp = rstd.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* xr = xp + i * C;
      T ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
      const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
      rp[i] = r;
      T* orow = op + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) orow[c] = (xr[c] * r) * wp[c];
    }
  });
}

void CpuBackend::rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                  const Tensor& w, const Tensor& rstd) {
  const int64_t C = w.numel(), N = x.numel() / C;
  ADGT_CHECK(dx.numel() == N * C && dout.numel() == N * C && dw.numel() == C && rstd.numel() == N,
             "rmsnorm_backward: shapes dx" << dx.shape_str() << " dout" << dout.shape_str());
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    const T* gp = dout.ptr<T>();
    const T* rp = rstd.ptr<T>();
    T* dxp = dx.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* xr = xp + i * C;
      const T* gr = gp + i * C;
      const T r = rp[i];
      T dot = 0;  // sum_c (g*w) * x
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += gr[c] * wp[c] * xr[c];
      const T k = dot * r * r * r / T(C);
      T* dr = dxp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dr[c] += gr[c] * wp[c] * r - xr[c] * k;
    }
    // dw: serial over rows (fixed order, deterministic), vectorised over C.
    T* dwp = dw.ptr<T>();
    for (int64_t i = 0; i < N; ++i) {
      const T* xr = xp + i * C;
      const T* gr = gp + i * C;
      const T r = rp[i];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dwp[c] += gr[c] * xr[c] * r;
    }
  });
}

}  // namespace adgt
