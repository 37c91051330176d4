// Always-on precondition checks (never assert: NDEBUG removes it).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace adgt {
[[noreturn]] inline void check_failed(const char* expr, const std::string& msg, const char* file,
                                      int line) {
  std::ostringstream os;
  os << msg << " [check `" << expr << "` failed at " << file << ":" << line << "]";
  throw std::runtime_error(os.str());
}
}  // namespace adgt

#define ADGT_CHECK(cond, msg)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::ostringstream adgt_os_;                                             \
      adgt_os_ << msg;                                                         \
      ::adgt::check_failed(#cond, adgt_os_.str(), __FILE__, __LINE__);         \
    }                                                                          \
  } while (0)
