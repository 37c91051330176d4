// CPU RMSNorm: y = x / sqrt(mean(x^2) + eps) * w; the per-row formulas are
// kernels/common/row_math.hpp's (shared with the CUDA backend).
#include <vector>

#include "kernels/common/row_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"

namespace adgt {
namespace {

// One row: orow = rmsnorm(xr) * w, returns rstd. The forward and the fused
// residual forward both call this, so they agree bit for bit.
template <class T>
T rmsnorm_row(T* orow, const T* xr, const T* wp, int64_t C, T eps) {
  T ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
  const T r = math::rmsnorm_rstd(ss, T(C), eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) orow[c] = math::rmsnorm_out(xr[c], r, wp[c]);
  return r;
}

void check_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                   const char* op) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(x.numel() == N * C && out.numel() == x.numel() && rstd.numel() == N,
             op << ": x" << x.shape_str() << " w" << w.shape_str() << " out" << out.shape_str()
                << " rstd" << rstd.shape_str());
  const DType a = x.dtype;
  expect_dtype(w, a, a, op, "w");
  expect_dtype(out, a, a, op, "out");
  expect_dtype(rstd, stat_dtype(a), a, op, "rstd");
}

}  // namespace

void CpuBackend::rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                 double eps) {
  check_forward(out, rstd, x, w, "rmsnorm_forward");
  if (x.dtype == DType::BF16) {  // rstd fp32
    cpu::F32Scratch s;
    const Tensor of = s.out(out);
    rmsnorm_forward(of, rstd, s.in(x), s.in(w), eps);
    s.store(out, of);
    return;
  }
  const int64_t C = w.numel(), N = x.numel() / C;
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    T* op = out.ptr<T>();
    T* rp = rstd.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) rp[i] = rmsnorm_row(op + i * C, xp + i * C, wp, C, T(eps));
  });
}

void CpuBackend::residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                          const Tensor& w, double eps) {
  check_forward(out, rstd, x, w, "residual_rmsnorm_forward");
  expect_same(x, y, "residual_rmsnorm_forward");
  const int64_t C = w.numel(), N = x.numel() / C;
  if (x.dtype == DType::BF16) {
    // Per row: x = bf16(x + y) in fp32, then the norm of that rounded row in
    // fp32, out rounded once — add_inplace then rmsnorm_forward, fused.
    cpu::F32Scratch s;
    const float* wf = s.in(w).ptr<float>();
    bf16_bits* xp = x.ptr<bf16_bits>();
    const bf16_bits* yp = y.ptr<bf16_bits>();
    bf16_bits* op = out.ptr<bf16_bits>();
    float* rp = rstd.ptr<float>();
    const float e = float(eps);
#pragma omp parallel
    {
      std::vector<float> xr(static_cast<size_t>(C)), orow(static_cast<size_t>(C));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        bf16_bits* xb = xp + i * C;
        const bf16_bits* yb = yp + i * C;
        for (int64_t c = 0; c < C; ++c) {
          xb[c] = float_to_bf16(bf16_to_float(xb[c]) + bf16_to_float(yb[c]));
          xr[size_t(c)] = bf16_to_float(xb[c]);
        }
        rp[i] = rmsnorm_row(orow.data(), xr.data(), wf, C, e);
        bf16_bits* ob = op + i * C;
        for (int64_t c = 0; c < C; ++c) ob[c] = float_to_bf16(orow[size_t(c)]);
      }
    }
    return;
  }
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* xp = x.ptr<T>();
    const T* yp = y.ptr<T>();
    const T* wp = w.ptr<T>();
    T* op = out.ptr<T>();
    T* rp = rstd.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      T* xr = xp + i * C;
      const T* yr = yp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) xr[c] += yr[c];
      rp[i] = rmsnorm_row(op + i * C, xr, wp, C, T(eps));
    }
  });
}

void CpuBackend::rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                  const Tensor& w, const Tensor& rstd) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(x.numel() == N * C && dx.numel() == N * C && dout.numel() == N * C &&
                 dw.numel() == C && rstd.numel() == N,
             "rmsnorm_backward: shapes dx" << dx.shape_str() << " dout" << dout.shape_str());
  const DType a = x.dtype;
  expect_dtype(w, a, a, "rmsnorm_backward", "w");
  expect_dtype(dout, a, a, "rmsnorm_backward", "dout");
  expect_dtype(dx, a, a, "rmsnorm_backward", "dx");
  expect_dtype(dw, stat_dtype(a), a, "rmsnorm_backward", "dw");
  expect_dtype(rstd, stat_dtype(a), a, "rmsnorm_backward", "rstd");
  if (a == DType::BF16) {  // dx bf16 +=, dw and rstd fp32
    cpu::F32Scratch s;
    const Tensor dxf = s.in(dx);
    rmsnorm_backward(dxf, dw, s.in(dout), s.in(x), s.in(w), rstd);
    s.store(dx, dxf);
    return;
  }
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
      const T k = math::rmsnorm_k(dot, r, T(C));
      T* dr = dxp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dr[c] += math::rmsnorm_dx(gr[c], wp[c], xr[c], r, k);
    }
    // dw: serial over rows (fixed order, deterministic), vectorised over C.
    T* dwp = dw.ptr<T>();
    for (int64_t i = 0; i < N; ++i) {
      const T* xr = xp + i * C;
      const T* gr = gp + i * C;
      const T r = rp[i];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dwp[c] += math::rmsnorm_dw(gr[c], xr[c], r);
    }
  });
}

}  // namespace adgt
