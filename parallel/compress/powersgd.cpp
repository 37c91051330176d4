#include "parallel/compress/powersgd.hpp"

#include <cmath>
#include <vector>

#include "core/rng.hpp"

namespace adgt::compress {

void init_q(float* q, int64_t k, int r, uint64_t seed, const std::string& name) {
  const uint64_t base = seed ^ hash_string(name);
  for (int64_t i = 0; i < k * r; ++i) {
    // Counter-based: element i's two uniforms from splitmix64 of (base, i).
    uint64_t s = base + 0x632BE59BD9B4E019ull * uint64_t(i + 1);
    const uint64_t a = splitmix64(s), b = splitmix64(s);
    double u1 = double(a >> 11) * 0x1.0p-53, u2 = double(b >> 11) * 0x1.0p-53;
    if (u1 < 1e-300) u1 = 1e-300;
    q[i] = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
}

void mat_mq(const float* M, int64_t m, int64_t k, const float* Q, int r, float* P) {
#pragma omp parallel for schedule(static) if (m * k >= (int64_t(1) << 16))
  for (int64_t i = 0; i < m; ++i) {
    const float* row = M + i * k;
    for (int c = 0; c < r; ++c) {
      float s = 0.0f;
      for (int64_t j = 0; j < k; ++j) s += row[j] * Q[j * r + c];
      P[i * r + c] = s;
    }
  }
}

void mat_mtp(const float* M, int64_t m, int64_t k, const float* P, int r, float* Q) {
  // Each Q row j is summed over the rows of M in order i = 0..m-1.
#pragma omp parallel for schedule(static) if (m * k >= (int64_t(1) << 16))
  for (int64_t j = 0; j < k; ++j) {
    for (int c = 0; c < r; ++c) {
      float s = 0.0f;
      for (int64_t i = 0; i < m; ++i) s += M[i * k + j] * P[i * r + c];
      Q[j * r + c] = s;
    }
  }
}

void mat_pqt(const float* P, const float* Q, int64_t m, int64_t k, int r, float* out, bool subtract) {
#pragma omp parallel for schedule(static) if (m * k >= (int64_t(1) << 16))
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) {
      float s = 0.0f;
      for (int c = 0; c < r; ++c) s += P[i * r + c] * Q[j * r + c];
      out[i * k + j] = subtract ? out[i * k + j] - s : s;
    }
}

void orthonormalize(float* P, int64_t m, int r) {
  for (int c = 0; c < r; ++c) {
    for (int d = 0; d < c; ++d) {
      double dot = 0;
      for (int64_t i = 0; i < m; ++i) dot += double(P[i * r + c]) * double(P[i * r + d]);
      for (int64_t i = 0; i < m; ++i) P[i * r + c] = float(double(P[i * r + c]) - dot * double(P[i * r + d]));
    }
    double nn = 0;
    for (int64_t i = 0; i < m; ++i) nn += double(P[i * r + c]) * double(P[i * r + c]);
    const double norm = std::sqrt(nn);
    // A non-finite gradient stays non-finite (the trainer skips the step).
    const double inv = !std::isfinite(norm) ? std::nan("") : norm > 1e-30 ? 1.0 / norm : 0.0;
    for (int64_t i = 0; i < m; ++i) P[i * r + c] = float(double(P[i * r + c]) * inv);
  }
}

}  // namespace adgt::compress
