// CPU backend: memory and simple elementwise ops.
#include "kernels/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/common/bf16.hpp"

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
void CpuBackend::release(void* p) { std::free(p); }
void CpuBackend::to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::zero(Tensor t) { std::memset(t.data, 0, t.bytes()); }

void CpuBackend::add_inplace(Tensor y, const Tensor& x) {
  expect_same(y, x, "add_inplace");
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
double load_elem(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<float>()[i];
    case DType::F64: return t.ptr<double>()[i];
    case DType::BF16: return bf16_to_float(t.ptr<bf16_bits>()[i]);
    default: return 0;
  }
}
void store_elem(Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::F32: t.ptr<float>()[i] = float(v); break;
    case DType::F64: t.ptr<double>()[i] = v; break;
    case DType::BF16: t.ptr<bf16_bits>()[i] = float_to_bf16(float(v)); break;
    default: break;
  }
}
bool is_float(DType d) { return d == DType::F32 || d == DType::F64 || d == DType::BF16; }
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
  const int64_t n = dst.numel();
  // f64 -> bf16 rounds through f32 (as torch's .to(bfloat16) of a double does not:
  // it rounds once); the mixed-precision paths only cast f32 <-> bf16.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) store_elem(dst, i, load_elem(src, i));
}

}  // namespace adgt
