// The re-planning decider of parallel.auto (parallel/control/replan_controller.hpp):
// when it calls the planner, with which slowdowns, and what it remembers.
#include <catch2/catch.hpp>

#include "parallel/control/replan_controller.hpp"

using adgt::plan::LinkKey;
using adgt::plan::ReplanDecider;
using adgt::plan::ReplanLink;
using adgt::plan::ReplanOptions;
using adgt::plan::ReplanSample;
using adgt::plan::ReplanState;
using Catch::Matchers::WithinRel;

namespace {

// `base` seconds of sample r at `step`, scaled by 1 + jitter * ((r + step) %
// 3 - 1) (the noise of ranks sharing cores) and by slow[r] when given.
double sample(double base, int r, int step, const std::map<int, double>& slow, double jitter) {
  double t = base * (1 + jitter * double((r + step) % 3 - 1));
  if (auto it = slow.find(r); it != slow.end()) t *= it->second;
  return t;
}

// 8 ranks, pipeline rank = launcher rank / 4 (two stages of 4 replicas);
// stage 1 takes twice stage 0's time (unequal work must not read as slow);
// `slow`: rank -> factor.
std::vector<ReplanSample> step_of(int step, std::map<int, double> slow, double jitter = 0) {
  std::vector<ReplanSample> out;
  for (int r = 0; r < 8; ++r) out.push_back({r, r / 4, sample(r / 4 == 0 ? 1.0 : 2.0, r, step, slow, jitter)});
  return out;
}

// The 8 ranks' pipeline links of two stages (rank r of stage 0 sends to
// r + 4): intra-node links (model 1 ms) for ranks 0-1, inter-node (model
// 10 ms) for the others, measured at 1.3x the model (a uniform model error);
// `slow`: link r-(r+4) -> factor.
std::vector<ReplanLink> links_of(int step, std::map<int, double> slow, double jitter = 0) {
  std::vector<ReplanLink> out;
  for (int r = 0; r < 4; ++r) {
    const double model = r < 2 ? 1e-3 : 1e-2;
    out.push_back({r, r + 4, sample(1.3 * model, r, step, slow, jitter), model});
  }
  return out;
}

}  // namespace

TEST_CASE("replan: a straggler re-plans once, with its measured slowdown", "[replan]") {
  auto state = std::make_shared<ReplanState>();
  ReplanDecider d(ReplanOptions{}, state);
  std::vector<std::map<int, double>> calls;
  const auto plan = [&](const std::map<int, double>& slow, const std::map<LinkKey, double>&) {
    calls.push_back(slow);
    return nlohmann::json{{"layout_request", {"parallel.stage_layers=[1,7]"}}};
  };
  // Noise of +-30% among equal ranks and unequal stages: no re-plan.
  for (int s = 0; s < 20; ++s) CHECK(d.add(step_of(s, {}, 0.3), plan).empty());
  CHECK(calls.empty());
  // Rank 6 (stage 1) becomes 4x slower: after the window fills with it.
  nlohmann::json out;
  int at = -1;
  for (int s = 20; s < 40 && at < 0; ++s) {
    out = d.add(step_of(s, {{6, 4.0}}, 0.1), plan);
    if (!out.empty()) at = s;
  }
  // The median of 5 turns once 3 slow samples are in (step 22); the change
  // must then hold 5 steps (confirm).
  REQUIRE(at >= 26);
  CHECK(at <= 28);
  REQUIRE(calls.size() == 1);
  REQUIRE(calls[0].size() == 1);
  CHECK_THAT(calls[0].at(6), WithinRel(4.0, 0.15));
  CHECK(out["measured_slowdown"]["6"].get<double>() > 3.4);
  CHECK(out["measured_slowdown"]["0"].get<double>() == 1.0);
  CHECK(out["planned_for"].empty());
  CHECK(state->replans == 1);
  CHECK(state->switches == 1);
  CHECK_THAT(state->planned.at(6), WithinRel(4.0, 0.15));
  // The same straggler: planned for already, no new re-plan.
  for (int s = 40; s < 60; ++s) CHECK(d.add(step_of(s, {{6, 4.0}}, 0.1), plan).empty());
  CHECK(calls.size() == 1);
  // It recovers: a change again, re-planned with nobody slow.
  bool again = false;
  for (int s = 60; s < 70 && !again; ++s) again = !d.add(step_of(s, {}, 0.1), plan).empty();
  CHECK(again);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].empty());
}

TEST_CASE("replan: below min_slowdown is noise; the threshold is relative", "[replan]") {
  auto state = std::make_shared<ReplanState>();
  int calls = 0;
  const auto plan = [&](const std::map<int, double>&, const std::map<LinkKey, double>&) {
    ++calls;
    return nlohmann::json{{"layout_request", nullptr}};
  };
  ReplanDecider d(ReplanOptions{}, state);
  for (int s = 0; s < 30; ++s) d.add(step_of(s, {{2, 1.8}}), plan);  // 1.8 < 2: noise
  CHECK(calls == 0);
  for (int s = 30; s < 40; ++s) d.add(step_of(s, {{2, 3.0}}), plan);
  CHECK(calls == 1);
  CHECK(state->switches == 0);  // the planner kept the layout
  for (int s = 40; s < 60; ++s) d.add(step_of(s, {{2, 3.6}}), plan);  // +20% < 25%
  CHECK(calls == 1);
  for (int s = 60; s < 70; ++s) d.add(step_of(s, {{2, 4.5}}), plan);  // +50%
  CHECK(calls == 2);
}

