#include "parallel/compress/level.hpp"

#include "kernels/check.hpp"

namespace adgt::compress {

const char* level_name(Level l) {
  switch (l) {
    case Level::None: return "off";
    case Level::Bf16: return "bf16";
    case Level::Int8: return "int8";
    case Level::Int4: return "int4";
    case Level::PowerSgd: return "powersgd";
  }
  return "?";
}

Level parse_level(const std::string& s) {
  if (s == "off" || s == "auto") return Level::None;
  if (s == "bf16") return Level::Bf16;
  if (s == "int8") return Level::Int8;
  if (s == "int4") return Level::Int4;
  if (s == "powersgd") return Level::PowerSgd;
  ADGT_CHECK(false, "parallel.grad_compression=\"" << s
                                                   << "\": use off, bf16, int8, int4, powersgd or auto");
  return Level::None;
}

}  // namespace adgt::compress
