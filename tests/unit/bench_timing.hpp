// Timing for the hidden benchmark cases ("[.cudabench]"): the median wall time
// of `reps` calls after one warm-up, each ended by a backend synchronisation.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "kernels/backend.hpp"

namespace adgt::test {

inline double seconds_of(Backend& be, const std::function<void()>& f, int reps) {
  f();  // warm-up
  be.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];  // median
}

}  // namespace adgt::test
