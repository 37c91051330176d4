#include "parallel/compress/rms_codec.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"
#include "parallel/compress/block_codec.hpp"

namespace adgt::compress {

namespace {

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

void check_bits(int bits) {
  ADGT_CHECK(bits == 2 || bits == 3, "compress::rms codec: " << bits << " bits (2 or 3)");
}

constexpr double kFactors2[] = {1.0};
constexpr double kFactors3[] = {75.0 / 128.0, 0.75, 1.0};
constexpr double kKappaGauss = 0.75, kKappaLaplace = 0.66;

// floor(x / s) clamped to [-L/2, L/2 - 1], as the code q + L/2; L/2 (q = 0)
// for a zero or NaN step.
inline unsigned code(float x, float s, int half) {
  if (!(s > 0.0f)) return unsigned(half);
  float q = std::floor(x / s);
  q = q > float(half - 1) ? float(half - 1) : q < -float(half) ? -float(half) : q;
  return unsigned(int(q) + half);
}

inline float level(unsigned c, float s, int half) { return (float(int(c) - half) + 0.5f) * s; }

// The code of element i, `bits` bits at bit bits * i (a code may straddle two bytes).
inline unsigned read_code(const uint8_t* p, int64_t i, int bits) {
  const int64_t bit = int64_t(bits) * i;
  unsigned w = p[bit / 8];
  if ((bit % 8) + bits > 8) w |= unsigned(p[bit / 8 + 1]) << 8;
  return (w >> (bit % 8)) & ((1u << bits) - 1);
}

inline void write_code(uint8_t* p, int64_t i, int bits, unsigned c) {
  const int64_t bit = int64_t(bits) * i;
  const unsigned w = c << (bit % 8);
  p[bit / 8] |= uint8_t(w & 0xFF);
  if ((bit % 8) + bits > 8) p[bit / 8 + 1] |= uint8_t(w >> 8);
}

// The block's step: c * rms rounded to bf16, c by the block's shape
// (rms_step_factors); NaN when an element is not finite.
bf16_bits block_step(const float* x, int64_t m, int bits) {
  double sq = 0, ab = 0;
  bool finite = true;
  for (int64_t i = 0; i < m; ++i) {
    finite &= std::isfinite(x[i]);
    sq += double(x[i]) * double(x[i]);
    ab += std::fabs(double(x[i]));
  }
  if (!finite) return float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  const double rms = std::sqrt(sq / double(m));
  if (!(rms > 0)) return float_to_bf16(0.0f);
  const double* cs = nullptr;
  const int nc = rms_step_factors(bits, &cs);
  int k = 0;
  if (nc == 3) {
    const double kappa = ab / (double(m) * rms);  // mean |x| / rms
    k = kappa >= kKappaGauss ? 0 : kappa >= kKappaLaplace ? 1 : 2;
  }
  return float_to_bf16(float(cs[k] * rms));
}

}  // namespace

int rms_step_factors(int bits, const double** c) {
  check_bits(bits);
  *c = bits == 2 ? kFactors2 : kFactors3;
  return bits == 2 ? 1 : 3;
}

int64_t rms_encoded_bytes(int bits, int64_t n) {
  check_bits(bits);
  return 2 * blocks_of(n) + (int64_t(bits) * n + 7) / 8;
}

void rms_encode(int bits, const float* x, int64_t n, uint8_t* out) {
  check_bits(bits);
  const int64_t nb = blocks_of(n);
  const int half = 1 << (bits - 1);
  uint8_t* payload = out + 2 * nb;
  std::memset(payload, 0, size_t((int64_t(bits) * n + 7) / 8));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    const bf16_bits h = block_step(x + lo, hi - lo, bits);
    std::memcpy(out + 2 * b, &h, 2);
    const float s = bf16_to_float(h);
    for (int64_t i = lo; i < hi; ++i) write_code(payload, i, bits, code(x[i], s, half));
  }
}

void rms_decode(int bits, const uint8_t* in, int64_t n, float* out, bool add) {
  check_bits(bits);
  const int64_t nb = blocks_of(n);
  const int half = 1 << (bits - 1);
  const uint8_t* payload = in + 2 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    bf16_bits h;
    std::memcpy(&h, in + 2 * b, 2);
    const float s = bf16_to_float(h);
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    for (int64_t i = lo; i < hi; ++i) {
      // A NaN step decodes to NaN; a zero one to 0.
      const float v = level(read_code(payload, i, bits), s, half);
      out[i] = add ? out[i] + v : v;
    }
  }
}

}  // namespace adgt::compress
