// The power controller (docs/power.md; issue 48 part 2):
// when ranks report their clocks throttled by a power cap and the step slows
// by more than parallel.adapt_threshold, world rank 0 re-plans the
// micro-batch under the cap with the simulator (every micro-batch that
// divides the step's batch, each step predicted on the cluster with every
// device capped) and, when another one is predicted at least 5% faster, asks
// for it as an in-memory layout switch (train.micro_batch; the global batch
// is kept, so the numbers change only by the order of accumulation). Decide
// on rank 0, broadcast, log: the inputs (throttled ranks, the clocks'
// slowdown, the window's step time) and each candidate's prediction go to
// metrics.jsonl with the decision.
//
// Throttling comes from emulate.power_cap_w on CPU ranks (the emulation's
// power factor: the power model's clock under the cap at the running
// micro-batch). Device telemetry (NVML throttle reasons) is not an input yet.
#pragma once
#include <memory>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/control/hook.hpp"

namespace adgt {

// Every `interval` steps (5) after the first two of a run or layout.
std::unique_ptr<Controller> make_power_controller(const RunConfig& cfg, const cluster::Cluster& cluster,
                                                  double cap_w);

}  // namespace adgt
