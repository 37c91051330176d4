// CPU linear layers on OpenBLAS GEMMs.
#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"

namespace adgt {

void CpuBackend::linear_forward(Tensor y, const Tensor& x, const Tensor& w) {
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  ADGT_CHECK(
      x.ndim == 2 && w.ndim == 2 && w.dim(1) == I && y.numel() == N * O,
      "linear_forward: x" << x.shape_str() << " w" << w.shape_str() << " y" << y.shape_str());
  const DType a = x.dtype;
  expect_dtype(w, a, a, "linear_forward", "w");
  expect_dtype(y, a, a, "linear_forward", "y");
  if (a == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor yf = s.out(y);
    linear_forward(yf, s.in(x), s.in(w));
    s.store(y, yf);
    return;
  }
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    cpu::gemm(false, true, N, O, I, T(1), x.ptr<T>(), I, w.ptr<T>(), I, T(0), y.ptr<T>(), O);
  });
}

void CpuBackend::linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                                 const Tensor& w, bool accumulate_dx) {
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  ADGT_CHECK(
      dy.numel() == N * O && (!dw.data || dw.numel() == O * I),
      "linear_backward: dy" << dy.shape_str() << " x" << x.shape_str() << " dw" << dw.shape_str());
  const DType a = x.dtype;
  expect_dtype(dy, a, a, "linear_backward", "dy");
  expect_dtype(w, a, a, "linear_backward", "w");
  expect_dtype(dx, a, a, "linear_backward", "dx");
  expect_dtype(dw, stat_dtype(a), a, "linear_backward", "dw");
  if (a == DType::BF16) {  // dx bf16 (read first when accumulating), dw fp32
    cpu::F32Scratch s;
    const Tensor dxf = accumulate_dx ? s.in(dx) : s.out(dx);
    linear_backward(dxf, dw, s.in(dy), s.in(x), s.in(w), accumulate_dx);
    s.store(dx, dxf);
    return;
  }
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    if (dx.data) {
      ADGT_CHECK(dx.numel() == N * I, "linear_backward: dx" << dx.shape_str());
      cpu::gemm(false, false, N, I, O, T(1), dy.ptr<T>(), O, w.ptr<T>(), I,
                T(accumulate_dx ? 1 : 0), dx.ptr<T>(), I);
    }
    if (dw.data)
      cpu::gemm(true, false, O, I, N, T(1), dy.ptr<T>(), O, x.ptr<T>(), I, T(1), dw.ptr<T>(), I);
  });
}

double CpuBackend::remeasure_peak_tflops() {
  const double old = peak_tflops_;
  peak_tflops_ = 0;
  return peak_tflops_ = std::max(old, peak_tflops());
}

double CpuBackend::peak_tflops() {
  if (peak_tflops_ > 0) return peak_tflops_;
  // n = 512 runs at the rate of n = 1024 within the noise (OpenBLAS Haswell,
  // 1 and 2 threads: 83.2 against 83.4 GFLOP/s, 135.0 against 135.1) at an
  // eighth of the cost: one warm-up and six timed calls are 1.9 GFLOP, ~25 ms
  // of every rank's start (n = 1024, five calls: 10.7 GFLOP, ~0.13 s a rank,
  // a third of a small test run's processor time). A figure that reads low is
  // measured again (StepLogger).
  const int64_t n = 512;
  std::vector<float> a(size_t(n * n), 1.0f), b(size_t(n * n), 0.5f), c(size_t(n * n));
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, dt);  // the first call warms up the thread pool
  }
  ADGT_CHECK(c[0] == 256.0f, "peak_tflops: sgemm check failed");
  peak_tflops_ = 2.0 * double(n * n * n) / best / 1e12;
  return peak_tflops_;
}

}  // namespace adgt
