// Vectorisable transcendental functions for the CPU backend's hot loops
// (softmax, cross-entropy, SwiGLU). std::exp on float does not vectorise
// without -ffast-math; this Cephes-style expf does under `omp simd`, to
// within 2 ulp, and propagates NaN. double keeps std::exp (reference paths).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace adgt::cpu {

inline float vexp(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447505531f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  const float fx = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t e = (int32_t(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  const float out = y * scale;
  return x != x ? x : out;  // NaN in, NaN out
}
inline double vexp(double x) { return std::exp(x); }

}  // namespace adgt::cpu
