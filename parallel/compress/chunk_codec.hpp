// One chunk of a bucket (a contiguous range of the flat gradient buffer) as
// the quantized reduce sends it: the elements of tensors the level
// compresses, and the rest sent exact as fp32 — 1-D tensors (norms, biases),
// tensors of fewer than Settings::min_elems elements, and the padding between
// tensors. An encoded chunk is [the exact elements, fp32, in order][the
// compressed elements packed in order and encoded by block_codec.hpp],
// padded to whole 32-bit words (the reduce sends it as I32 words).
//
// At int2 and int3 the "exact" elements go as bf16 (round to nearest even) with error
// feedback instead of fp32: at 0.26-0.38 bytes per compressed element, fp32 norms
// would be a tenth of the bytes of a small model's chunk. They stay
// uncompressed by block quantization (their own rounding only, 2^-8
// relative), and their rounding error joins the residual like the others'.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/model/param_table.hpp"
#include "parallel/compress/level.hpp"

namespace adgt::compress {

// Whether a tensor is compressed: 2-D and at least min_elems elements.
bool compressible(const ParamSpec& p, int64_t min_elems);

struct ChunkLayout {
  int64_t n = 0;  // elements of the chunk
  std::vector<std::pair<int64_t, int64_t>> exact;  // runs [a, b) sent exact, relative to the chunk, ascending
  int64_t exact_n = 0;                             // elements in them
};

// The layout of flat range [lo, hi): exact everywhere but where a
// compressible tensor of `table` lies.
ChunkLayout chunk_layout(const std::vector<ParamSpec>& table, int64_t lo, int64_t hi, int64_t min_elems);

// Bytes per element of the chunk's exact elements at level l: 4 (fp32), 2 at
// Int2 and Int3 (bf16, with error feedback).
int64_t exact_elem_bytes(Level l);
// 32-bit words of an encoded chunk.
int64_t chunk_words(Level l, const ChunkLayout& c);
// Encodes v[0, c.n) into out (chunk_words words). With `residual` (c.n
// elements; may be null) sets residual = v - decode(encode(v)) (0 where
// that is not finite: a NaN block is sent, not kept): error feedback; it is
// 0 on exact elements sent in fp32.
void encode_chunk(Level l, const ChunkLayout& c, const float* v, uint8_t* out, float* residual);
// Decodes an encoded chunk into out[0, c.n), or adds it (one fp32 addition
// per element) when `add`.
void decode_chunk(Level l, const ChunkLayout& c, const uint8_t* in, float* out, bool add);

}  // namespace adgt::compress
