// CPU backend: memory and simple elementwise ops.
#include "kernels/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/common/bf16.hpp"
#include "kernels/cpu/mixed.hpp"

namespace adgt {

CpuBackend::CpuBackend() {
  // On some virtual machines OpenBLAS cannot identify the CPU and falls back to
  // its SSE3 (Prescott) kernels, 3-4x slower than the AVX2 ones. Say so once.
  static bool warned = false;
  const std::string core = openblas_get_corename();
  if (!warned && (core == "Prescott" || core == "Core2" || core == "Nehalem") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    warned = true;
    std::fprintf(stderr,
                 "warning: OpenBLAS picked its %s kernels on a CPU with AVX2 and FMA; set "
                 "OPENBLAS_CORETYPE=Haswell (or SkylakeX with AVX-512) for 3-4x faster GEMMs\n",
                 core.c_str());
  }
}

std::string CpuBackend::name() const {
  return std::string("cpu (OpenBLAS ") + openblas_get_corename() + ")";
}

void* CpuBackend::alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  return p;
}
void CpuBackend::release(void* p) noexcept { std::free(p); }
void CpuBackend::to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::zero(Tensor t) { std::memset(t.data, 0, t.bytes()); }

void CpuBackend::add_inplace(Tensor y, const Tensor& x) {
  expect_same(y, x, "add_inplace");
  if (y.dtype == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor yf = s.in(y);
    add_inplace(yf, s.in(x));
    s.store(y, yf);
    return;
  }
  cpu_dispatch(y.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* a = y.ptr<T>();
    const T* b = x.ptr<T>();
    const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  });
}

void CpuBackend::copy(Tensor dst, const Tensor& src) {
  expect_same(dst, src, "copy");
  std::memcpy(dst.data, src.data, dst.bytes());
}

void CpuBackend::scale_inplace(Tensor x, double s) {
  if (x.dtype == DType::BF16) {
    cpu::F32Scratch sc;
    const Tensor xf = sc.in(x);
    scale_inplace(xf, s);
    sc.store(x, xf);
    return;
  }
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* a = x.ptr<T>();
    const T f = T(s);
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] *= f;
  });
}

namespace {
bool is_float(DType d) { return d == DType::F32 || d == DType::F64 || d == DType::BF16; }

// f64 -> bf16 rounded once (nearest even): round to f32 toward odd (inexact
// results get their last bit set), which keeps enough information for the
// second rounding to f32 -> bf16 to equal a direct one.
bf16_bits f64_to_bf16(double d) {
  float f = float(d);
  if (std::isfinite(f) && double(f) != d) {
    if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // truncate
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return float_to_bf16(f);
}

template <class Dst, class Src, class Conv>
void convert(const Tensor& dst, const Tensor& src, Conv conv) {
  Dst* d = dst.ptr<Dst>();
  const Src* s = src.ptr<Src>();
  const int64_t n = dst.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = conv(s[i]);
}
}  // namespace

void CpuBackend::cast(Tensor dst, const Tensor& src) {
  ADGT_CHECK(dst.numel() == src.numel(),
             "cast: size mismatch " << dst.shape_str() << " vs " << src.shape_str());
  ADGT_CHECK(is_float(dst.dtype) && is_float(src.dtype),
             "cast: " << dtype_name(src.dtype) << " -> " << dtype_name(dst.dtype)
                      << " (float dtypes only)");
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
    return;
  }
  // Each conversion rounds once (nearest even); widening ones are exact.
  using D = DType;
  const D a = src.dtype, b = dst.dtype;
  if (a == D::F32 && b == D::BF16)
    convert<bf16_bits, float>(dst, src, [](float x) { return float_to_bf16(x); });
  else if (a == D::F64 && b == D::BF16)
    convert<bf16_bits, double>(dst, src, [](double x) { return f64_to_bf16(x); });
  else if (a == D::BF16 && b == D::F32)
    convert<float, bf16_bits>(dst, src, [](bf16_bits x) { return bf16_to_float(x); });
  else if (a == D::BF16 && b == D::F64)
    convert<double, bf16_bits>(dst, src, [](bf16_bits x) { return double(bf16_to_float(x)); });
  else if (a == D::F32 && b == D::F64)
    convert<double, float>(dst, src, [](float x) { return double(x); });
  else  // f64 -> f32
    convert<float, double>(dst, src, [](double x) { return float(x); });
}

}  // namespace adgt
