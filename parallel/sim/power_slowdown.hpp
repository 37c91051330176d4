// What a power cap costs one rank's compute, by the cost model (issue 48:
// emulate.power_cap_w, the power controller): the device model's time for
// the rank's work of one step (every chunk's forward and backward per
// micro-batch, and the update) under the cap over the same without it.
#pragma once
#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"

namespace adgt::sim {

// >= 1; 1 where the device has no power model or nothing of the rank's work
// draws more than the cap allows. `cfg`: the running layout and micro-batch.
double power_cap_slowdown(const RunConfig& cfg, const cluster::Device& device, double cap_w, int pp_rank);

}  // namespace adgt::sim
