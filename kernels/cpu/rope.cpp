// CPU rotary embedding (HuggingFace rotate-half), in place on x(B*T, H, hd);
// and the fused q/k/v projection's split and merge with the rotary.
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
#include "kernels/op_checks.hpp"

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

namespace {
// Head h of each row of qkv (rows, Hq + 2 KV, hd) and where it goes: q's,
// k's (both rotated) or v's heads. kBack: the merge (dqkv from dq, dk, dv).
template <class T, bool kBack>
void qkv_apply(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& cos, const Tensor& sin, int64_t T_, const QkvDims& d) {
  const int64_t half = d.half, hd = 2 * half, Ht = d.Hq + 2 * d.KV;
  T* f = qkv.ptr<T>();
  T* qp = q.ptr<T>();
  T* kp = k.ptr<T>();
  T* vp = v.ptr<T>();
  const T* cp = cos.ptr<T>();
  const T* sp = sin.ptr<T>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < d.rows; ++r) {
    const int64_t t = r % T_;
    const T* cr = cp + t * half;
    const T* sr = sp + t * half;
    for (int64_t h = 0; h < Ht; ++h) {
      T* fused = f + (r * Ht + h) * hd;
      T* sep = h < d.Hq          ? qp + (r * d.Hq + h) * hd
               : h < d.Hq + d.KV ? kp + (r * d.KV + h - d.Hq) * hd
                                 : vp + (r * d.KV + h - d.Hq - d.KV) * hd;
      const T* src = kBack ? sep : fused;
      T* dst = kBack ? fused : sep;
      if (h >= d.Hq + d.KV) {  // v: a copy
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i];
        continue;
      }
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        T a = src[i], b = src[i + half];
        if constexpr (kBack)
          math::rope_rotate_back(a, b, cr[i], sr[i]);
        else
          math::rope_rotate(a, b, cr[i], sr[i]);
        dst[i] = a;
        dst[i + half] = b;
      }
    }
  }
}

// bf16: fp32 copies, the fp32 op, each output rounded once (the same numbers
// as rope_forward / rope_backward in bf16 on the separate tensors).
template <bool kBack>
void qkv_op(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v,
            const Tensor& cos, const Tensor& sin, int64_t T_, const char* op) {
  const QkvDims d = check_qkv_shapes(qkv, q, k, v, cos, sin, T_, op);
  if (qkv.dtype == DType::BF16) {
    cpu::F32Scratch s;
    if constexpr (kBack) {
      const Tensor f = s.out(qkv);
      qkv_apply<float, true>(f, s.in(q), s.in(k), s.in(v), cos, sin, T_, d);
      s.store(qkv, f);
    } else {
      const Tensor qf = s.out(q), kf = s.out(k), vf = s.out(v);
      qkv_apply<float, false>(s.in(qkv), qf, kf, vf, cos, sin, T_, d);
      s.store(q, qf);
      s.store(k, kf);
      s.store(v, vf);
    }
    return;
  }
  cpu_dispatch(qkv.dtype, [&](auto z_) {
    using T = decltype(z_);
    (qkv_apply<T, kBack>(qkv, q, k, v, cos, sin, T_, d));
  });
}
}  // namespace

void CpuBackend::qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv,
                                const Tensor& cos, const Tensor& sin, int64_t T_) {
  qkv_op<false>(qkv, q, k, v, cos, sin, T_, "qkv_rope_split");
}
void CpuBackend::qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dv, const Tensor& cos, const Tensor& sin,
                                         int64_t T_) {
  qkv_op<true>(dqkv, dq, dk, dv, cos, sin, T_, "qkv_rope_merge_backward");
}

}  // namespace adgt
