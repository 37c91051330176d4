#include "parallel/metrics/telemetry.hpp"

#include <algorithm>
#include <chrono>

namespace adgt {

const char* telemetry_gauge_name(int g) {
  static const char* const names[kGauges] = {"power_w", "gpu_temp_c", "mem_temp_c", "sm_clock_mhz",
                                             "mem_clock_mhz", "power_limit_w"};
  return names[g];
}

const char* throttle_kind_name(int k) {
  static const char* const names[kThrottleKinds] = {"throttled", "throttled_power_cap",
                                                    "throttled_thermal", "throttled_hw_slowdown"};
  return names[k];
}

void TelemetryStatAcc::add(double x) {
  ++n;
  sum += x;
  min = std::min(min, x);
  max = std::max(max, x);
}

TelemetrySampler::TelemetrySampler(std::vector<std::unique_ptr<TelemetrySource>> sources,
                                   double interval_s)
    : sources_(std::move(sources)), interval_s_(interval_s), prev_t_(sources_.size()),
      prev_energy_(sources_.size()) {}

TelemetrySampler::~TelemetrySampler() { stop(); }

double TelemetrySampler::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void TelemetrySampler::start() {
  sample_at(now_s());  // the counters' baseline: the first period's differences start here
  if (interval_s_ > 0 && !sources_.empty()) thread_ = std::thread([this] { run(); });
}

void TelemetrySampler::run() {
  const auto period = std::chrono::duration<double>(interval_s_);
  std::unique_lock<std::mutex> lk(wake_mu_);
  while (!wake_.wait_for(lk, period, [this] { return stopping_; })) {
    lk.unlock();
    sample_at(now_s());
    lk.lock();
  }
}

void TelemetrySampler::stop() {
  {
    std::lock_guard<std::mutex> lk(wake_mu_);
    if (stopped_) return;
    stopped_ = stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!sources_.empty()) sample_at(now_s());  // the totals reach the end of the run
}

void TelemetrySampler::sample_at(double t) {
  // Read outside the lock: a reading may take milliseconds (NVML), and the
  // training thread's take() must not wait for it.
  std::vector<TelemetryReading> r(sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i) r[i] = sources_[i]->read();
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < sources_.size(); ++i) {
    const TelemetryReading& x = r[i];
    const double dt = prev_t_[i] ? t - *prev_t_[i] : 0.0;  // the period this reading closes
    for (int g = 0; g < kGauges; ++g)
      if (x.gauge[g]) interval_.gauge[g].add(*x.gauge[g]);
    if (x.energy_j) {
      interval_.has_energy = totals_.has_energy = true;
      if (prev_energy_[i]) {
        const double d = std::max(0.0, *x.energy_j - *prev_energy_[i]);
        interval_.energy_j += d;
        totals_.energy_j += d;
        if (!x.gauge[kPowerW] && dt > 0) interval_.gauge[kPowerW].add(d / dt);  // RAPL: no power gauge
      }
      prev_energy_[i] = x.energy_j;
    }
    if (x.throttle) {
      interval_.has_throttle = totals_.has_throttle = true;
      interval_.observed_s += dt;
      totals_.observed_s += dt;
      const uint32_t b = *x.throttle;
      if (b) {
        interval_.throttled_s[kThrottleAny] += dt;
        totals_.throttled_s += dt;
      }
      if (b & kThrottlePowerCap) interval_.throttled_s[kThrottlePower] += dt;
      if (b & kThrottleThermal) interval_.throttled_s[kThrottleTherm] += dt;
      if (b & kThrottleHwSlowdown) interval_.throttled_s[kThrottleHw] += dt;
    }
    prev_t_[i] = t;
  }
}

TelemetryInterval TelemetrySampler::take() {
  std::lock_guard<std::mutex> lk(mu_);
  TelemetryInterval out = interval_;
  interval_ = {};
  return out;
}

TelemetryTotals TelemetrySampler::totals() const {
  std::lock_guard<std::mutex> lk(mu_);
  return totals_;
}

}  // namespace adgt
