// CPU backend: memory and simple elementwise ops.
#include "kernels/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

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

}  // namespace adgt
