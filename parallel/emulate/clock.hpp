// The emulation's clocks (docs/emulation.md, "Clocks").
//
// Wall (the default): seconds of CLOCK_MONOTONIC (std::chrono::steady_clock
// on Linux), which every process of one host shares, so a time stamp taken by
// one rank means the same instant to another. Waits sleep; they never spin
// (CPU ranks share cores).
//
// Virtual (emulate.clock: virtual): each rank keeps its own time v. Outside
// emulated Comm calls v advances by the CPU time of the rank's training
// thread (CLOCK of that thread, so waiting for a core of an oversubscribed
// host is not time); inside them the CPU time is dropped and v only jumps:
// a wait until t sets v = max(v, t). Time stamps travel in the emulation's
// own messages exactly as wall times do, so a message's arrival, a
// collective's end and a slowed compute piece follow the same rules on
// either clock. What a rank measures on the virtual clock is what it would
// measure with a core of its own: 8 ranks sharing 2 cores time their steps
// as 8 devices would.
//
// Model (emulate.clock: model): a virtual clock whose compute is the cost
// model's instead of the host's: outside emulated Comm calls v advances by the
// matmul FLOPs the rank executes (kernels/flop_counter.hpp) at
// emulate.model_flops FLOP/s; waits jump as on the virtual clock. Every time
// it gives is a function of the work, the cluster and the seed alone: the same
// run makes the same measurements, and so the same decisions at the same
// steps, on any machine under any load.
#pragma once
#include <pthread.h>
#include <semaphore.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "kernels/clock.hpp"
#include "kernels/flop_counter.hpp"

namespace adgt::emulate {

// Sleeps until wall_seconds() >= t. With `poll`, wakes at least every 100 us to run
// it (a pipeline bubble moves the data-parallel reduction along meanwhile).
inline void sleep_until(double t, const std::function<void()>& poll = {}) {
  for (double n = wall_seconds(); n < t; n = wall_seconds()) {
    if (poll) {
      poll();
      n = wall_seconds();
      if (n >= t) return;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(t - n, 100e-6)));
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(t - n));
    }
  }
}

enum class ClockKind { Wall, Virtual, Model };

// The host's cores as tokens shared by the ranks of one run (a POSIX named
// semaphore): on a virtual clock a rank holds one while it computes and
// hands it back while it may block in a transport call, so at most `cores` ranks
// compute at once and none is preempted by another computing rank. Ranks
// taking turns on a core evict each other's caches: 8 ranks on 2 cores
// measured 1.3x the CPU time per layer of one rank alone without tokens.
// A rank that waits longer than a timeout for a token computes without one
// (a rank holding a token may be blocked in a transport call the emulation
// does not see), so tokens never deadlock; they only order.
class CoreTokens {
 public:
  // Opens the semaphore `name` (create: makes it with `cores` tokens).
  // Throws std::runtime_error naming it on failure.
  CoreTokens(const std::string& name, int cores, bool create);
  ~CoreTokens();
  CoreTokens(const CoreTokens&) = delete;
  CoreTokens& operator=(const CoreTokens&) = delete;
  void unlink();              // the name goes; the open semaphore stays
  bool acquire(double timeout_s);  // false: timed out (none taken)
  void release();
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  sem_t* sem_ = nullptr;
  bool linked_ = false;
};

