// A minimal check for MPI test programs (Catch2 does not fit several ranks):
// each failure prints the rank, the file:line and what differed; main returns
// non-zero when any check failed on this rank.
#pragma once
#include <cstdio>
#include <sstream>
#include <string>

namespace adgt::ptest {

struct Tally {
  int rank = 0;
  long checks = 0, failures = 0;
};
inline Tally& tally() {
  static Tally t;
  return t;
}
inline void report(bool ok, const char* expr, const std::string& what, const char* file, int line) {
  ++tally().checks;
  if (ok) return;
  if (++tally().failures <= 50)
    std::fprintf(stderr, "FAILED rank %d %s:%d: %s: %s\n", tally().rank, file, line, expr,
                 what.c_str());
}

}  // namespace adgt::ptest

#define PCHECK(cond, msg)                                                           \
  do {                                                                              \
    const bool pcheck_ok_ = (cond);                                                 \
    std::ostringstream pcheck_os_;                                                  \
    if (!pcheck_ok_) pcheck_os_ << msg;                                             \
    ::adgt::ptest::report(pcheck_ok_, #cond, pcheck_os_.str(), __FILE__, __LINE__); \
  } while (0)