TEST_CASE("replan: a slowdown that lasts shorter than confirm does not re-plan", "[replan]") {
  auto state = std::make_shared<ReplanState>();
  int calls = 0;
  const auto plan = [&](const std::map<int, double>&, const std::map<LinkKey, double>&) {
    ++calls;
    return nlohmann::json::object();
  };
  ReplanDecider d(ReplanOptions{}, state);
  for (int s = 0; s < 10; ++s) d.add(step_of(s, {}), plan);
  // Rank 5 reads 3x for 4 steps: the median of 5 is slow for 4 steps
  // (from its 3rd slow sample to 2 samples after the last), < confirm.
  for (int s = 10; s < 14; ++s) d.add(step_of(s, {{5, 3.0}}), plan);
  for (int s = 14; s < 40; ++s) d.add(step_of(s, {}), plan);
  CHECK(calls == 0);
  // For 9 steps: slow medians from step 42 on, which re-plans at the 5th.
  for (int s = 40; s < 49; ++s) d.add(step_of(s, {{5, 3.0}}), plan);
  CHECK(calls == 1);
}

TEST_CASE("replan: the window is per rank and a missing sample waits", "[replan]") {
  auto state = std::make_shared<ReplanState>();
  int calls = 0;
  const auto plan = [&](const std::map<int, double>&, const std::map<LinkKey, double>&) {
    ++calls;
    return nlohmann::json::object();
  };
  ReplanOptions o;
  o.window = 3;
  o.confirm = 1;
  ReplanDecider d(o, state);
  // Rank 5 reports no time (0) in every other step: its window fills later.
  for (int s = 0; s < 4; ++s) {
    auto st = step_of(s, {{1, 5.0}});
    if (s % 2) st[5].seconds = 0;
    d.add(st, plan);
  }
  CHECK(calls == 0);  // rank 5 has 2 of 3 samples
  d.add(step_of(4, {{1, 5.0}}), plan);
  CHECK(calls == 1);
  CHECK(d.estimate().empty());  // the window is cleared after a decision
}

TEST_CASE("replan: a slow pipeline link re-plans with its factor, once", "[replan]") {
  auto state = std::make_shared<ReplanState>();
  ReplanDecider d(ReplanOptions{}, state);
  std::vector<std::map<LinkKey, double>> calls;
  const auto plan = [&](const std::map<int, double>& slow, const std::map<LinkKey, double>& links) {
    if (calls.empty()) CHECK(slow.empty());  // the link alone, first
    calls.push_back(links);
    return nlohmann::json{{"layout_request", {"parallel.pp=1"}}};
  };
  // Links of two classes and a model 1.3x off, +-20% noise: no re-plan.
  for (int s = 0; s < 20; ++s) CHECK(d.add(step_of(s, {}), plan, links_of(s, {}, 0.2)).empty());
  CHECK(calls.empty());
  // Link 2-6 turns 4x slower.
  nlohmann::json out;
  int at = -1;
  for (int s = 20; s < 40 && at < 0; ++s) {
    out = d.add(step_of(s, {}), plan, links_of(s, {{2, 4.0}}, 0.05));
    if (!out.empty()) at = s;
  }
  REQUIRE(at >= 26);
  CHECK(at <= 28);
  REQUIRE(calls.size() == 1);
  REQUIRE(calls[0].size() == 1);
  CHECK_THAT(calls[0].at({2, 6}), WithinRel(4.0, 0.1));
  CHECK(out["measured_link_slowdown"]["2-6"].get<double>() > 3.6);
  CHECK(out["measured_link_slowdown"]["0-4"].get<double>() == 1.0);
  CHECK_THAT(state->planned_links.at({2, 6}), WithinRel(4.0, 0.1));
  // Planned for: no new re-plan while it stays.
  for (int s = 40; s < 60; ++s) CHECK(d.add(step_of(s, {}), plan, links_of(s, {{2, 4.0}})).empty());
  CHECK(calls.size() == 1);
  // A layout without the link (no samples of it): nothing changes, and a
  // later re-plan (a straggler) still gets the link's factor.
  for (int s = 60; s < 80; ++s) d.add(step_of(s, {{1, 3.0}}), plan);
  REQUIRE(calls.size() == 2);
  CHECK_THAT(calls[1].at({2, 6}), WithinRel(4.0, 0.1));
  // Measured again at full speed: re-planned without it.
  bool again = false;
  for (int s = 80; s < 100 && !again; ++s)
    again = !d.add(step_of(s, {{1, 3.0}}), plan, links_of(s, {})).empty();
  CHECK(again);
  REQUIRE(calls.size() == 3);
  CHECK(calls[2].empty());
}
