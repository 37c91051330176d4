#include "parallel/compress/chunk_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/bf16.hpp"
#include "parallel/compress/block_codec.hpp"

namespace adgt::compress {

bool compressible(const ParamSpec& p, int64_t min_elems) {
  return p.shape.size() == 2 && p.numel >= min_elems;
}

ChunkLayout chunk_layout(const std::vector<ParamSpec>& table, int64_t lo, int64_t hi, int64_t min_elems) {
  ChunkLayout c;
  c.n = hi - lo;
  // The compressed ranges inside [lo, hi), ascending (the table is in offset order).
  std::vector<std::pair<int64_t, int64_t>> comp;
  for (const ParamSpec& p : table) {
    if (!compressible(p, min_elems)) continue;
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) comp.push_back({a - lo, b - lo});
  }
  std::sort(comp.begin(), comp.end());
  int64_t at = 0;
  for (const auto& [a, b] : comp) {
    if (a > at) c.exact.push_back({at, a});
    at = std::max(at, b);
  }
  if (at < c.n) c.exact.push_back({at, c.n});
  for (const auto& [a, b] : c.exact) c.exact_n += b - a;
  return c;
}

int64_t exact_elem_bytes(Level l) { return l == Level::Int2 || l == Level::Int3 ? 2 : 4; }

int64_t chunk_words(Level l, const ChunkLayout& c) {
  const int64_t packed = c.n - c.exact_n;
  const int64_t bytes = exact_elem_bytes(l) * c.exact_n + (packed > 0 ? encoded_bytes(l, packed) : 0);
  return (bytes + 3) / 4;
}

namespace {
// Calls f(a, b, exact) for the runs of the chunk in order.
template <class F>
void for_runs(const ChunkLayout& c, F&& f) {
  int64_t at = 0;
  for (const auto& [a, b] : c.exact) {
    if (a > at) f(at, a, false);
    f(a, b, true);
    at = b;
  }
  if (at < c.n) f(at, c.n, false);
}
}  // namespace

void encode_chunk(Level l, const ChunkLayout& c, const float* v, uint8_t* out, float* residual) {
  const int64_t packed = c.n - c.exact_n;
  std::vector<float> pk(static_cast<size_t>(packed)), dec;
  uint8_t* ex = out;
  const int64_t eb = exact_elem_bytes(l);
  int64_t e = 0, p = 0;
  for_runs(c, [&](int64_t a, int64_t b, bool exact) {
    if (exact && eb == 4) {
      std::memcpy(ex + 4 * e, v + a, size_t(b - a) * 4);
      e += b - a;
      if (residual) std::fill(residual + a, residual + b, 0.0f);
    } else if (exact) {  // bf16 with error feedback
      for (int64_t i = a; i < b; ++i, ++e) {
        const bf16_bits h = float_to_bf16(v[i]);
        std::memcpy(ex + 2 * e, &h, 2);
        if (residual) {
          const float r = v[i] - bf16_to_float(h);
          residual[i] = std::isfinite(r) ? r : 0.0f;
        }
      }
    } else {
      std::copy(v + a, v + b, pk.begin() + p);
      p += b - a;
    }
  });
  const int64_t words = chunk_words(l, c);
  const int64_t used = eb * c.exact_n + (packed > 0 ? encoded_bytes(l, packed) : 0);
  std::memset(out + used, 0, size_t(4 * words - used));
  if (packed == 0) return;
  uint8_t* enc = out + eb * c.exact_n;
  encode(l, pk.data(), packed, enc);
  if (!residual) return;
  dec.resize(size_t(packed));
  decode(l, enc, packed, dec.data());
  p = 0;
  for_runs(c, [&](int64_t a, int64_t b, bool exact) {
    if (exact) return;
    for (int64_t i = a; i < b; ++i, ++p) {
      const float r = v[i] - dec[size_t(p)];
      residual[i] = std::isfinite(r) ? r : 0.0f;
    }
  });
}

void decode_chunk(Level l, const ChunkLayout& c, const uint8_t* in, float* out, bool add) {
  const int64_t packed = c.n - c.exact_n;
  const int64_t eb = exact_elem_bytes(l);
  std::vector<float> dec(static_cast<size_t>(packed));
  if (packed > 0) decode(l, in + eb * c.exact_n, packed, dec.data());
  int64_t e = 0, p = 0;
  for_runs(c, [&](int64_t a, int64_t b, bool exact) {
    for (int64_t i = a; i < b; ++i) {
      float x;
      if (exact && eb == 4) {
        std::memcpy(&x, in + 4 * e, 4);
        ++e;
      } else if (exact) {
        bf16_bits h;
        std::memcpy(&h, in + 2 * e, 2);
        x = bf16_to_float(h);
        ++e;
      } else {
        x = dec[size_t(p++)];
      }
      out[i] = add ? out[i] + x : x;
    }
  });
}

}  // namespace adgt::compress
