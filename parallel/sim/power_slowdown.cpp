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
  const int bytes = bf16_compute(cfg.train) ? 2 : cfg.train.dtype == "f64" ? 8 : 4;
  const RankWork w = rank_work(cfg, pp_rank);
  double t_cap = 0, t_free = 0;
  auto add = [&](const std::vector<Op>& ops, double times) {
    for (const Op& op : ops) {
      t_cap += times * with_cap.seconds(op, bytes);
      t_free += times * without.seconds(op, bytes);
    }
  };
  const double mb = double(cfg.accum_steps());
  for (const StageWork& st : w.chunks) {
    for (const Piece& p : st.forward.pieces) add(p.ops, mb);
    for (const Piece& p : st.backward.pieces) add(p.ops, mb);
  }
  add(w.optimizer, 1);
  return t_free > 0 ? std::max(1.0, t_cap / t_free) : 1.0;
}

}  // namespace adgt::sim
