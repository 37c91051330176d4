// CPU SwiGLU: h = silu(gate) * up, with gate and up separate or packed side
// by side in the rows of one (N, 2F) tensor (the fused gate/up projection).
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {

void CpuBackend::swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) {
  expect_same(h, gate, "swiglu_forward");
  expect_same(h, up, "swiglu_forward");
  if (h.dtype == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor hf = s.out(h);
    swiglu_forward(hf, s.in(gate), s.in(up));
    s.store(h, hf);
    return;
  }
  cpu_dispatch(h.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* hp = h.ptr<T>();
    const T* g = gate.ptr<T>();
    const T* u = up.ptr<T>();
    const int64_t n = h.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      hp[i] = math::swiglu(g[i], u[i], T(1) / (T(1) + cpu::vexp(-g[i])));
  });
}

void CpuBackend::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                                 const Tensor& up) {
  expect_same(dh, gate, "swiglu_backward");
  expect_same(dgate, gate, "swiglu_backward");
  expect_same(dup, up, "swiglu_backward");
  expect_same(up, gate, "swiglu_backward");
  if (dh.dtype == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor dgf = s.out(dgate), duf = s.out(dup);
    swiglu_backward(dgf, duf, s.in(dh), s.in(gate), s.in(up));
    s.store(dgate, dgf);
    s.store(dup, duf);
    return;
  }
  cpu_dispatch(dh.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* dg = dgate.ptr<T>();
    T* du = dup.ptr<T>();
    const T* d = dh.ptr<T>();
    const T* g = gate.ptr<T>();
    const T* u = up.ptr<T>();
    const int64_t n = dh.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      math::swiglu_grad(g[i], u[i], d[i], T(1) / (T(1) + cpu::vexp(-g[i])), dg[i], du[i]);
  });
}

void CpuBackend::swiglu_packed_forward(Tensor h, const Tensor& gu) {
  const int64_t F = check_swiglu_packed(h, gu, "swiglu_packed_forward");
  if (h.dtype == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor hf = s.out(h);
    swiglu_packed_forward(hf, s.in(gu));
    s.store(h, hf);
    return;
  }
  cpu_dispatch(h.dtype, [&](auto z_) {
    using T = decltype(z_);
    const int64_t N = h.dim(0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      T* hp = h.ptr<T>() + r * F;
      const T* g = gu.ptr<T>() + r * 2 * F;
      const T* u = g + F;
#pragma omp simd
      for (int64_t i = 0; i < F; ++i)
        hp[i] = math::swiglu(g[i], u[i], T(1) / (T(1) + cpu::vexp(-g[i])));
    }
  });
}

void CpuBackend::swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) {
  const int64_t F = check_swiglu_packed(dh, gu, "swiglu_packed_backward");
  expect_same(dgu, gu, "swiglu_packed_backward");
  if (dh.dtype == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor df = s.out(dgu);
    swiglu_packed_backward(df, s.in(dh), s.in(gu));
    s.store(dgu, df);
    return;
  }
  cpu_dispatch(dh.dtype, [&](auto z_) {
    using T = decltype(z_);
    const int64_t N = dh.dim(0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const T* d = dh.ptr<T>() + r * F;
      const T* g = gu.ptr<T>() + r * 2 * F;
      const T* u = g + F;
      T* dg = dgu.ptr<T>() + r * 2 * F;
      T* du = dg + F;
#pragma omp simd
      for (int64_t i = 0; i < F; ++i)
        math::swiglu_grad(g[i], u[i], d[i], T(1) / (T(1) + cpu::vexp(-g[i])), dg[i], du[i]);
    }
  });
}

}  // namespace adgt
