#include "parallel/compress/block_codec.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"
#include "parallel/compress/rms_codec.hpp"

namespace adgt::compress {

namespace {

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

// The bits of an rms-step level (rms_codec.hpp), 0 for the others.
int rms_bits(Level l) { return l == Level::Int2 ? 2 : l == Level::Int3 ? 3 : 0; }

int qmax_of(Level l) { return l == Level::Int8 ? 127 : 7; }

// Bytes of the quantized payload of n elements.
int64_t payload_bytes(Level l, int64_t n) { return l == Level::Int8 ? n : (n + 1) / 2; }

void check_level(Level l, const char* what) {
  ADGT_CHECK(quantized(l), "compress::" << what << ": level " << level_name(l)
                                         << " has no element codec (bf16, int8, int4, int3 or int2)");
}

// The scale of block x[0, m): absmax / qmax; NaN when an element is not finite.
float block_scale(const float* x, int64_t m, int qmax) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < m; ++i) {
    const float a = std::fabs(x[i]);
    finite &= std::isfinite(a);
    amax = a > amax ? a : amax;
  }
  if (!finite) return std::numeric_limits<float>::quiet_NaN();
  return amax / float(qmax);
}

// round(x / s) half to even, clamped to [-qmax, qmax]; 0 for a zero scale.
inline int quantize(float x, float s, int qmax) {
  if (!(s > 0.0f)) return 0;
  float q = std::nearbyint(x / s);  // the default rounding mode: to nearest, ties to even
  q = q > float(qmax) ? float(qmax) : q < -float(qmax) ? -float(qmax) : q;
  return int(q);
}

template <bool Add>
void decode_impl(Level l, const uint8_t* in, int64_t n, float* out) {
  check_level(l, "decode");
  if (l == Level::Bf16) {
    for (int64_t i = 0; i < n; ++i) {
      bf16_bits h;
      std::memcpy(&h, in + 2 * i, 2);
      const float v = bf16_to_float(h);
      out[i] = Add ? out[i] + v : v;
    }
    return;
  }
  if (rms_bits(l)) return rms_decode(rms_bits(l), in, n, out, Add);
  const int64_t nb = blocks_of(n);
  const uint8_t* payload = in + 4 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    float s;
    std::memcpy(&s, in + 4 * b, 4);
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    if (l == Level::Int8) {
      for (int64_t i = lo; i < hi; ++i) {
        const float v = float(int8_t(payload[i])) * s;
        out[i] = Add ? out[i] + v : v;
      }
    } else {
      for (int64_t i = lo; i < hi; ++i) {
        const int nib = (payload[i / 2] >> ((i & 1) * 4)) & 0xF;
        const float v = float(nib - 8) * s;
        out[i] = Add ? out[i] + v : v;
      }
    }
    // A NaN scale decodes to NaN even where q = 0 (0 * NaN is NaN): kept.
  }
}

}  // namespace

int64_t encoded_bytes(Level l, int64_t n) {
  check_level(l, "encoded_bytes");
  if (l == Level::Bf16) return 2 * n;
  if (rms_bits(l)) return rms_encoded_bytes(rms_bits(l), n);
  return 4 * blocks_of(n) + payload_bytes(l, n);
}

void encode(Level l, const float* x, int64_t n, uint8_t* out) {
  check_level(l, "encode");
  if (l == Level::Bf16) {
    for (int64_t i = 0; i < n; ++i) {
      const bf16_bits h = float_to_bf16(x[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  }
  if (rms_bits(l)) return rms_encode(rms_bits(l), x, n, out);
  const int qmax = qmax_of(l);
  const int64_t nb = blocks_of(n);
  uint8_t* payload = out + 4 * nb;
  if (l == Level::Int4) std::memset(payload, 0, size_t(payload_bytes(l, n)));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    const float s = block_scale(x + lo, hi - lo, qmax);
    std::memcpy(out + 4 * b, &s, 4);
    if (l == Level::Int8) {
      for (int64_t i = lo; i < hi; ++i) payload[i] = uint8_t(int8_t(quantize(x[i], s, qmax)));
    } else {
      for (int64_t i = lo; i < hi; ++i)
        payload[i / 2] |= uint8_t((quantize(x[i], s, qmax) + 8) << ((i & 1) * 4));
    }
  }
}

void decode(Level l, const uint8_t* in, int64_t n, float* out) { decode_impl<false>(l, in, n, out); }
void decode_add(Level l, const uint8_t* in, int64_t n, float* out) { decode_impl<true>(l, in, n, out); }

}  // namespace adgt::compress
