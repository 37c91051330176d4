// CPU rotary embedding (HuggingFace rotate-half), in place on x(B*T, H, hd).
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"

namespace adgt {
namespace {
template <class T, bool kBack>
void rope_apply(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_) {
  const int64_t half = cos.dim(1), hd = 2 * half;
  const int64_t rows = x.dim(0), H = x.numel() / (rows * hd);
  ADGT_CHECK(x.numel() == rows * H * hd && cos.dim(0) >= T_ && rows % T_ == 0,
             "rope: x" << x.shape_str() << " cos" << cos.shape_str() << " T=" << T_);
  T* xp = x.ptr<T>();
  const T* cp = cos.ptr<T>();
  const T* sp = sin.ptr<T>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T_;
    const T* cr = cp + t * half;
    const T* sr = sp + t * half;
    for (int64_t h = 0; h < H; ++h) {
      T* a = xp + (r * H + h) * hd;
      T* b = a + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        if constexpr (kBack)
          math::rope_rotate_back(a[i], b[i], cr[i], sr[i]);
        else
          math::rope_rotate(a[i], b[i], cr[i], sr[i]);
      }
    }
  }
}
}  // namespace

namespace {
// x in place; cos/sin are fp32 tables when x is bf16 (and x's dtype otherwise).
template <bool kBack>
void rope_op(CpuBackend& be, Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_,
             const char* op) {
  const DType a = x.dtype;
  expect_dtype(cos, stat_dtype(a), a, op, "cos");
  expect_dtype(sin, stat_dtype(a), a, op, "sin");
  ADGT_CHECK(cos.ndim == 2 && sin.numel() == cos.numel() && T_ > 0,
             op << ": cos" << cos.shape_str() << " sin" << sin.shape_str() << " T=" << T_);
  if (a == DType::BF16) {
    cpu::F32Scratch s;
    const Tensor xf = s.in(x);
    if constexpr (kBack)
      be.rope_backward(xf, cos, sin, T_);
    else
      be.rope_forward(xf, cos, sin, T_);
    s.store(x, xf);
    return;
  }
  cpu_dispatch(a, [&](auto z_) {
    using T = decltype(z_);
    (rope_apply<T, kBack>(x, cos, sin, T_));
  });
}
}  // namespace

void CpuBackend::rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_) {
  rope_op<false>(*this, x, cos, sin, T_, "rope_forward");
}
void CpuBackend::rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T_) {
  rope_op<true>(*this, dx, cos, sin, T_, "rope_backward");
}

}  // namespace adgt
