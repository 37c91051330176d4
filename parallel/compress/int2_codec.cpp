#include "parallel/compress/int2_codec.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/bf16.hpp"
#include "parallel/compress/block_codec.hpp"

namespace adgt::compress {

namespace {

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

// The block's rms rounded to bf16; NaN when an element is not finite.
bf16_bits rms_scale(const float* x, int64_t m) {
  double sq = 0;
  bool finite = true;
  for (int64_t i = 0; i < m; ++i) {
    finite &= std::isfinite(x[i]);
    sq += double(x[i]) * double(x[i]);
  }
  if (!finite) return float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  return float_to_bf16(float(std::sqrt(sq / double(m))));
}

// floor(x / s) clamped to [-2, 1], as the code q + 2; 2 (q = 0) for a zero or NaN scale.
inline unsigned code(float x, float s) {
  if (!(s > 0.0f)) return 2;
  float q = std::floor(x / s);
  q = q > 1.0f ? 1.0f : q < -2.0f ? -2.0f : q;
  return unsigned(int(q) + 2);
}

}  // namespace

int64_t int2_encoded_bytes(int64_t n) { return 2 * blocks_of(n) + (n + 3) / 4; }

void int2_encode(const float* x, int64_t n, uint8_t* out) {
  const int64_t nb = blocks_of(n);
  uint8_t* payload = out + 2 * nb;
  std::memset(payload, 0, size_t((n + 3) / 4));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    const bf16_bits h = rms_scale(x + lo, hi - lo);
    std::memcpy(out + 2 * b, &h, 2);
    const float s = bf16_to_float(h);
    for (int64_t i = lo; i < hi; ++i) payload[i / 4] |= uint8_t(code(x[i], s) << ((i & 3) * 2));
  }
}

void int2_decode(const uint8_t* in, int64_t n, float* out, bool add) {
  const int64_t nb = blocks_of(n);
  const uint8_t* payload = in + 2 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    bf16_bits h;
    std::memcpy(&h, in + 2 * b, 2);
    const float s = bf16_to_float(h);
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    for (int64_t i = lo; i < hi; ++i) {
      const int q = int((payload[i / 4] >> ((i & 3) * 2)) & 3) - 2;
      // A NaN scale decodes to NaN; a zero one to 0 (the code of q = 0 is 1/2).
      const float v = (float(q) + 0.5f) * s;
      out[i] = add ? out[i] + v : v;
    }
  }
}

}  // namespace adgt::compress
