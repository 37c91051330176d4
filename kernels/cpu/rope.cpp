// CPU rotary embedding (HuggingFace rotate-half), in place on x(B*T, H, hd).
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"

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

void CpuBackend::rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_) {
  cpu_dispatch(x.dtype, [&](auto z_) {
    using T = decltype(z_);
    (rope_apply<T, false>(x, cos, sin, T_));
  });
}
void CpuBackend::rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T_) {
  cpu_dispatch(dx.dtype, [&](auto z_) {
    using T = decltype(z_);
    (rope_apply<T, true>(dx, cos, sin, T_));
  });
}

}  // namespace adgt
