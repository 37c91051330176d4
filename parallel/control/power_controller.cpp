#include "parallel/control/power_controller.hpp"

#include <algorithm>
#include <cmath>

#include "core/layout.hpp"
#include "parallel/mesh/parallel_context.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/step_sim.hpp"

namespace adgt {

namespace {

constexpr int64_t kInterval = 5;    // steps between decisions
constexpr int64_t kWarmSteps = 2;   // steps of a run (or layout) before the first
constexpr double kMinGain = 0.05;   // a switch must be predicted this much faster

class PowerController final : public Controller {
 public:
  PowerController(const RunConfig& cfg, const cluster::Cluster& cl, double cap_w)
      : cfg_(cfg), cluster_(cl), cap_w_(cap_w) {
    cluster_.device.power.cap_w = cap_w;
  }
  std::string name() const override { return "power"; }
  void record(Engine&, const StepReport& r) override {
    if (r.step <= r.first_step + kWarmSteps) return;  // warm-up (and a new layout's first steps)
    window_s_ += r.seconds;
    ++window_n_;
  }
  bool due(const StepReport& r) const override {
    return r.step >= r.first_step + kWarmSteps + kInterval && (r.step - r.first_step) % kInterval == 0;
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    (void)r;
    const emulate::Emulation* emu = e.groups().emulation;
    const double f = emu ? emu->power_factor : 1.0;
    // [0] the most any rank's clock costs its compute, [1] the window's mean
    // step time (the slowest rank's), [2] throttled ranks.
    double mx[2] = {f, window_n_ ? window_s_ / double(window_n_) : 0.0};
    double sum[1] = {f > 1.0 + 1e-9 ? 1.0 : 0.0};
    world.all_reduce(Tensor(mx, DType::F64, {2}), ReduceOp::Max);
    world.all_reduce(Tensor(sum, DType::F64, {1}));
    window_s_ = 0, window_n_ = 0;
    return {{"clock_slowdown", mx[0]},
            {"step_s", mx[1]},
            {"throttled_ranks", int64_t(sum[0])},
            {"micro_batch", cfg_.train.micro_batch},
            {"power_cap_w", cap_w_}};
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const double slow = in.at("clock_slowdown").get<double>();
    if (slow < 1.0 + cfg_.parallel.adapt_threshold)
      return {{"action", "none"}, {"why", "no rank throttled beyond parallel.adapt_threshold"}};
    // Every micro-batch the step's per-replica batch divides, predicted under the cap.
    const Layout lay = layout_of(cfg_);
    const int64_t per_replica = cfg_.train.global_batch / std::max<int64_t>(1, lay.dp);
    nlohmann::json cands = nlohmann::json::array();
    int64_t best = cfg_.train.micro_batch;
    double best_s = -1, now_s = -1;
    for (int64_t m = 1; m <= per_replica; ++m) {
      if (per_replica % m) continue;
      RunConfig c = cfg_;
      c.train.micro_batch = m;
      try {
        validate(c);
      } catch (const std::exception&) {
        continue;  // a layout rule (too few micro-batches for the pipeline, ...)
      }
      sim::DeviceModelCosts costs(cluster_.device);
      const double t = sim::simulate_step(c, cluster_, costs).step_time_s;
      cands.push_back({{"micro_batch", m}, {"predicted_step_s", t}});
      if (m == cfg_.train.micro_batch) now_s = t;
      if (best_s < 0 || t < best_s) best_s = t, best = m;
    }
    nlohmann::json d = {{"candidates", cands}, {"predicted_now_s", now_s}};
    if (best == cfg_.train.micro_batch || now_s < 0 || best_s > now_s * (1.0 - kMinGain)) {
      d["action"] = "none";
      d["why"] = "no micro-batch is predicted 5% faster under the cap";
      return d;
    }
    d["action"] = "switch";
    d["micro_batch"] = best;
    d["predicted_step_s"] = best_s;
    d["layout_request"] = {"train.micro_batch=" + std::to_string(best)};
    return d;
  }
  void apply(Engine&, const nlohmann::json&) override {}  // the trainer switches the layout

 private:
  RunConfig cfg_;
  cluster::Cluster cluster_;
  double cap_w_;
  double window_s_ = 0;
  int64_t window_n_ = 0;
};

}  // namespace

std::unique_ptr<Controller> make_power_controller(const RunConfig& cfg, const cluster::Cluster& cluster,
                                                  double cap_w) {
  return std::make_unique<PowerController>(cfg, cluster, cap_w);
}

}  // namespace adgt
