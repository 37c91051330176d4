#include "parallel/control/power_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/layout.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/mesh/parallel_context.hpp"
#include "parallel/plan/launch_plan.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/step_sim.hpp"

namespace adgt {

namespace {

constexpr int64_t kInterval = 5;    // steps between decisions
constexpr int64_t kWarmSteps = 2;   // steps of a run (or layout) before the first
constexpr double kMinGain = 0.05;   // a switch must be predicted this much faster

class PowerController final : public Controller {
 public:
  PowerController(const RunConfig& cfg, PowerInputs in) : cfg_(cfg), in_(std::move(in)) {}
  std::string name() const override { return "power"; }
  void record(Engine&, const StepReport& r) override {
    if (r.step <= r.first_step + kWarmSteps) {  // warm-up (and a new layout's first steps)
      if (r.step == r.first_step + kWarmSteps && in_.telemetry) in_.telemetry();  // the window starts here
      return;
    }
    window_s_ += r.seconds;
    ++window_n_;
  }
  bool due(const StepReport& r) const override {
    return r.step >= r.first_step + kWarmSteps + kInterval && (r.step - r.first_step) % kInterval == 0;
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    (void)r;
    const bool emulated = in_.emulated_cap_w > 0;
    double f = 1.0, share = 0.0, limit = 0.0, power = 0.0, read = 0.0, thermal = 0.0;
    if (emulated) {
      const emulate::Emulation* emu = e.groups().emulation;
      f = emu ? emu->power_factor : 1.0;
    } else if (in_.telemetry) {
      if (const auto sig = in_.telemetry()) {
        const PowerSignal& s = *sig;
        read = s.read ? 1.0 : 0.0;
        f = s.clock_slowdown;
        share = s.throttled_share;
        if (s.limit_w) limit = *s.limit_w;
        if (f > 1.0 + 1e-9 && s.power_w) power = *s.power_w;
        thermal = f > 1.0 + 1e-9 && s.thermal_only ? 1.0 : 0.0;
      }
    }
    const double throttled = f > 1.0 + 1e-9 ? 1.0 : 0.0;
    // Max: [0] the most any rank's clock costs its compute, [1] the window's
    // mean step time (the slowest rank's), [2] the highest mean power of a
    // throttled rank, [3] minus the smallest limit read (-1e300: none), [4] the
    // largest throttled share. Sum: throttled ranks, ranks read, throttled
    // ranks whose reason is thermal only.
    double mx[5] = {f, window_n_ ? window_s_ / double(window_n_) : 0.0, power,
                    limit > 0 ? -limit : -1e300, share};
    double sum[3] = {throttled, read, thermal};
    world.all_reduce(Tensor(mx, DType::F64, {5}), ReduceOp::Max);
    world.all_reduce(Tensor(sum, DType::F64, {3}));
    window_s_ = 0, window_n_ = 0;
    nlohmann::json in = {{"source", emulated ? "emulation" : "telemetry"},
                         {"clock_slowdown", mx[0]},
                         {"step_s", mx[1]},
                         {"throttled_ranks", int64_t(sum[0])},
                         {"micro_batch", cfg_.train.micro_batch}};
    if (emulated) {
      in["power_cap_w"] = in_.emulated_cap_w;
      return in;
    }
    in["telemetry_ranks"] = int64_t(sum[1]);
    in["throttled_share_max"] = mx[4];
    if (mx[3] > -1e299) in["power_limit_w"] = -mx[3];
    if (mx[2] > 0) in["throttled_power_w"] = mx[2];
    const bool thermal_only = sum[0] > 0 && sum[2] == sum[0];
    in["thermal_only"] = thermal_only;
    // The cap to plan under: the enforced limit, or a hot device's power.
    if (thermal_only && mx[2] > 0) in["power_cap_w"] = mx[2];
    else if (mx[3] > -1e299) in["power_cap_w"] = -mx[3];
    else if (mx[2] > 0) in["power_cap_w"] = mx[2];
    return in;
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const double slow = in.at("clock_slowdown").get<double>();
    const bool telemetry = in.at("source") == "telemetry";
    if (slow < 1.0 + cfg_.parallel.adapt_threshold) {
      if (telemetry) return {{"quiet", true}};  // every 5 steps of every run: logged only when throttled
      return {{"action", "none"}, {"why", "no rank throttled beyond parallel.adapt_threshold"}};
    }
    const double cap = in.value("power_cap_w", 0.0);
    nlohmann::json d;
    if (cap <= 0)
      d = {{"action", "none"},
           {"why", "throttled, but no rank read a power limit or its power: nothing to plan under"}};
    else
      d = in_.replan ? decide_layout(cap) : decide_micro_batch(cap);
    // On the console: a switch, and from telemetry every throttled window
    // (the emulation's calm decisions every 5 steps only in the log).
    if (d["action"] == "switch" || telemetry) {
      char b[160];
      std::snprintf(b, sizeof b, "%s clock x%.2f on %ld rank(s), planned under %.0f W: ",
                    telemetry ? "NVML reports the" : "the emulated", slow,
                    long(in.value("throttled_ranks", int64_t(0))), cap);
      std::string what = b;
      if (d["action"] == "switch")
        what += d.contains("micro_batch")
                    ? "micro-batch " + std::to_string(cfg_.train.micro_batch) + " -> " +
                          std::to_string(d["micro_batch"].get<int64_t>())
                    : d.value("layout_now", std::string()) + " -> " + d.value("layout_new", std::string());
      else
        what += "keep (" + d.value("why", std::string()) + ")";
      d["console"] = what;
    }
    return d;
  }

  nlohmann::json decide_micro_batch(double cap) {
    cluster::Cluster cl = in_.cluster;
    cl.device.power.cap_w = cap;
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
      sim::DeviceModelCosts costs(cl.device);
      const double t = sim::simulate_step(c, cl, costs).step_time_s;
      cands.push_back({{"micro_batch", m}, {"predicted_step_s", t}});
      if (m == cfg_.train.micro_batch) now_s = t;
      if (best_s < 0 || t < best_s) best_s = t, best = m;
    }
    nlohmann::json d = {{"candidates", cands}, {"predicted_now_s", now_s}, {"planned_under_w", cap}};
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
  // parallel.auto: the planner under the cap (the launch's cluster, profile
  // and fixed keys), the running layout predicted beside it.
  nlohmann::json decide_layout(double cap) {
    nlohmann::json d = {{"planned_under_w", cap}};
    try {
      const plan::Replan p = plan::replan(cfg_, in_.replan->fixed, in_.replan->hosts, {}, {}, cap);
      const double now = p.current.step_time_s, next = p.planned.step_time_s;
      d["layout_now"] = p.layout_now;
      d["layout_new"] = p.layout_new;
      d["predicted_now_s"] = now;
      d["predicted_step_s"] = next;
      if (p.layout_new == p.layout_now || next > now * (1.0 - kMinGain)) {
        d["action"] = "none";
        d["why"] = "no layout is predicted 5% faster under the cap";
        return d;
      }
      d["action"] = "switch";
      d["layout_request"] = p.overrides;
    } catch (const std::exception& e) {  // no plan: keep the layout, say why
      d["action"] = "none";
      d["why"] = std::string("the re-plan under the cap failed: ") + e.what();
    }
    return d;
  }

  RunConfig cfg_;
  PowerInputs in_;
  double window_s_ = 0;
  int64_t window_n_ = 0;
};

}  // namespace

std::unique_ptr<Controller> make_power_controller(const RunConfig& cfg, PowerInputs in) {
  return std::make_unique<PowerController>(cfg, std::move(in));
}

}  // namespace adgt
