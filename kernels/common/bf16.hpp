// bfloat16 <-> float on the host and the device, bit for bit the same rounding
// (round to nearest, ties to even; NaN stays a quiet NaN). The storage type is
// a plain uint16_t so host code (the CPU backend, checkpoints, tests) and
// device code share one definition; CUDA kernels may equally use
// __nv_bfloat16, whose conversions round the same way.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/float_bits.hpp"
#include "kernels/common/hd.hpp"

namespace adgt {

using bf16_bits = uint16_t;

ADGT_HD float bf16_to_float(bf16_bits h) { return bits_float(uint32_t(h) << 16); }

ADGT_HD bf16_bits float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))  // NaN: keep it a (quiet) NaN
    return bf16_bits((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (overflow goes to inf)
  return bf16_bits(u >> 16);
}

// The float nearest to f that bf16 represents (what a bf16 store then load gives).
ADGT_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace adgt
