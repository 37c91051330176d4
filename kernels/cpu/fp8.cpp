// FP8 casts on the CPU: the exact reference (kernels/common/fp8.hpp) the
// CUDA kernels (kernels/cuda/fp8_kernels.cuh) are checked against.
#include <cmath>

#include "kernels/common/bf16.hpp"
#include "kernels/common/fp8.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt {

namespace {
Fp8Kind kind_of(const Tensor& q, const char* op) {
  ADGT_CHECK(q.dtype == DType::E4M3 || q.dtype == DType::E5M2,
             op << ": the FP8 tensor is " << dtype_name(q.dtype) << ", not e4m3 or e5m2");
  return q.dtype == DType::E4M3 ? Fp8Kind::E4M3 : Fp8Kind::E5M2;
}
void expect_scalar(const Tensor& t, const char* op, const char* what) {
  ADGT_CHECK(t.data && t.dtype == DType::F32 && t.numel() == 1,
             op << ": " << what << " must be one f32, got " << dtype_name(t.dtype) << t.shape_str());
}
// x's element i as a float (BF16 or F32).
template <class T> float load(const T* p, int64_t i);
template <> float load<float>(const float* p, int64_t i) { return p[i]; }
template <> float load<bf16_bits>(const bf16_bits* p, int64_t i) { return bf16_to_float(p[i]); }
template <class F>
void lowp_dispatch(const Tensor& x, const char* op, F&& f) {
  if (x.dtype == DType::F32) return f(x.ptr<float>());
  ADGT_CHECK(x.dtype == DType::BF16, op << ": x is " << dtype_name(x.dtype) << ", not bf16 or f32");
  f(x.ptr<bf16_bits>());
}
}  // namespace

void CpuBackend::fp8_amax(Tensor amax, const Tensor& x, bool accumulate) {
  expect_scalar(amax, "fp8_amax", "amax");
  const int64_t n = x.numel();
  float m = 0;
  bool nan = false;
  lowp_dispatch(x, "fp8_amax", [&](const auto* p) {
#pragma omp parallel for reduction(max : m) reduction(|| : nan) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(load(p, i));
      nan = nan || a != a;
      m = a > m ? a : m;
    }
  });
  float& out = *amax.ptr<float>();
  const float prev = accumulate ? out : 0.0f;
  out = (nan || prev != prev) ? std::nanf("") : (m > prev ? m : prev);
}

void CpuBackend::fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) {
  expect_scalar(scale, "fp8_scale", "scale");
  expect_scalar(amax, "fp8_scale", "amax");
  *scale.ptr<float>() = pow2f(fp8_scale_exponent(*amax.ptr<float>(), kind, margin));
}

void CpuBackend::fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) {
  const Fp8Kind k = kind_of(q, "fp8_quantize");
  expect_scalar(scale, "fp8_quantize", "scale");
  ADGT_CHECK(q.numel() == x.numel(),
             "fp8_quantize: q" << q.shape_str() << " and x" << x.shape_str() << " differ in size");
  const float s = *scale.ptr<float>();
  const int64_t n = x.numel();
  uint8_t* d = q.ptr<uint8_t>();
  lowp_dispatch(x, "fp8_quantize", [&](const auto* p) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_fp8(load(p, i) * s, k);
  });
  if (!qt.data) return;
  ADGT_CHECK(qt.dtype == q.dtype && x.ndim == 2 && qt.numel() == n,
             "fp8_quantize: qt" << qt.shape_str() << " " << dtype_name(qt.dtype)
                                << " is not the transpose of x" << x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1);
  uint8_t* t = qt.ptr<uint8_t>();
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < R; ++r) t[c * R + r] = d[r * C + c];
}

void CpuBackend::fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) {
  const Fp8Kind k = kind_of(q, "fp8_dequantize");
  expect_scalar(scale, "fp8_dequantize", "scale");
  ADGT_CHECK(q.numel() == out.numel(), "fp8_dequantize: out" << out.shape_str() << " and q"
                                                             << q.shape_str() << " differ in size");
  const float s = *scale.ptr<float>();
  const int64_t n = q.numel();
  const uint8_t* c = q.ptr<uint8_t>();
  if (out.dtype == DType::F32) {
    float* o = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) o[i] = fp8_to_float(c[i], k) / s;
    return;
  }
  ADGT_CHECK(out.dtype == DType::BF16,
             "fp8_dequantize: out is " << dtype_name(out.dtype) << ", not bf16 or f32");
  bf16_bits* o = out.ptr<bf16_bits>();
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) o[i] = float_to_bf16(fp8_to_float(c[i], k) / s);
}

}  // namespace adgt
