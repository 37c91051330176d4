#include "parallel/sim/power_slowdown.hpp"

#include <algorithm>

#include "parallel/sim/ops.hpp"

namespace adgt::sim {

cluster::LimiterStep limiter_step(const RunConfig& cfg, const cluster::Device& device, int pp_rank,
                                  const WorkOptions& opts) {
  const int bytes = compute_bytes(cfg);
  const DeviceModelCosts costs(device);
  const RankWork rw = rank_work(cfg, pp_rank, opts);
  std::vector<cluster::PowerSegment> one_mb, step;
  auto add = [&](const PassWork& w, std::vector<cluster::PowerSegment>& to) {
    for (const Piece& p : w.pieces)
      for (const Op& op : p.ops) to.push_back(costs.segment(op, bytes));
  };
  auto seconds = [&](const PassWork& w) {
    std::vector<cluster::PowerSegment> s;
    add(w, s);
    double t = 0;
    for (const auto& x : s) t += std::max(x.compute_s, x.memory_s) + x.overhead_s;
    return t;
  };
  for (const StageWork& st : rw.chunks) add(st.forward, one_mb);
  for (auto it = rw.chunks.rbegin(); it != rw.chunks.rend(); ++it) {
    // The backward as rank_step_compute costs it: whole, or input and weight
    // gradients apart, whichever is shorter.
    if (seconds(it->backward) <= seconds(it->input_grad) + seconds(it->weight_grad)) {
      add(it->backward, one_mb);
    } else {
      add(it->input_grad, one_mb);
      add(it->weight_grad, one_mb);
    }
  }
  for (int64_t m = 0; m < cfg.accum_steps(); ++m) step.insert(step.end(), one_mb.begin(), one_mb.end());
  for (const Op& op : rw.optimizer) step.push_back(costs.segment(op, bytes));
  return cluster::limiter_walk(device.power, step);
}

double power_cap_slowdown(const RunConfig& cfg, const cluster::Device& device, double cap_w, int pp_rank) {
  if (!device.power.on() || cap_w <= 0) return 1.0;
  cluster::Device capped = device, free = device;
  capped.power.cap_w = cap_w;
  free.power.cap_w = 0;
  if (device.power.limiter()) return std::max(1.0, limiter_step(cfg, capped, pp_rank).slowdown());
  DeviceModelCosts with_cap(capped), without(free);
  const double t_cap = rank_step_compute(cfg, pp_rank, with_cap), t_free = rank_step_compute(cfg, pp_rank, without);
  return t_free > 0 ? std::max(1.0, t_cap / t_free) : 1.0;
}

}  // namespace adgt::sim
