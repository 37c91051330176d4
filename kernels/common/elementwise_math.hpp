// Per-element math shared by the CPU and CUDA backends (host/device).
#pragma once
#include <cmath>

#include "kernels/common/hd.hpp"

namespace adgt::math {

// SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g). Each backend computes
// s = sigmoid(g) = 1 / (1 + exp(-g)) with its own fast exp and passes it in.
template <class T>
ADGT_HD T swiglu(T g, T u, T s) {
  return g * s * u;
}
// d h / d g and d h / d u, times dh.
template <class T>
ADGT_HD void swiglu_grad(T g, T u, T dh, T s, T& dg, T& du) {
  T silu = g * s;
  du = dh * silu;
  dg = dh * u * s * (T(1) + g * (T(1) - s));
}

// Rotary embedding (HuggingFace rotate-half): the pair (x[i], x[i + hd/2]) is
// rotated by angle pos * theta^(-2i/hd).
template <class T>
ADGT_HD void rope_rotate(T& a, T& b, T c, T s) {
  T x = a, y = b;
  a = x * c - y * s;
  b = y * c + x * s;
}
// The transpose (inverse) rotation, for the backward.
template <class T>
ADGT_HD void rope_rotate_back(T& a, T& b, T c, T s) {
  T x = a, y = b;
  a = x * c + y * s;
  b = y * c - x * s;
}

// AdamW in PyTorch's order (torch.optim.AdamW, single-tensor path):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
template <class T>
ADGT_HD void adamw_update(T& p, T g, T& m, T& v, T lr, T b1, T b2, T eps, T wd, T bc1, T sqrt_bc2) {
  p = p * (T(1) - lr * wd);
  m = m + (T(1) - b1) * (g - m);  // == b1*m + (1-b1)*g, as torch's lerp_
  v = v * b2 + (T(1) - b2) * g * g;
  T denom = sqrt(v) / sqrt_bc2 + eps;
  p = p - (lr / bc1) * (m / denom);
}

}  // namespace adgt::math
