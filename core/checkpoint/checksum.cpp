#include "core/checkpoint/checksum.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ADGT_CRC_PCLMUL 1
#endif

namespace adgt {
namespace {

constexpr uint32_t kPoly = 0xEDB88320u;  // reflected 0x04C11DB7

// Slicing-by-16 tables: kTables[0] is the classic byte table; kTables[k][b] is
// the CRC of byte b followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 16>;
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 16; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  return t;
}
constexpr Tables kTables = make_tables();

inline uint32_t load_le32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts only (checked in checkpoint.cpp)
  return v;
}

// a * b modulo the CRC polynomial (reflected bit order), from zlib 1.2.12+.
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0..31.
constexpr std::array<uint32_t, 32> make_x2n() {
  std::array<uint32_t, 32> t{};
  uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (int n = 1; n < 32; ++n) {
    // constexpr copy of multmodp(p, p)
    uint32_t a = p, b = p, m = 1u << 31, r = 0;
    for (;;) {
      if (a & m) {
        r ^= b;
        if ((a & (m - 1)) == 0) break;
      }
      m >>= 1;
      b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
    }
    t[n] = p = r;
  }
  return t;
}
constexpr std::array<uint32_t, 32> kX2n = make_x2n();

// x^(n * 2^k) modulo the polynomial.
uint32_t x2nmodp(uint64_t n, unsigned k) {
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(kX2n[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}

#ifdef ADGT_CRC_PCLMUL
// Carry-less-multiply folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ", 2009; constants as in Linux
// arch/x86/crypto/crc32-pclmul_asm.S). `c` is the raw (uninverted) register;
// len >= 64 and a multiple of 16. Chosen at run time when the CPU has PCLMUL.
#define ADGT_PCLMUL_TARGET __attribute__((target("pclmul,sse4.1")))
ADGT_PCLMUL_TARGET inline __m128i load128(const unsigned char* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}
// x.lo * k.lo ^ x.hi * k.hi ^ data: moves x forward over 128 bits (k1k2: 512 bits).
ADGT_PCLMUL_TARGET inline __m128i fold(__m128i x, __m128i k, __m128i data) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}
ADGT_PCLMUL_TARGET uint32_t crc32_fold_pclmul(uint32_t c, const unsigned char* p,
                                                                     size_t len) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^(4*128+32), x^(4*128-32) mod P
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^(128+32), x^(128-32) mod P
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);               // x^64 mod P
  const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);   // mu', P' (bit-reflected)
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(load128(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x2 = load128(p + 16), x3 = load128(p + 32), x4 = load128(p + 48);
  p += 64;
  len -= 64;
  for (; len >= 64; p += 64, len -= 64) {
    x1 = fold(x1, k1k2, load128(p));
    x2 = fold(x2, k1k2, load128(p + 16));
    x3 = fold(x3, k1k2, load128(p + 32));
    x4 = fold(x4, k1k2, load128(p + 48));
  }
  x1 = fold(x1, k3k4, x2);
  x1 = fold(x1, k3k4, x3);
  x1 = fold(x1, k3k4, x4);
  for (; len >= 16; p += 16, len -= 16) x1 = fold(x1, k3k4, load128(p));
  // 128 -> 64 bits (also appends 32 zero bits), 64 -> 32, then Barrett reduction.
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k3k4, 0x10));
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(t, x1), 1));
}

const bool kHavePclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif

// Slicing-by-16 on the raw (uninverted) register.
uint32_t crc32_table(uint32_t c, const unsigned char* p, size_t bytes) {
  const auto& T = kTables;
  while (bytes >= 16) {
    const uint32_t a = load_le32(p) ^ c, b = load_le32(p + 4), d = load_le32(p + 8),
                   e = load_le32(p + 12);
    c = T[15][a & 0xFF] ^ T[14][(a >> 8) & 0xFF] ^ T[13][(a >> 16) & 0xFF] ^ T[12][a >> 24] ^
        T[11][b & 0xFF] ^ T[10][(b >> 8) & 0xFF] ^ T[9][(b >> 16) & 0xFF] ^ T[8][b >> 24] ^
        T[7][d & 0xFF] ^ T[6][(d >> 8) & 0xFF] ^ T[5][(d >> 16) & 0xFF] ^ T[4][d >> 24] ^
        T[3][e & 0xFF] ^ T[2][(e >> 8) & 0xFF] ^ T[1][(e >> 16) & 0xFF] ^ T[0][e >> 24];
    p += 16;
    bytes -= 16;
  }
  while (bytes--) c = (c >> 8) ^ T[0][(c ^ *p++) & 0xFF];
  return c;
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#ifdef ADGT_CRC_PCLMUL
  if (kHavePclmul && bytes >= 64) {
    const size_t body = bytes & ~size_t(15);
    c = crc32_fold_pclmul(c, p, body);
    p += body;
    bytes -= body;
  }
#endif
  return ~crc32_table(c, p, bytes);
}

uint32_t crc32_update_portable(uint32_t crc, const void* data, size_t bytes) {
  return ~crc32_table(~crc, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  return multmodp(x2nmodp(bytes_b, 3), crc_a) ^ crc_b;
}

std::vector<uint32_t> crc32_many(const std::vector<ByteRange>& ranges) {
  constexpr size_t kPiece = size_t(16) << 20;
  struct Piece {
    size_t range;
    size_t lo, len;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const size_t n = ranges[r].bytes;
    if (n == 0) pieces.push_back({r, 0, 0});
    for (size_t lo = 0; lo < n; lo += kPiece) pieces.push_back({r, lo, std::min(kPiece, n - lo)});
  }
  std::vector<uint32_t> part(pieces.size());
  const int64_t np = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < np; ++i) {
    const Piece& pc = pieces[static_cast<size_t>(i)];
    part[static_cast<size_t>(i)] =
        crc32(static_cast<const unsigned char*>(ranges[pc.range].data) + pc.lo, pc.len);
  }
  // Pieces of one range are consecutive and in order: fold them left to right.
  std::vector<uint32_t> out(ranges.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& pc = pieces[i];
    out[pc.range] = pc.lo == 0 ? part[i] : crc32_combine(out[pc.range], part[i], pc.len);
  }
  return out;
}

}  // namespace adgt
