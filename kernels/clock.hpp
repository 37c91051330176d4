// The two clocks every timing in adgt reads: the wall clock (steady, in
// seconds since an arbitrary start; differences only) and this thread's CPU
// time (what a compute costs on a host shared by other threads and ranks).
#pragma once
#include <time.h>

#include <chrono>

namespace adgt {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace adgt
