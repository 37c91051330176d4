#include "parallel/sim/power_slowdown.hpp"

#include "parallel/sim/ops.hpp"
#include "parallel/sim/work.hpp"

namespace adgt::sim {

double power_cap_slowdown(const RunConfig& cfg, const cluster::Device& device, double cap_w, int pp_rank) {
  if (!device.power.on() || cap_w <= 0) return 1.0;
  cluster::Device capped = device, free = device;
  capped.power.cap_w = cap_w;
  free.power.cap_w = 0;
  DeviceModelCosts with_cap(capped), without(free);
  const double t_cap = rank_step_compute(cfg, pp_rank, with_cap), t_free = rank_step_compute(cfg, pp_rank, without);
  return t_free > 0 ? std::max(1.0, t_cap / t_free) : 1.0;
}

}  // namespace adgt::sim
