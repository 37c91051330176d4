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
  PowerSgd = 4,  // L4: PowerSGD rank r on 2-D weights (warm-started Q)
};
constexpr int kLevels = 5;

// "off", "bf16", "int8", "int4", "powersgd".
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
