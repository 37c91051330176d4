#include "parallel/metrics/power_signal.hpp"

#include <algorithm>

namespace adgt {

PowerSignal power_signal(const TelemetryInterval& w) {
  PowerSignal s;
  if (w.gauge[kPowerLimitW].n > 0) s.limit_w = w.gauge[kPowerLimitW].min;
  if (w.gauge[kPowerW].n > 0) s.power_w = w.gauge[kPowerW].sum / double(w.gauge[kPowerW].n);
  if (!w.has_throttle || w.observed_s <= 0) return s;
  s.read = true;
  const double power = std::max(w.throttled_s[kThrottlePower], w.throttled_s[kThrottleHw]);
  // The seconds with any of the three reasons that cost clock (the sampler's
  // "throttled": NVML's reasons that cost nothing, GPU idle or applications
  // clocks, are not folded into them).
  s.throttled_share = w.throttled_s[kThrottleAny] / w.observed_s;
  s.thermal_only = s.throttled_share > 0 && power == 0;
  const TelemetryStatAcc& sm = w.gauge[kSmClockMhz];
  const TelemetryStatAcc& mx = w.gauge[kSmClockMaxMhz];
  if (s.throttled_share > 0 && sm.n > 0 && mx.n > 0 && sm.sum > 0)
    s.clock_slowdown = std::max(1.0, mx.max / (sm.sum / double(sm.n)));
  return s;
}

}  // namespace adgt
