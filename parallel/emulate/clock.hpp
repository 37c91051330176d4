// The emulation's clock: seconds of CLOCK_MONOTONIC (std::chrono::steady_clock
// on Linux), which every process of one host shares, so a time stamp taken by
// one rank means the same instant to another. Waits sleep; they never spin
// (CPU ranks share cores).
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

namespace adgt::emulate {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sleeps until now_s() >= t. With `poll`, wakes at least every 100 us to run
// it (a pipeline bubble moves the data-parallel reduction along meanwhile).
inline void sleep_until(double t, const std::function<void()>& poll = {}) {
  for (double n = now_s(); n < t; n = now_s()) {
    if (poll) {
      poll();
      n = now_s();
      if (n >= t) return;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(t - n, 100e-6)));
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(t - n));
    }
  }
}

}  // namespace adgt::emulate
