// The gradient-compression levels of the data-parallel reduce and the
// settings they run with (docs/compression.md). A level is chosen per
// bucket: from parallel.grad_compression for the whole run, or by a
// controller through GradReducer::set_level.
#pragma once
#include <cstdint>
#include <string>

namespace adgt::compress {

enum class Level : int {
  None = 0,      // L0: the fp32 reduce of an uncompressed run, bit for bit
  Bf16 = 1,      // L1: bf16 (round to nearest even), 2 bytes per element
  Int8 = 2,      // L2: int8 blocks of kBlock with an fp32 absmax/127 scale
  Int4 = 3,      // L3: int4 blocks of kBlock with an fp32 absmax/7 scale
  PowerSgd = 4,  // L5: PowerSGD rank r on 2-D weights (warm-started Q)
  Int2 = 5,      // 2-bit blocks of kBlock with a bf16 step of the block's rms (rms_codec.hpp)
  Int3 = 6,      // 3-bit blocks of kBlock, likewise
};
// The enum values are what checkpoints store (compress/buckets); Int2 and
// Int3 came last, so they did not change. The order of compression (and of
// the error a level adds) is level_order's, not the enum's.
constexpr int kLevels = 7;

// The levels of the quantized reduce (an element codec, block_codec.hpp),
// in level order.
constexpr Level kQuantizedLevels[] = {Level::Bf16, Level::Int8, Level::Int4, Level::Int3, Level::Int2};
bool quantized(Level l);

// Position of l from the least to the most compressed: off 0, bf16 1, int8
// 2, int4 3, int3 4, int2 5, powersgd 6 (the "L" numbers of docs/compression.md).
int level_order(Level l);
// The level at position i of that order (0 <= i < kLevels).
Level level_at(int i);

// "off", "bf16", "int8", "int4", "int3", "int2", "powersgd".
const char* level_name(Level l);
// A parallel.grad_compression value. "auto" gives None: the run starts
// uncompressed and a controller (not part of this folder) sets the levels
// per bucket through GradReducer::set_level. Throws on anything else.
Level parse_level(const std::string& s);

struct Settings {
  Level level = Level::None;    // every bucket's level at the start
  int powersgd_rank = 4;        // parallel.powersgd_rank
  int64_t min_elems = 4096;     // parallel.compress_min_elems: smaller tensors go exact (fp32)
  uint64_t seed = 0;            // PowerSGD's initial Q (train.seed): the same on every dp rank
};

}  // namespace adgt::compress
