#include "parallel/metrics/telemetry.hpp"

#include <algorithm>
#include <chrono>

namespace adgt {

const char* telemetry_gauge_name(int g) {
  static const char* const names[kGauges] = {"power_w", "gpu_temp_c", "mem_temp_c", "sm_clock_mhz",
                                             "mem_clock_mhz", "power_limit_w", "sm_clock_max_mhz"};
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
  sample_now();  // the counters' baseline: the first period's differences start here
  if (interval_s_ > 0 && !sources_.empty()) thread_ = std::thread([this] { run(); });
}

void TelemetrySampler::run() {
  const auto period = std::chrono::duration<double>(interval_s_);
  std::unique_lock<std::mutex> lk(wake_mu_);
  while (!wake_.wait_for(lk, period, [this] { return stopping_; })) {
    lk.unlock();
    sample_now();
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
  if (!sources_.empty()) sample_now();  // the totals reach the end of the run
}

void TelemetrySampler::sample_now() {
  std::lock_guard<std::mutex> rl(read_mu_);
  sample_locked(now_s());  // the time taken under the lock: increasing from reading to reading
}

void TelemetrySampler::sample_at(double t) {
  std::lock_guard<std::mutex> rl(read_mu_);
  sample_locked(t);
}

void TelemetrySampler::sample_locked(double t) {
  // Read outside mu_: a reading may take milliseconds (NVML), and the
  // training thread's take() must not wait for it.
  std::vector<TelemetryReading> r(sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i) r[i] = sources_[i]->read();
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < sources_.size(); ++i) {
    const TelemetryReading& x = r[i];
    const double dt = prev_t_[i] ? t - *prev_t_[i] : 0.0;  // the period this reading closes
    std::optional<double> energy_d;  // the counter's increase since the previous reading
    if (x.energy_j) {
      totals_.has_energy = true;
      if (prev_energy_[i]) {
        energy_d = std::max(0.0, *x.energy_j - *prev_energy_[i]);
        totals_.energy_j += *energy_d;
      }
      prev_energy_[i] = x.energy_j;
    }
    const uint32_t b = x.throttle.value_or(0);
    if (x.throttle) {
      totals_.has_throttle = true;
      totals_.observed_s += dt;
      if (b) totals_.throttled_s += dt;
    }
    for (TelemetryInterval& in : interval_) {
      for (int g = 0; g < kGauges; ++g)
        if (x.gauge[g]) in.gauge[g].add(*x.gauge[g]);
      if (x.energy_j) {
        in.has_energy = true;
        if (energy_d) {
          in.energy_j += *energy_d;
          if (!x.gauge[kPowerW] && dt > 0) in.gauge[kPowerW].add(*energy_d / dt);  // RAPL: no power gauge
        }
      }
      if (x.throttle) {
        in.has_throttle = true;
        in.observed_s += dt;
        if (b) in.throttled_s[kThrottleAny] += dt;
        if (b & kThrottlePowerCap) in.throttled_s[kThrottlePower] += dt;
        if (b & kThrottleThermal) in.throttled_s[kThrottleTherm] += dt;
        if (b & kThrottleHwSlowdown) in.throttled_s[kThrottleHw] += dt;
      }
    }
    prev_t_[i] = t;
  }
}

TelemetryInterval TelemetrySampler::take(TelemetryReader who) {
  std::lock_guard<std::mutex> lk(mu_);
  TelemetryInterval out = interval_[who];
  interval_[who] = {};
  return out;
}

TelemetryTotals TelemetrySampler::totals() const {
  std::lock_guard<std::mutex> lk(mu_);
  return totals_;
}

}  // namespace adgt
