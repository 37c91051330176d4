// The power controller (docs/power.md; issue 48 part 2):
// when ranks report their clocks throttled and the clock costs their compute
// more than parallel.adapt_threshold, world rank 0 re-plans under the power
// limit with the simulator and, when the new plan is predicted at least 5%
// faster, asks for it as an in-memory layout switch. Without parallel.auto
// the plan is the micro-batch (every one that divides the replica's batch,
// each step predicted on the cluster with every device capped;
// train.micro_batch, the global batch kept, so the numbers change only by the
// order of accumulation); with parallel.auto (and parallel.replan) the whole
// layout, by the planner under the cap (launch_plan.hpp replan). Decide on
// rank 0, broadcast, log: the inputs (where the signal came from, the
// throttled ranks, the clocks' slowdown, the limit, the window's step time)
// and each candidate's prediction go to metrics.jsonl with the decision.
//
// Two signals, one rule:
// - emulation: emulate.power_cap_w on CPU ranks. Each rank's factor is the
//   power model's clock under the cap at the running micro-batch; the cap
//   planned under is emulate.power_cap_w. A decision every interval, logged
//   even when it keeps the plan.
// - telemetry: each rank's sampler (log.telemetry_source; NVML on CUDA
//   ranks) over the window since the last decision: the share of the time
//   with a power-cap, hardware-slowdown or thermal throttle reason, and the
//   clock's slowdown, NVML's maximum SM clock over the window's mean SM
//   clock (counted only on a rank with a reason set). The cap planned under
//   is the smallest enforced power limit the ranks read (NVML's), or, where
//   every throttled rank's reason is thermal only, the highest mean power of
//   those ranks (the power a hot device holds). A window without a throttled
//   rank decides quietly (nothing logged).
#pragma once
#include <functional>
#include <memory>
#include <optional>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/control/hook.hpp"
#include "parallel/control/replan_controller.hpp"

namespace adgt {

// One rank's throttling over a window of its telemetry (made from the
// sampler's window by parallel/metrics/power_signal.hpp).
struct PowerSignal {
  bool read = false;           // the window has readings of the throttle reasons
  double throttled_share = 0;  // seconds with a power-cap, HW-slowdown or thermal reason / seconds read
  bool thermal_only = false;   // throttled, and only ever for thermal reasons
  // Max SM clock / mean SM clock over the window where throttled_share > 0
  // and both clocks were read; else 1.
  double clock_slowdown = 1;
  std::optional<double> limit_w;  // the smallest enforced power limit read
  std::optional<double> power_w;  // the mean power read
};
// What the controller reads beyond the run file.
struct PowerInputs {
  cluster::Cluster cluster;   // the run's cluster model: its device's power model predicts
  double emulated_cap_w = 0;  // > 0: the emulation's factor is the signal (emulate.power_cap_w)
  // This rank's throttling since the previous call (power_signal of
  // Trainer::take_control_telemetry); nullopt: nothing read.
  std::function<std::optional<PowerSignal>()> telemetry;
  // parallel.auto with parallel.replan: re-plan the layout, not the micro-batch alone.
  std::shared_ptr<plan::ReplanState> replan;
};

// Every `interval` steps (5) after the first two of a run or layout.
std::unique_ptr<Controller> make_power_controller(const RunConfig& cfg, PowerInputs in);

}  // namespace adgt
