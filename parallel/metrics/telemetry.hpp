// Hardware telemetry (docs/telemetry.md): every rank samples its sources (NVML
// on a CUDA rank, the host's powercap/RAPL counters on a CPU rank) on a
// background thread every log.telemetry_interval_s and folds the readings
// into the interval's aggregate; the training thread takes it at each log
// interval (a copy under a mutex: it never waits for a reading) and reduces
// it over the world (telemetry_reduce.hpp). A field a rank cannot read is
// absent on that rank, never zero.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace adgt {

// The sampled fields, read as they are at the sample.
// power_limit_w: the power limit in force (NVML's enforced limit: the board's
// default, or a cap an administrator set), what the power model's cap means.
// sm_clock_max_mhz: the SM clock the GPU can reach (NVML's maximum), against
// which the power controller measures a throttled clock.
enum TelemetryGauge {
  kPowerW, kGpuTempC, kMemTempC, kSmClockMhz, kMemClockMhz, kPowerLimitW, kSmClockMaxMhz, kGauges
};
const char* telemetry_gauge_name(int g);  // "power_w", "gpu_temp_c", ...

// Clock-throttle reasons, as a bit set (NVML's reasons folded into three).
enum ThrottleBit : uint32_t { kThrottlePowerCap = 1, kThrottleThermal = 2, kThrottleHwSlowdown = 4 };
// The throttled shares kept: any reason, then one per bit above.
enum ThrottleKind { kThrottleAny, kThrottlePower, kThrottleTherm, kThrottleHw, kThrottleKinds };
const char* throttle_kind_name(int k);  // "throttled", "throttled_power_cap", ...

// One source's reading; an unread field is nullopt.
struct TelemetryReading {
  std::array<std::optional<double>, kGauges> gauge;
  // The source's energy counter, J: cumulative and monotonic (the source
  // undoes hardware wraparound); only differences are used.
  std::optional<double> energy_j;
  std::optional<uint32_t> throttle;  // ThrottleBit set now
};

// A device or host whose state is read. read() runs on the sampler's thread
// (or the caller's, in sample_at and sample_now) and is never called concurrently.
class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  virtual std::string describe() const = 0;  // for the start-up line: "NVML GPU-... (index 0)"
  virtual TelemetryReading read() = 0;
};

// Count, sum, min and max of the values added.
struct TelemetryStatAcc {
  int64_t n = 0;
  double sum = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  void add(double x);
};

// One rank's aggregate over a log interval (since the last take()).
struct TelemetryInterval {
  // Per sample; power_w falls back to the energy counter's rate over the
  // sample period where the source reads no power (RAPL).
  std::array<TelemetryStatAcc, kGauges> gauge;
  bool has_energy = false;  // a source with an energy counter was read
  double energy_j = 0;      // its increase over the interval, J
  // Seconds covered by readings of the throttle reasons (each reading counts
  // for the period since the source's previous one), and of them the seconds
  // with a reason set, by kind.
  bool has_throttle = false;
  double observed_s = 0;
  std::array<double, kThrottleKinds> throttled_s{};
};

// Who takes a sampler's intervals: each reader has its own (the step
// logger's log interval, the power controller's decision window), every
// reading added to all of them.
enum TelemetryReader { kLogReader, kControlReader, kTelemetryReaders };

// One rank's totals since the sampler started.
struct TelemetryTotals {
  bool has_energy = false;
  double energy_j = 0;
  bool has_throttle = false;
  double observed_s = 0, throttled_s = 0;  // throttled: any reason
};

class TelemetrySampler {
 public:
  // interval_s > 0: the period of the background thread (start()).
  TelemetrySampler(std::vector<std::unique_ptr<TelemetrySource>> sources, double interval_s);
  ~TelemetrySampler();  // stop()
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;

  // Reads every source now (the energy counters' baseline), then every
  // interval_s on a background thread.
  void start();
  // Ends the thread and reads every source once more, so the totals cover
  // the time up to now. Idempotent.
  void stop();
  // One reading of every source at time t_s (seconds, any origin, increasing
  // from call to call); tests call it directly with times of their own.
  void sample_at(double t_s);
  // One reading now: what the thread does each period, and what a reader
  // that must not find its window empty calls before take() (the power
  // controller). Serialized with the thread's readings.
  void sample_now();
  // `who`'s aggregate since its last take(), and a fresh one begun for it.
  TelemetryInterval take(TelemetryReader who = kLogReader);
  TelemetryTotals totals() const;
  const std::vector<std::unique_ptr<TelemetrySource>>& sources() const { return sources_; }

 private:
  double now_s() const;
  void run();
  void sample_locked(double t_s);  // under read_mu_

  std::vector<std::unique_ptr<TelemetrySource>> sources_;
  double interval_s_;
  // Per source: the time and energy counter of its previous reading (sampling thread only).
  std::vector<std::optional<double>> prev_t_, prev_energy_;
  mutable std::mutex mu_;  // guards interval_ and totals_
  std::array<TelemetryInterval, kTelemetryReaders> interval_;
  TelemetryTotals totals_;
  std::mutex read_mu_;  // one reading at a time (sample_at, sample_now)
  std::mutex wake_mu_;  // guards stopping_
  std::condition_variable wake_;
  bool stopping_ = false, stopped_ = false;
  std::thread thread_;
};

}  // namespace adgt
