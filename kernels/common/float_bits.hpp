// A float's bits and back, on the host and the device (the conversions of
// bf16.hpp and fp8.hpp work on them).
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/hd.hpp"

namespace adgt {

ADGT_HD uint32_t float_bits(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, 4);
#endif
  return u;
}

ADGT_HD float bits_float(uint32_t u) {
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(u);
#else
  std::memcpy(&f, &u, 4);
#endif
  return f;
}

}  // namespace adgt
