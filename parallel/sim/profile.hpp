// Op costs measured on the backend in use (docs/simulator.md, "Cost
// tables"): each op the simulator asks for is run on the Backend at its exact
// shape (one warm-up call, then repeated for at least `min_seconds`) and its
// mean time kept, in a JSON cache file keyed by backend, dtype and op, so a
// later run (or a sweep over layouts) reuses it. The CPU backend runs with the
// threads it was given (tests and the validation: one per rank).
#pragma once
#include <map>
#include <string>

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
  void save() const;          // writes the cache (no-op without a path)
  int measured() const { return measured_; }  // ops timed in this process
  int cached() const { return int(table_.size()); }

 private:
  double measure(const Op& op, int bytes);
  Backend& be_;
  std::string path_;
  double min_seconds_;
  size_t cold_bytes_;
  std::map<std::string, double> table_;
  int measured_ = 0;
  bool dirty_ = false;
};

}  // namespace adgt::sim
