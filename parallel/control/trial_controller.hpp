// parallel.auto_trials (docs/planner.md "Trials"): the simulator ranks the
// plans, the clock picks among the best, in two rounds. Round 1 runs the
// leader of each structure (the best predicted plan of each (tp, pp, dp, ep),
// the launch's own first); round 2 runs the other candidates of the
// structure whose leader measured fastest (its next micro-batch sizes or
// schedules). Each plan runs `warmup` steps, then `measure` steps; the step
// time is the slowest rank's wall time, and a plan's figure is the median of
// its steps. The controller then asks for the fastest measured plan (an
// in-memory layout switch, docs/reliability.md) and stops. Every switch is at a step boundary
// and moves the state exactly, so the trials change no number the run
// computes (within the switch's f32 carriage of an f64 run).
//
// Decide on one rank, broadcast, log: world rank 0 decides from the step
// times it is given; every rank applies the same decision to the shared
// state (the trainer makes a new controller for every layout, with the same
// state). A plan whose switch did not happen (refused) is not measured: it
// counts as never faster.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "parallel/control/hook.hpp"

namespace adgt::plan {

struct TrialOptions {
  int warmup = 2;   // steps after a (re)start not measured (the first are slow)
  int measure = 3;  // steps measured per plan (their median)
};

struct TrialState {
  std::vector<std::vector<std::string>> plans;  // --set overrides, best predicted first
  std::vector<int> group;                       // per plan: its structure (plans[0]'s is 0)
  std::vector<int> order;                       // the plans to run, in turn (round 1: leaders)
  int pos = 0;                                  // current == order[pos]
  int round = 1;
  std::vector<double> measured;                 // median step per plan (< 0: not measured)
  int current = 0;                              // the plan running now
  int steps = 0;                                // steps since it started
  std::vector<double> samples;                  // its measured steps so far
  bool done = false;
  int kept = -1;                                // the plan kept (when done)
};

// The first plan of each group (by index) leads it; make_trial_state sets the
// order to the leaders. `group` empty: every plan its own group.
TrialState make_trial_state(std::vector<std::vector<std::string>> plans, std::vector<int> group);

// The decider, apart from the loop (unit-tested): the state and one step's
// time in (`running_matches`: the running layout is plans[current]), the
// decision out: {"plan", "sample", "samples", "measured", "current", "pos",
// "order", "round", "steps", "done", "kept", "layout_request" (overrides or
// null), "reason"}. Pure: `s` is not changed; apply_trial() applies it.
nlohmann::json decide_trial(const TrialState& s, const TrialOptions& o, double step_seconds,
                            bool running_matches);
void apply_trial(TrialState& s, const nlohmann::json& decision);

std::unique_ptr<Controller> make_trial_controller(const RunConfig& cfg,
                                                  std::shared_ptr<TrialState> state,
                                                  TrialOptions opts = {});

}  // namespace adgt::plan
