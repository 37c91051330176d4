// FP8 (OCP 8-bit floating point, as Hopper's tensor cores read it) <-> float
// on the host and the device, bit for bit what the hardware's
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 gives (docs/fp8.md):
//  - E4M3 ("fn": no infinities): 1 sign, 4 exponent (bias 7), 3 mantissa
//    bits; largest finite 448, smallest subnormal 2^-9; 0x7f/0xff are NaN.
//  - E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; largest finite
//    57344, smallest subnormal 2^-16; exponent 31 is inf (mantissa 0) or NaN.
// float -> fp8 rounds to nearest, ties to even, saturating: every finite value
// beyond the largest finite (and +-inf) becomes +-448 / +-57344; NaN becomes
// the canonical NaN 0x7f (sign dropped, as CUDA's conversions do). fp8 ->
// float is exact (NaN -> a positive quiet NaN).
//
// Scales are powers of two (fp8_scale_exponent): x * 2^n and q / 2^n are
// exact in fp32, so a scaled cast is the plain cast of a shifted value and a
// dequantized fp8 value is exactly the product a tensor core accumulates.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/float_bits.hpp"
#include "kernels/common/hd.hpp"

namespace adgt {

enum class Fp8Kind : uint8_t { E4M3, E5M2 };

namespace fp8_detail {
// M mantissa bits, exponent bias B, MAXBITS: the float bits of the largest
// finite value, MAXCODE its fp8 code.
template <int M, int B, uint32_t MAXBITS, uint8_t MAXCODE>
ADGT_HD uint8_t encode(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                 // NaN
  if (a >= MAXBITS) return uint8_t(sign | MAXCODE);  // saturate (and +-inf)
  const int e = int(a >> 23) - 127;                  // unbiased exponent (-127: zero/denormal)
  constexpr int kMinNormal = 1 - B;
  if (e >= kMinNormal) {
    // Normal in fp8: round the 23-bit mantissa to M bits, nearest even; a
    // carry moves into the exponent (and stays below MAXBITS' code).
    constexpr int kShift = 23 - M;
    const uint32_t r = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
    return uint8_t(sign | (r - (uint32_t(127 - B) << M)));
  }
  // Subnormal in fp8: value = mant * 2^(e-23) in units of 2^(kMinNormal-M).
  if (a < 0x00800000u) return sign;  // zero or a float denormal (far below 2^-17)
  const uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
  const int s = 23 + kMinNormal - M - e;  // > 23 - M
  if (s > 25) return sign;                // below a quarter unit: zero
  const uint32_t q = mant >> s, rest = mant & ((1u << s) - 1u), half = 1u << (s - 1);
  const uint32_t r = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
  return uint8_t(sign | r);  // r == 2^M is the smallest normal's code
}
}  // namespace fp8_detail

ADGT_HD uint8_t float_to_e4m3(float f) {
  return fp8_detail::encode<3, 7, 0x43e00000u /*448*/, 0x7e>(f);
}
ADGT_HD uint8_t float_to_e5m2(float f) {
  return fp8_detail::encode<2, 15, 0x47600000u /*57344*/, 0x7b>(f);
}

ADGT_HD float e4m3_to_float(uint8_t c) {
  const uint32_t s = uint32_t(c & 0x80u) << 24, em = c & 0x7fu;
  if (em == 0x7fu) return bits_float(0x7fc00000u);
  const uint32_t e = em >> 3, m = em & 7u;
  if (e == 0) return bits_float(s | float_bits(float(m) * 0.001953125f));  // m 2^-9
  return bits_float(s | ((e - 7u + 127u) << 23) | (m << 20));
}
ADGT_HD float e5m2_to_float(uint8_t c) {
  const uint32_t s = uint32_t(c & 0x80u) << 24, em = c & 0x7fu;
  const uint32_t e = em >> 2, m = em & 3u;
  if (e == 31u) return bits_float(m ? 0x7fc00000u : (s | 0x7f800000u));
  if (e == 0) return bits_float(s | float_bits(float(m) * 1.52587890625e-05f));  // m 2^-16
  return bits_float(s | ((e - 15u + 127u) << 23) | (m << 21));
}

ADGT_HD uint8_t float_to_fp8(float f, Fp8Kind k) {
  return k == Fp8Kind::E4M3 ? float_to_e4m3(f) : float_to_e5m2(f);
}
ADGT_HD float fp8_to_float(uint8_t c, Fp8Kind k) {
  return k == Fp8Kind::E4M3 ? e4m3_to_float(c) : e5m2_to_float(c);
}
// The largest finite value: 448 (E4M3), 57344 (E5M2).
ADGT_HD float fp8_max(Fp8Kind k) { return k == Fp8Kind::E4M3 ? 448.0f : 57344.0f; }

// The scale exponent n of a tensor whose largest magnitude is `amax`: the
// largest n with amax * 2^n <= fp8_max(k), less `margin` (a headroom in
// binades). Exact (from amax's float bits, no log2). amax zero, denormal,
// infinite or NaN: 0 (scale 1: a tensor of zeros casts to zeros at any
// scale; a non-finite one makes the step non-finite and it is skipped).
// Clamped to [-100, 100].
ADGT_HD int fp8_scale_exponent(float amax, Fp8Kind k, int margin) {
  const uint32_t a = float_bits(amax) & 0x7fffffffu;
  if (a < 0x00800000u || a >= 0x7f800000u) return 0;
  // amax = f 2^kx, f in [1, 2); fp8_max = 1.75 2^emax.
  const int kx = int(a >> 23) - 127;
  const int emax = k == Fp8Kind::E4M3 ? 8 : 15;
  const bool above = (a & 0x007fffffu) > 0x00600000u;  // f > 1.75
  int n = emax - kx - (above ? 1 : 0) - margin;
  return n < -100 ? -100 : n > 100 ? 100 : n;
}
// 2^n as a float (n in [-126, 127]).
ADGT_HD float pow2f(int n) { return bits_float(uint32_t(n + 127) << 23); }

}  // namespace adgt
