// parallel.auto_trials (trial_controller.hpp; docs/planner.md "Trials").
#include "parallel/control/trial_controller.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "parallel/adapt/change_detector.hpp"
#include "parallel/plan/planner.hpp"

namespace adgt::plan {

TrialState make_trial_state(std::vector<std::vector<std::string>> plans, std::vector<int> group) {
  TrialState s;
  s.plans = std::move(plans);
  s.group = std::move(group);
  if (s.group.size() != s.plans.size()) {
    s.group.resize(s.plans.size());
    for (size_t i = 0; i < s.group.size(); ++i) s.group[i] = int(i);
  }
  std::vector<int> seen;
  for (size_t i = 0; i < s.plans.size(); ++i)
    if (std::find(seen.begin(), seen.end(), s.group[i]) == seen.end()) {
      seen.push_back(s.group[i]);
      s.order.push_back(int(i));
    }
  s.current = s.order.empty() ? 0 : s.order.front();
  return s;
}

nlohmann::json decide_trial(const TrialState& s, const TrialOptions& o, double step_seconds,
                            bool running_matches) {
  nlohmann::json d;
  d["plan"] = s.current;
  d["sample"] = step_seconds;
  std::vector<double> samples = s.samples, measured = s.measured;
  measured.resize(s.plans.size(), -1.0);
  int current = s.current, steps = s.steps + 1, pos = s.pos, round = s.round;
  std::vector<int> order = s.order;
  if (order.empty()) order.push_back(s.current);
  bool finished = false;
  std::string reason;
  if (!running_matches) {
    // The switch to this plan did not happen: it is not measured.
    reason = "plan " + std::to_string(current) + " is not running (its switch was refused)";
    finished = true;
  } else if (steps > o.warmup) {
    samples.push_back(step_seconds);
    reason = "measuring plan " + std::to_string(current);
    if (int(samples.size()) >= o.measure) {
      measured[size_t(current)] = adapt::upper_median(samples);
      finished = true;
      reason = "plan " + std::to_string(current) + " measured";
    }
  } else {
    reason = "warming up plan " + std::to_string(current);
  }
  d["layout_request"] = nullptr;
  d["done"] = false;
  d["kept"] = -1;
  if (finished) {
    samples.clear();
    steps = 0;
    auto fastest = [&] {
      int best = -1;
      for (size_t i = 0; i < measured.size(); ++i)
        if (measured[i] > 0 && (best < 0 || measured[i] < measured[size_t(best)])) best = int(i);
      return best;
    };
    if (pos + 1 >= int(order.size()) && round == 1) {
      // Round 2: the rest of the fastest leader's structure, best predicted first.
      round = 2;
      const int lead = fastest();
      if (lead >= 0)
        for (size_t i = 0; i < s.plans.size(); ++i)
          if (int(i) != lead && s.group.size() == s.plans.size() &&
              s.group[i] == s.group[size_t(lead)] &&
              std::find(order.begin(), order.end(), int(i)) == order.end())
            order.push_back(int(i));
      if (pos + 1 < int(order.size()))
        reason += "; round 2 in plan " + std::to_string(lead) + "'s structure";
    }
    if (pos + 1 < int(order.size())) {
      current = order[size_t(++pos)];
      d["layout_request"] = s.plans[size_t(current)];
      reason += "; trying plan " + std::to_string(current);
    } else {
      int best = fastest();
      if (best < 0) best = order.front();
      d["done"] = true;
      d["kept"] = best;
      if (best != current) d["layout_request"] = s.plans[size_t(best)];
      reason += "; keeping plan " + std::to_string(best);
      current = best;
    }
  }
  d["samples"] = samples;
  d["measured"] = measured;
  d["order"] = order;
  d["pos"] = pos;
  d["round"] = round;
  d["current"] = current;
  d["steps"] = steps;
  d["reason"] = reason;
  return d;
}

void apply_trial(TrialState& s, const nlohmann::json& d) {
  s.samples = d.at("samples").get<std::vector<double>>();
  s.measured = d.at("measured").get<std::vector<double>>();
  s.current = d.at("current").get<int>();
  s.order = d.at("order").get<std::vector<int>>();
  s.pos = d.at("pos").get<int>();
  s.round = d.at("round").get<int>();
  s.steps = d.at("steps").get<int>();
  s.done = d.at("done").get<bool>();
  s.kept = d.at("kept").get<int>();
}

namespace {

class TrialController final : public Controller {
 public:
  TrialController(const RunConfig& cfg, std::shared_ptr<TrialState> s, TrialOptions o)
      : o_(o), s_(std::move(s)), running_(plan_overrides(cfg)) {}
  std::string name() const override { return "trials"; }
  bool due(const StepReport& r) const override {
    return !s_->done && s_->plans.size() > 1 && r.step < r.total_steps;
  }
  nlohmann::json observe(Engine&, const StepReport& r, Comm& world) override {
    // The step took as long as its slowest rank.
    double t = r.seconds;
    world.all_reduce(Tensor(&t, DType::F64, {1}), ReduceOp::Max);
    const auto& want = s_->plans[size_t(s_->current)];
    return {{"step_s", t}, {"running_matches", running_ == want}};
  }
  nlohmann::json decide(const nlohmann::json& in) override {
    nlohmann::json d = decide_trial(*s_, o_, in.at("step_s").get<double>(),
                                    in.at("running_matches").get<bool>());
    if (d["layout_request"].is_array() || d["done"].get<bool>()) {
      std::string m;
      for (size_t i = 0; i < d["measured"].size(); ++i) {
        char b[64];
        std::snprintf(b, sizeof b, "%s%zu: %.4g s", i ? ", " : "", i, d["measured"][i].get<double>());
        m += b;
      }
      std::printf("trials: %s (measured %s)\n", d["reason"].get<std::string>().c_str(), m.c_str());
      std::fflush(stdout);
    }
    return d;
  }
  void apply(Engine&, const nlohmann::json& d) override { apply_trial(*s_, d); }

 private:
  TrialOptions o_;
  std::shared_ptr<TrialState> s_;
  std::vector<std::string> running_;  // this layout's overrides
};

}  // namespace

std::unique_ptr<Controller> make_trial_controller(const RunConfig& cfg,
                                                  std::shared_ptr<TrialState> state,
                                                  TrialOptions opts) {
  return std::make_unique<TrialController>(cfg, std::move(state), opts);
}

}  // namespace adgt::plan