// One rank's clock. Not thread-safe: the training thread (the one that
// constructs it, whose CPU time a virtual clock counts) calls it; the
// pipeline's helper thread only moves transports along (Comm::progress).
class Clock {
 public:
  // flops_per_s: the model clock's compute rate (> 0 for ClockKind::Model).
  explicit Clock(ClockKind k = ClockKind::Wall, double flops_per_s = 0)
      : kind_(k), flops_per_s_(flops_per_s) {
    if (k == ClockKind::Virtual && pthread_getcpuclockid(pthread_self(), &cpu_) != 0)
      cpu_ = CLOCK_THREAD_CPUTIME_ID;
    if (k != ClockKind::Wall) mark_ = compute_now();
  }
  // A clock holds at most one core token; moving hands it over.
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;
  Clock(Clock&& o) noexcept { *this = std::move(o); }
  Clock& operator=(Clock&& o) noexcept {
    if (this != &o) {
      give_back();
      kind_ = o.kind_, cpu_ = o.cpu_, v_ = o.v_, mark_ = o.mark_, paused_ = o.paused_;
      flops_per_s_ = o.flops_per_s_;
      tokens_ = std::move(o.tokens_);
      held_ = std::exchange(o.held_, false);
    }
    return *this;
  }
  ~Clock() { give_back(); }
  // Virtual clocks of one host's ranks: compute only while holding a token
  // (nullptr: no tokens).
  void set_tokens(std::shared_ptr<CoreTokens> t) {
    give_back();
    tokens_ = std::move(t);
  }
  ClockKind kind() const { return kind_; }
  // Virtual or model: the rank keeps its own time and nothing sleeps.
  bool is_virtual() const { return kind_ != ClockKind::Wall; }

  // Wall: wall_seconds(). Virtual and model: v, first advanced by the
  // compute since the last mark (compute_now()) unless an emulated call is in
  // progress (paused).
  double now() {
    if (kind_ == ClockKind::Wall) return wall_seconds();
    if (paused_ == 0) {
      const double c = compute_now();
      v_ += std::max(0.0, c - mark_);
      mark_ = c;
    }
    return v_;
  }
  // What this clock counts as a rank's compute, in seconds from an arbitrary
  // origin: the model clock's FLOPs at its rate, else the constructing
  // thread's CPU time.
  double compute_now() const {
    if (kind_ == ClockKind::Model) return double(gemm_flops_executed().load(std::memory_order_relaxed)) / flops_per_s_;
    return cpu_now();
  }
  // Until now() >= t. Wall: sleeps (running `poll` every 100 us). Virtual:
  // runs `poll` once (the transports move along) and jumps.
  void wait_until(double t, const std::function<void()>& poll = {}) {
    if (kind_ == ClockKind::Wall) return sleep_until(t, poll);
    if (poll) poll();
    now();
    v_ = std::max(v_, t);
  }
  // An emulated call begins (the CPU time until here was compute) and ends
  // (the CPU time spent inside it is dropped: the model's time replaces it).
  // Nested calls count once.
  void pause() {
    if (paused_ == 0 && is_virtual()) now();
    ++paused_;
  }
  void resume() {
    if (--paused_ == 0 && is_virtual()) mark_ = compute_now();
  }
  // Around a transport call that may block (a receive, a collective's
  // wait): the core token goes back meanwhile and is taken again after
  // (CoreYield). Calls that return at once (isend, progress, starting a
  // collective) keep it, so a rank is not switched out for nothing.
  void yield_core() { give_back(); }
  void reclaim_core() {
    if (tokens_ && !held_) held_ = tokens_->acquire(kTokenTimeout);
  }
  static constexpr double kTokenTimeout = 0.2;  // seconds of waiting for a core token

 private:
  double cpu_now() const {
    timespec ts{};
    clock_gettime(cpu_, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  void give_back() {
    if (held_ && tokens_) tokens_->release();
    held_ = false;
  }
  ClockKind kind_;
  clockid_t cpu_ = CLOCK_THREAD_CPUTIME_ID;
  double flops_per_s_ = 0;
  double v_ = 0, mark_ = 0;
  int paused_ = 0;
  std::shared_ptr<CoreTokens> tokens_;
  bool held_ = false;
};

// Hands the rank's core token back for the scope of a call that may block.
class CoreYield {
 public:
  explicit CoreYield(Clock& c) : c_(c) { c_.yield_core(); }
  ~CoreYield() { c_.reclaim_core(); }
  CoreYield(const CoreYield&) = delete;
  CoreYield& operator=(const CoreYield&) = delete;

 private:
  Clock& c_;
};

}  // namespace adgt::emulate
