// The element codecs of gradient compression, pure host functions over fp32
// spans (docs/compression.md has the byte counts and measured speeds):
//
//   Bf16: each element rounded to bf16 (to nearest, ties to even; NaN stays
//         NaN), 2 bytes.
//   Int8: blocks of kBlock elements (the last one may be shorter); per block
//         an fp32 scale s = absmax/127 and q_i = round_half_even(x_i / s)
//         clamped to [-127, 127]; decode q_i * s. |x - decode| <= s/2.
//   Int4: the same with absmax/7 and q in [-7, 7], two per byte (element 2j
//         in the low nibble, 2j+1 in the high one, as q + 8).
//   Int2: blocks of kBlock with a bf16 step s (the block's rms) and q in
//         {-2, -1, 0, 1} decoded (q + 1/2) s, four per byte;
//   Int3: likewise with q in [-4, 3], 3 bits each, and s the best of three
//         multiples of the rms (rms_codec.hpp has both layouts).
//
// Layout of an encoding of n elements (Int8, Int4): the block scales (fp32,
// little endian, one per block) and then the payload; encoded_bytes gives its size.
// Rounding is deterministic (no random rounding): every rank encodes the
// same values to the same bytes. A block with a non-finite element gets a
// NaN scale, so it decodes to NaN (the step's gradient norm is then
// non-finite and the trainer skips the update).
#pragma once
#include <cstdint>

#include "parallel/compress/level.hpp"

namespace adgt::compress {

constexpr int64_t kBlock = 256;  // elements per quantization block (int8, int4)

// Bytes of n elements encoded at `l` (a quantized level: Bf16, Int8, Int4, Int3 or Int2).
int64_t encoded_bytes(Level l, int64_t n);
// Encodes x[0, n) into out[0, encoded_bytes(l, n)).
void encode(Level l, const float* x, int64_t n, uint8_t* out);
// Decodes an encoding of n elements into out[0, n).
void decode(Level l, const uint8_t* in, int64_t n, float* out);
// Decodes and adds: out[i] += decoded[i] (one fp32 addition per element).
void decode_add(Level l, const uint8_t* in, int64_t n, float* out);

}  // namespace adgt::compress
