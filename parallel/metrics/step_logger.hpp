// The step metrics observer: every log.interval steps (and the last one) the
// step line on world rank 0's stdout and one record in metrics.jsonl — the
// loss (mean over the interval's applied updates), lr, gradient norm,
// throughput, TFLOP/s and MFU (the MFU convention of parallel/cost/flops.hpp),
// ETA, bytes per group, the pipeline bubble, the data-parallel reduction each
// rank waited for (mean and maximum over the world: collective, so it runs on
// every rank), the MoE loads and the hardware telemetry of the interval
// (docs/telemetry.md; reduced over the world: collective too).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>

#include "core/config.hpp"
#include "core/metrics.hpp"
#include "kernels/backend.hpp"
#include "parallel/control/hook.hpp"
#include "parallel/metrics/telemetry.hpp"
#include "parallel/metrics/telemetry_reduce.hpp"

namespace adgt {

class StepLogger final : public Observer {
 public:
  // `log`: world rank 0's metrics log (nullptr elsewhere: nothing printed).
  // `peak_tflops`: the MFU denominator; measured_peak: it was measured at
  // start (a step faster than it re-measures it).
  // `telemetry`: this rank's started sampler (make_telemetry_sampler; nullptr
  // where it reads nothing). With log.telemetry_interval_s > 0 every rank
  // joins the telemetry reduction at each logged step, sampler or not.
  StepLogger(const RunConfig& cfg, Backend& be, MetricsLog* log, double peak_tflops, bool measured_peak,
             std::shared_ptr<TelemetrySampler> telemetry = nullptr);
  void observe(Engine& e, const StepReport& r, Comm& world) override;
  // The run's energy per token and throttled share (docs/telemetry.md): stops
  // the sampler (its last reading closes the run) and sums over the world.
  // Collective; nothing measured (or telemetry off): an empty RunEnergy.
  RunEnergy finish_telemetry(Comm& world) const;

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
  int64_t steps_seen_ = 0;  // steps of this run (the tokens of its energy per token)
  std::shared_ptr<TelemetrySampler> telemetry_;
};

}  // namespace adgt
