// The low-bit element codecs of levels int2 and int3 (docs/compression.md),
// pure host functions over fp32 spans; block_codec.hpp's encode/decode call
// them for Level::Int2 (bits = 2) and Level::Int3 (bits = 3).
//
// Blocks of kBlock elements (the last one may be shorter). Per block a step
// s, stored as bf16, and per element, with L = 2^bits levels,
//   q = clamp(floor(x / s), -L/2, L/2 - 1), decoded (q + 1/2) s,
// a uniform quantizer with step s and no zero level (int2: +-s/2, +-3s/2;
// int3: +-s/2 ... +-7s/2). Every x with |x| <= (L/2) s decodes within s/2;
// beyond it x decodes to the outer level and error feedback carries the rest.
// (q + 1/2) s has at most bits + 8 significant bits, so decoding is exact
// arithmetic in fp32.
//
// The step is a multiple c of the block's root mean square r (summed in
// double, in order), rounded to bf16 (to nearest, ties to even):
//   int2: c = 1 (within 2% of the step that minimises the squared error of
//         Gaussian data: 0.117 relative on N(0, 1) blocks);
//   int3: c by the block's shape kappa = mean |x| / r (in double, in order;
//         0.80 for Gaussian data, 0.71 for Laplacian): 75/128 ~ 0.586 (the
//         best uniform step of Gaussian data, 0.037 relative) when kappa >=
//         0.75, 3/4 (Laplacian's best, 0.070) when kappa >= 0.66, else 1
//         (heavier tails). In a numpy model this comes within 1.5% of the
//         error of trying the three steps and keeping the best (Gaussian,
//         Laplacian, Student t3/t5 blocks and mixtures), at one pass over
//         the block instead of four; an all-zero block gets step 0.
//
// Layout of n elements: the block steps (bf16, 2 bytes each, little endian)
// and then the codes q + L/2, `bits` bits each, element i at bit bits * i of
// the little-endian payload (int2: element 4j + k in bits 2k, 2k + 1 of byte
// j). A block with a non-finite element gets a NaN step and decodes to NaN;
// an all-zero block decodes to zeros.
#pragma once
#include <cstdint>

namespace adgt::compress {

// Bytes of n elements encoded with `bits` (2 or 3) bits per element.
int64_t rms_encoded_bytes(int bits, int64_t n);
// Encodes x[0, n) into out[0, rms_encoded_bytes(bits, n)).
void rms_encode(int bits, const float* x, int64_t n, uint8_t* out);
// Decodes into out[0, n), or adds to it (one fp32 addition per element).
void rms_decode(int bits, const uint8_t* in, int64_t n, float* out, bool add);

// The step factors c of `bits` (int2: {1}; int3: {75/128, 3/4, 1}).
int rms_step_factors(int bits, const double** c);

}  // namespace adgt::compress
