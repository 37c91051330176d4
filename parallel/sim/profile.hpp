// Op costs measured on the backend in use (docs/simulator.md, "Cost
// tables"): each op the simulator asks for is run on the Backend at its exact
// shape (one warm-up call, then repeated for at least `min_seconds`) and its
// mean time kept, in a JSON cache file keyed by backend, dtype and op, so a
// later run (or a sweep over layouts) reuses it. The CPU backend runs with the
// threads it was given (tests and the validation: one per rank).
#pragma once
#include <functional>
#include <map>
#include <string>

#include "core/config.hpp"
#include "kernels/backend.hpp"
#include "parallel/sim/ops.hpp"

namespace adgt::sim {

class ProfileCosts final : public OpCosts {
 public:
  // `cache`: a JSON file read if present and written by save() ("" = none).
  // `cold_bytes`: the calls cycle through copies of the operands totalling
  // at least this (0: one copy, cache-hot); see profile.cpp.
  ProfileCosts(Backend& be, std::string cache, double min_seconds = 0.01,
               size_t cold_bytes = size_t(16) << 20);
  ~ProfileCosts() override;
  double seconds(const Op& op, int bytes) override;
  std::string describe() const override;
  // The in-situ factor (calibrate.cpp): an op measured alone, repeated on
  // its operands, runs faster than the same op inside a training step, where
  // every op follows others that evicted its caches (measured here: 1.2x for
  // the validation model on one rank). calibrate() runs one micro-batch's
  // forward and backward of the run's model on one rank (the backend, the
  // clock and the rounds of an op) and divides by the profile's sum of the
  // same ops; seconds() then returns every op's time times that factor.
  // Cached with the ops. Models over kCalibrateMaxParams parameters, and
  // device backends, keep 1. Returns the factor.
  double calibrate(const RunConfig& run);
  double scale() const { return scale_; }
  static constexpr double kCalibrateMaxParams = 64e6;
  // Ops cost their counted matmul FLOPs at `flops_per_s` (the emulation's
  // model clock, emulate.clock: model): the same profile on any machine under
  // any load, and calibrate() keeps 1 (nothing to evict). 0: measured.
  void count_flops(double flops_per_s) { flop_rate_ = flops_per_s; }
  void save() const;          // writes the cache (no-op without a path or when read-only)
  // Reads the cache if present but never writes it (a dry run writes nothing).
  void read_only() { read_only_ = true; }
  int measured() const { return measured_; }  // ops timed in this process
  const std::string& path() const { return path_; }  // the cache file ("" none)
  // Whether `op` is in the table (cached or measured) at this thread count.
  bool has(const Op& op, int bytes) const;
  // Called once, before the first op this process measures (a line saying
  // that the machine is being profiled).
  void on_first_measure(std::function<void()> f) { on_first_measure_ = std::move(f); }
  bool calibrated(const RunConfig& run) const;  // calibrate(run) would read its factor
  // The host's memory bandwidth with `threads` streaming threads (host.hpp
  // measure_memory_bandwidth), measured once and cached with the ops; bytes/s.
  double memory_bandwidth(int threads);
  int cached() const { return int(table_.size()); }

 private:
  bool read_only_ = false;
  double measure(const Op& op, int bytes);
  // Host backend with one thread: ops are timed as the thread's CPU time.
  bool cpu_time() const;
  // "<backend>/<dtype>/cold<N>MiB/[cpu-time/]", or "<backend>/<dtype>/flops<rate>/"
  std::string key_prefix(DType dt) const;
  Backend& be_;
  std::string path_;
  double min_seconds_;
  size_t cold_bytes_;
  std::map<std::string, double> table_;
  double scale_ = 1;  // calibrate()'s in-situ factor
  double flop_rate_ = 0;  // count_flops()
  int measured_ = 0;
  bool dirty_ = false;
  std::function<void()> on_first_measure_;
  bool announced_ = false;
  void announce() {
    if (!announced_ && on_first_measure_) on_first_measure_();
    announced_ = true;
  }
};

// The profile cache of this machine and binary (docs/simulator.md, "The
// profile cache"): ADGT_PROFILE_CACHE when set ("off": none), else
// $XDG_CACHE_HOME/adgt (or ~/.cache/adgt) / op-profile-<key>.json, where the
// key hashes the CPU model, the usable cores and this executable (path, size,
// modification time): another machine or a rebuilt binary measures again;
// the ops' shapes, dtype and thread count are keys inside. "" when no home
// directory is known.
std::string default_profile_cache();

}  // namespace adgt::sim
