// parallel.auto_trials' decider (parallel/control/trial_controller.hpp): warm-up
// steps are not measured, each plan's median is kept, the next plan is asked
// for in turn, the fastest measured is kept at the end (a switch back when it
// is not the last), and a plan whose switch did not happen is skipped.
#include <catch2/catch.hpp>

#include "parallel/plan/launch_plan.hpp"
#include "parallel/control/trial_controller.hpp"

using namespace adgt::plan;

namespace {
// Runs the decider over `times[plan]` per step until done; returns the decisions.
std::vector<nlohmann::json> run(TrialState& s, const TrialOptions& o,
                                const std::vector<std::vector<double>>& times, int refused = -1) {
  std::vector<nlohmann::json> out;
  std::vector<size_t> at(times.size(), 0);
  for (int guard = 0; !s.done && guard < 1000; ++guard) {
    const int p = s.current;
    const double t = times[size_t(p)][at[size_t(p)]++ % times[size_t(p)].size()];
    out.push_back(decide_trial(s, o, t, p != refused));
    apply_trial(s, out.back());
  }
  return out;
}
}  // namespace

TEST_CASE("trials: each plan measured after its warm-up, the fastest kept", "[trials]") {
  TrialState s = make_trial_state({{"parallel.dp=8"}, {"parallel.dp=4", "parallel.pp=2"}, {"parallel.tp=2"}}, {});
  const TrialOptions o{2, 3};
  // plan 1 is fastest once warm; its warm-up steps are slow and must not count.
  const auto d = run(s, o, {{9, 9, 1.0, 1.2, 1.1}, {20, 20, 0.5, 0.7, 0.6}, {0.1, 0.1, 0.9, 0.8, 0.9}});
  REQUIRE(s.done);
  CHECK(s.kept == 1);
  CHECK(s.measured == std::vector<double>{1.1, 0.6, 0.9});
  CHECK(d.size() == 15);  // 3 plans x (2 warm-up + 3 measured)
  // plan 1 asked for after plan 0's fifth step, plan 2 after plan 1's, plan 1 again at the end
  CHECK(d[4]["layout_request"] == nlohmann::json(s.plans[1]));
  CHECK(d[9]["layout_request"] == nlohmann::json(s.plans[2]));
  CHECK(d[14]["layout_request"] == nlohmann::json(s.plans[1]));
  for (size_t i = 0; i < d.size(); ++i)
    if (i != 4 && i != 9 && i != 14) CHECK(d[i]["layout_request"].is_null());
}

TEST_CASE("trials: the last plan kept needs no switch; a refused switch is not measured", "[trials]") {
  {
    TrialState s = make_trial_state({{"a=1"}, {"a=2"}}, {});
    const auto d = run(s, {1, 2}, {{2, 2, 2}, {1, 1, 1}});
    CHECK(s.kept == 1);
    CHECK(d.back()["layout_request"].is_null());
    CHECK(d.back()["done"].get<bool>());
  }
  {
    TrialState s = make_trial_state({{"a=1"}, {"a=2"}, {"a=3"}}, {});
    // plan 1's switch is refused: its steps run plan 0's layout and must not be measured as plan 1's
    const auto d = run(s, {1, 2}, {{2, 2, 2}, {0.1, 0.1, 0.1}, {3, 3, 3}}, 1);
    CHECK(s.kept == 0);
    CHECK(s.measured[1] < 0);
    CHECK(s.measured[2] == 3);
    CHECK(d.back()["layout_request"] == nlohmann::json(s.plans[0]));
  }
}

TEST_CASE("trials: round 2 runs the rest of the fastest leader's structure", "[trials]") {
  // Structures 0, 1, 2 lead; plans 3 and 4 belong to structure 1, plan 5 to 0.
  TrialState s = make_trial_state({{"p=0"}, {"p=1"}, {"p=2"}, {"p=3"}, {"p=4"}, {"p=5"}},
                                  {0, 1, 2, 1, 1, 0});
  REQUIRE(s.order == std::vector<int>{0, 1, 2});
  const auto d = run(s, {1, 2}, {{3, 3, 3}, {2, 2, 2}, {4, 4, 4}, {1.5, 1.5, 1.5}, {2.5, 2.5, 2.5}, {0.1, 0.1, 0.1}});
  REQUIRE(s.done);
  CHECK(s.order == std::vector<int>{0, 1, 2, 3, 4});  // plan 5 (structure 0, fast) never runs
  CHECK(s.kept == 3);
  CHECK(s.measured[5] < 0);
  CHECK(d.back()["layout_request"] == nlohmann::json(s.plans[3]));
  CHECK(s.round == 2);
}

TEST_CASE("trials: candidates are the best plan of each structure within 25% of the best", "[trials]") {
  Plan p;
  auto row = [&](int64_t tp, int64_t pp, int64_t dp, int64_t mb, double t) {
    PlanRow r;
    r.cfg.parallel.tp = tp, r.cfg.parallel.pp = pp, r.cfg.parallel.dp = dp, r.cfg.parallel.ep = 1;
    r.cfg.train.micro_batch = mb;
    r.result.step_time_s = t;
    p.rows.push_back(r);
  };
  row(1, 4, 2, 4, 1.00);
  row(1, 4, 2, 2, 1.01);  // the same structure: skipped
  row(1, 8, 1, 4, 1.05);
  row(1, 1, 8, 4, 1.20);
  row(2, 1, 4, 4, 1.30);  // more than 25% slower: not tried
  CHECK(trial_rows(p, 4) == std::vector<size_t>{0, 2, 3});
  CHECK(trial_rows(p, 2) == std::vector<size_t>{0, 2});
  CHECK(trial_rows(p, 4, 0.5) == std::vector<size_t>{0, 2, 3, 4});
  CHECK(trial_rows(p, 0).empty());
  // round 2's candidates: the leaders' siblings, any prediction
  row(1, 1, 8, 2, 1.40);
  const auto c = trial_candidates(p, 4);
  CHECK(c == std::vector<std::pair<size_t, int>>{{0, 0}, {2, 1}, {3, 2}, {1, 0}, {5, 2}});
}
