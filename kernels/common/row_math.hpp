// Per-row math shared by the CPU and CUDA backends (host/device): the parts of
// RMSNorm and softmax/cross-entropy that do not depend on how a backend sums a
// row. A backend computes the row sums (its own order: a serial loop, a
// warp-shuffle tree) and calls these for everything else, so both backends
// use one formula, and the CPU tests cover it. The operation order is the CPU
// reference backend's (its fp32/fp64 results are pinned by the tests). The
// cross-entropy gradient takes exp(x - M) from the caller, since each backend
// has its own fast exp (CPU: cpu::vexp).
#pragma once
#include <cmath>

#include "kernels/common/hd.hpp"

namespace adgt::math {

// sqrt/log/exp in T's own precision. Unqualified sqrt(float) on the host finds only
// C's ::sqrt(double) (libstdc++'s <cmath> puts the float overloads in std::),
// which would compute the fp32 path in double.
namespace detail {
ADGT_HD float sqrt_t(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
ADGT_HD double sqrt_t(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
ADGT_HD float log_t(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}
ADGT_HD double log_t(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}
ADGT_HD float exp_t(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
ADGT_HD double exp_t(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
}  // namespace detail

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) ----
// sum_sq = sum_c x_c^2 over the row.
template <class T>
ADGT_HD T rmsnorm_rstd(T sum_sq, T C, T eps) {
  return T(1) / detail::sqrt_t(sum_sq / C + eps);
}
template <class T>
ADGT_HD T rmsnorm_out(T x, T rstd, T w) {
  return (x * rstd) * w;
}
// Backward: with dot = sum_c dy_c w_c x_c over the row (each term (dy_c * w_c) * x_c),
// k = rmsnorm_k(dot, rstd, C), dx_c = rmsnorm_dx(...) = dy_c w_c rstd - x_c k; the
// weight gradient's row term is rmsnorm_dw(...) = dy_c x_c rstd, summed over rows.
template <class T>
ADGT_HD T rmsnorm_k(T dot, T rstd, T C) {
  return dot * rstd * rstd * rstd / C;
}
template <class T>
ADGT_HD T rmsnorm_dx(T dy, T w, T x, T rstd, T k) {
  return dy * w * rstd - x * k;
}
template <class T>
ADGT_HD T rmsnorm_dw(T dy, T x, T rstd) {
  return dy * x * rstd;
}

// ---- softmax / cross-entropy over a row of logits ----
// Running (max m, sum s of exp(x - m)) merged with another part (m2, s2):
// the online-softmax step (Milakov & Gimelshein) for rows read in chunks.
template <class T>
ADGT_HD void softmax_merge(T& m, T& s, T m2, T s2) {
  if (m2 > m) {
    s = s * detail::exp_t(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * detail::exp_t(m2 - m);
  }
}
// The loss of a row: log S + M - x_target, with S = sum_j exp(x_j - M). A
// backend that has already shifted the row by its max passes M = 0 and the
// shifted target logit x_target - M (adding 0 changes nothing).
template <class T>
ADGT_HD T cross_entropy_loss(T M, T S, T x_target) {
  return detail::log_t(S) + M - x_target;
}
// d loss / d x_j times scale, in two roundings: every column gets
// cross_entropy_grad(exp(x_j - M), scale / S) = exp(x_j - M) * (scale / S); the
// target's column then becomes cross_entropy_target_grad(that, scale) = it - scale.
template <class T>
ADGT_HD T cross_entropy_grad(T e, T scale_over_S) {
  return e * scale_over_S;
}
template <class T>
ADGT_HD T cross_entropy_target_grad(T grad, T scale) {
  return grad - scale;
}

}  // namespace adgt::math
