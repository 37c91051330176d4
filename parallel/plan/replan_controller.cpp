// parallel.auto at run time (replan_controller.hpp; docs/planner.md "Re-planning").
#include "parallel/plan/replan_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/adapt/change_detector.hpp"
#include "parallel/mpi_env.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/plan/launch_plan.hpp"

namespace adgt::plan {

std::map<int, double> ReplanDecider::estimate() const {
  // The median of each rank's window; below min_slowdown it is measurement
  // noise (ranks sharing cores, caches) and counts as full speed.
  std::map<int, double> out;
  for (const auto& [r, w] : window_) {
    if (w.empty()) continue;
    const double f = adapt::upper_median(w);
    out[r] = f < o_.min_slowdown ? 1.0 : f;
  }
  return out;
}

nlohmann::json ReplanDecider::add(const std::vector<ReplanSample>& step, const PlanFn& plan) {
  // Slowdown: the time over that of the ranks doing the same work (the same
  // pipeline rank): the median of the faster half of them, so one slow rank
  // does not set the reference and one fast outlier does not either.
  std::map<int, std::vector<double>> by_stage;
  for (const ReplanSample& s : step)
    if (s.seconds > 0) by_stage[s.stage].push_back(s.seconds);
  std::map<int, double> ref;
  for (auto& [st, v] : by_stage) {
    std::sort(v.begin(), v.end());
    const size_t half = (v.size() + 1) / 2;  // the faster half (at least one)
    ref[st] = half % 2 ? v[half / 2] : 0.5 * (v[half / 2 - 1] + v[half / 2]);
  }
  for (const ReplanSample& s : step) {
    auto it = ref.find(s.stage);
    if (it == ref.end() || s.seconds <= 0 || it->second <= 0) continue;
    std::vector<double>& w = window_[s.launcher];
    w.push_back(s.seconds / it->second);
    if (int(w.size()) > o_.window) w.erase(w.begin());
  }
  if (window_.empty()) return {};
  for (const auto& [r, w] : window_)
    if (int(w.size()) < o_.window) return {};
  const std::map<int, double> est = estimate();
  bool changed = false;
  for (const auto& [r, f] : est) {
    const auto it = s_->planned.find(r);
    const double was = it == s_->planned.end() ? 1.0 : it->second;
    if (std::abs(f / was - 1.0) > o_.threshold) changed = true;
  }
  // A change must hold for `confirm` steps in a row: on ranks sharing cores
  // one rank's CPU time can read 2x its peer's for a few steps (a clean
  // 4-rank run re-planned twice without it).
  pending_ = changed ? pending_ + 1 : 0;
  if (pending_ < o_.confirm) return {};
  pending_ = 0;
  // The planner gets the slow ranks (the others are at full speed).
  std::map<int, double> slow;
  for (const auto& [r, f] : est)
    if (f > 1.0) slow[r] = f;
  nlohmann::json d = plan(slow);
  nlohmann::json measured = nlohmann::json::object(), was = nlohmann::json::object();
  for (const auto& [r, f] : est) measured[std::to_string(r)] = std::round(f * 1000) / 1000;
  for (const auto& [r, f] : s_->planned) was[std::to_string(r)] = std::round(f * 1000) / 1000;
  d["measured_slowdown"] = measured;
  d["planned_for"] = was;
  s_->planned = est;
  ++s_->replans;
  if (d.contains("layout_request") && d["layout_request"].is_array() && !d["layout_request"].empty())
    ++s_->switches;
  window_.clear();
  return d;
}

namespace {

class ReplanController final : public Controller {
 public:
  ReplanController(const RunConfig& cfg, std::shared_ptr<ReplanState> s, ReplanOptions o)
      : cfg_(cfg), o_(o), s_(s), decider_(o, s) {}
  std::string name() const override { return "replan"; }
  bool due(const StepReport& r) const override {
    if (first_ < 0) first_ = r.step;  // the same step on every rank
    return r.step - first_ >= o_.warmup && r.step < r.total_steps;
  }
  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    double secs = 0;
    if (e.pipelined())
      secs = e.pipeline()->last_busy_seconds();
    else
      secs = std::max(0.0, r.seconds - r.tp_seconds - r.pp_seconds - r.ep_seconds -
                               e.last_times().dp_wait_s);
    double mine[3] = {double(world_rank_or(world.rank())), double(e.groups().coords.pp), secs};
    const int n = world.size();
    std::vector<double> all(size_t(3 * n));
    world.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(mine, DType::F64, {3}));
    nlohmann::json launcher = nlohmann::json::array(), stage = nlohmann::json::array(),
                   seconds = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      launcher.push_back(int(all[size_t(3 * i)]));
      stage.push_back(int(all[size_t(3 * i + 1)]));
      seconds.push_back(all[size_t(3 * i + 2)]);
    }
    return {{"launcher", launcher}, {"stage", stage}, {"seconds", seconds}};
  }
  nlohmann::json decide(const nlohmann::json& in) override {
    std::vector<ReplanSample> step;
    for (size_t i = 0; i < in["seconds"].size(); ++i)
      step.push_back({in["launcher"][i].get<int>(), in["stage"][i].get<int>(), in["seconds"][i].get<double>()});
    nlohmann::json d = decider_.add(step, [&](const std::map<int, double>& slow) {
      nlohmann::json rec;
      try {
        const Replan p = replan(cfg_, s_->fixed, s_->hosts, slow);
        const double now = p.current.step_time_s, next = p.planned.step_time_s;
        rec["layout_now"] = p.layout_now;
        rec["layout_new"] = p.layout_new;
        rec["predicted_now_s"] = now;
        rec["predicted_new_s"] = next;
        const bool better = p.layout_new != p.layout_now && next < now * (1.0 - o_.min_gain);
        rec["layout_request"] = better ? nlohmann::json(p.overrides) : nlohmann::json();
        char why[200];
        std::snprintf(why, sizeof why, "%s: predicted %.4g s against %.4g s now (%+.1f%%)",
                      better ? "switch" : "keep", next, now, 100.0 * (next / now - 1.0));
        rec["reason"] = why;
        std::printf("replan: measured slowdowns changed; %s; %s -> %s\n", why, p.layout_now.c_str(),
                    p.layout_new.c_str());
        std::fflush(stdout);
      } catch (const std::exception& e) {  // no plan: keep the layout, say why
        rec["layout_request"] = nullptr;
        rec["reason"] = std::string("keep: the re-plan failed: ") + e.what();
        std::fprintf(stderr, "replan: %s\n", rec["reason"].get<std::string>().c_str());
      }
      return rec;
    });
    if (d.is_null() || d.empty()) return {{"quiet", true}};
    return d;
  }
  // The switch itself is the decision's "layout_request" (the trainer's).
  void apply(Engine&, const nlohmann::json&) override {}

 private:
  RunConfig cfg_;
  ReplanOptions o_;
  std::shared_ptr<ReplanState> s_;
  ReplanDecider decider_;
  mutable int64_t first_ = -1;
};

}  // namespace

std::unique_ptr<Controller> make_replan_controller(const RunConfig& cfg,
                                                   std::shared_ptr<ReplanState> state,
                                                   ReplanOptions opts) {
  opts.threshold = cfg.parallel.adapt_threshold;  // one threshold for the adaptive layer
  return std::make_unique<ReplanController>(cfg, std::move(state), opts);
}

}  // namespace adgt::plan
