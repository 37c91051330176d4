// Per-row math shared by the CPU and CUDA backends (host/device): the parts of
// RMSNorm and softmax/cross-entropy that do not depend on how a backend sums a
// row. A backend computes the row sums (its own order: a serial loop, a
// warp-shuffle tree) and calls these for everything else, so both backends
// use one formula, and the CPU tests cover it.
#pragma once
#include <cmath>

#include "kernels/common/hd.hpp"

namespace adgt::math {

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) ----
template <class T>
ADGT_HD T rmsnorm_rstd(T sum_sq, T C, T eps) {
  return T(1) / sqrt(sum_sq / C + eps);
}
template <class T>
ADGT_HD T rmsnorm_out(T x, T rstd, T w) {
  return (x * rstd) * w;
}
// Backward: with dot = sum_c dy_c w_c x_c over the row, k = rmsnorm_k(dot, rstd, C),
// dx_c = dy_c w_c rstd - x_c k; the weight gradient's row term is dy_c x_c rstd.
template <class T>
ADGT_HD T rmsnorm_k(T dot, T rstd, T C) {
  return dot * rstd * rstd * rstd / C;
}
template <class T>
ADGT_HD T rmsnorm_dx(T dy, T w, T x, T rstd, T k) {
  return dy * w * rstd - x * k;
}

// ---- softmax / cross-entropy over a row of logits ----
// Running (max m, sum s of exp(x - m)) merged with another part (m2, s2):
// the online-softmax step (Milakov & Gimelshein) for rows read in chunks.
template <class T>
ADGT_HD void softmax_merge(T& m, T& s, T m2, T s2) {
  if (m2 > m) {
    s = s * exp(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * exp(m2 - m);
  }
}
// The loss of a row: log S + M - x_target.
template <class T>
ADGT_HD T cross_entropy_loss(T M, T S, T x_target) {
  return log(S) + M - x_target;
}
// d loss / d x_j, times scale: (exp(x_j - M) / S - [j == target]) * scale.
template <class T>
ADGT_HD T cross_entropy_grad(T x, T M, T inv_S, bool is_target, T scale) {
  return (exp(x - M) * inv_S - (is_target ? T(1) : T(0))) * scale;
}

}  // namespace adgt::math
