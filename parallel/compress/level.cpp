#include "parallel/compress/level.hpp"

#include "kernels/check.hpp"

namespace adgt::compress {

const char* level_name(Level l) {
  switch (l) {
    case Level::None: return "off";
    case Level::Bf16: return "bf16";
    case Level::Int8: return "int8";
    case Level::Int4: return "int4";
    case Level::Int3: return "int3";
    case Level::Int2: return "int2";
    case Level::PowerSgd: return "powersgd";
  }
  return "?";
}

namespace {
constexpr Level kOrder[kLevels] = {Level::None, Level::Bf16, Level::Int8, Level::Int4,
                                   Level::Int3, Level::Int2, Level::PowerSgd};
}  // namespace

bool quantized(Level l) {
  for (Level q : kQuantizedLevels)
    if (q == l) return true;
  return false;
}

int level_order(Level l) {
  for (int i = 0; i < kLevels; ++i)
    if (kOrder[i] == l) return i;
  ADGT_CHECK(false, "compress::level_order: unknown level " << int(l));
  return 0;
}

Level level_at(int i) {
  ADGT_CHECK(i >= 0 && i < kLevels, "compress::level_at: " << i << " is not in [0, " << kLevels << ")");
  return kOrder[i];
}

Level parse_level(const std::string& s) {
  if (s == "off" || s == "auto") return Level::None;
  if (s == "bf16") return Level::Bf16;
  if (s == "int8") return Level::Int8;
  if (s == "int4") return Level::Int4;
  if (s == "int3") return Level::Int3;
  if (s == "int2") return Level::Int2;
  if (s == "powersgd") return Level::PowerSgd;
  ADGT_CHECK(false, "parallel.grad_compression=\"" << s
                                                   << "\": use off, bf16, int8, int4, int3, int2, powersgd or auto");
  return Level::None;
}

}  // namespace adgt::compress
