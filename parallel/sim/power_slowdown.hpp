// What a power cap costs one rank's compute, by the cost model (issue 48:
// emulate.power_cap_w, the power controller, the simulator): the device
// model's time for the rank's work of one step (every chunk's forward and
// backward per micro-batch, and the update) under the cap over the same
// without it. Kernel by kernel (each kernel's clock set by its own power) or,
// where the device's power model has a limiter (power.hpp), the step's
// kernels run in order through it.
#pragma once
#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/power.hpp"
#include "parallel/sim/work.hpp"

namespace adgt::sim {

// >= 1; 1 where the device has no power model or nothing of the rank's work
// draws more than the cap allows. `cfg`: the running layout and micro-batch.
double power_cap_slowdown(const RunConfig& cfg, const cluster::Device& device, double cap_w, int pp_rank);

// The limiter's view of pipeline rank `pp_rank`'s step on `device` (whose
// power.cap_w is the cap): per micro-batch every chunk's forward, then their
// backwards in reverse, then the update, through cluster::limiter_walk.
cluster::LimiterStep limiter_step(const RunConfig& cfg, const cluster::Device& device, int pp_rank,
                                  const WorkOptions& opts = {});

}  // namespace adgt::sim
