// The step metrics observer: every log.interval steps (and the last one) the
// step line on world rank 0's stdout and one record in metrics.jsonl — the
// loss (mean over the interval's applied updates), lr, gradient norm,
// throughput, TFLOP/s and MFU (the MFU convention of parallel/cost/flops.hpp),
// ETA, bytes per group, the pipeline bubble, the data-parallel reduction each
// rank waited for (mean and maximum over the world: collective, so it runs on
// every rank) and the MoE loads.
#pragma once
#include <chrono>
#include <cstdint>

#include "core/config.hpp"
#include "core/metrics.hpp"
#include "kernels/backend.hpp"
#include "parallel/control/hook.hpp"

namespace adgt {

class StepLogger final : public Observer {
 public:
  // `log`: world rank 0's metrics log (nullptr elsewhere: nothing printed).
  // `peak_tflops`: the MFU denominator; measured_peak: it was measured at
  // start (a step faster than it re-measures it).
  StepLogger(const RunConfig& cfg, Backend& be, MetricsLog* log, double peak_tflops, bool measured_peak);
  void observe(Engine& e, const StepReport& r, Comm& world) override;

  double final_train_loss() const { return final_loss_; }  // the last logged interval's
  // Mean step time over the timed steps (every step but the run's first, which
  // warms caches and thread pools) and their count.
  double mean_step_seconds() const { return timed_steps_ ? timed_s_ / double(timed_steps_) : 0; }
  // The MFU peak per rank, TFLOP/s (a measured one may have been re-measured
  // upward at a logged step; world rank 0's is the one that counts).
  double peak_tflops() const { return peak_; }

 private:
  const RunConfig& cfg_;
  Backend& be_;
  MetricsLog* log_;
  double peak_;
  bool measured_peak_;
  double flops_per_token_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double timed_s_ = 0;
  int64_t timed_steps_ = 0;
  double interval_loss_ = 0;
  int64_t interval_n_ = 0;
  double final_loss_ = 0;
};

}  // namespace adgt
