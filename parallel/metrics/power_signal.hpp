// A rank's throttling read from a window of its telemetry: the power
// controller's input on ranks that read NVML (parallel/control/
// power_controller.hpp, docs/power.md). Here, beside the sampler, because the
// controller's room does not link this one.
#pragma once
#include "parallel/control/power_controller.hpp"
#include "parallel/metrics/telemetry.hpp"

namespace adgt {

// The share of the window's observed time with a power-cap, hardware-slowdown
// or thermal reason; where it is above 0 and both clocks were read, the
// clock's slowdown (the maximum SM clock over the window's mean SM clock;
// else 1); thermal_only when no power or hardware reason was seen; the
// smallest enforced limit and the mean power read.
PowerSignal power_signal(const TelemetryInterval& window);

}  // namespace adgt
