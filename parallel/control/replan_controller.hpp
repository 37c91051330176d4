// parallel.auto at run time (docs/planner.md "Re-planning"): the planner
// triggers an in-memory layout switch when the measured cluster changes.
//
// After every step each rank's compute time is agreed over the world (an
// all-gather of launcher rank, pipeline rank and seconds): the pipeline
// executor's busy time with pp > 1 (compute only, CPU time x the emulated
// slowdown on host backends), else the step's wall time less the time spent
// waiting in tp, pp, ep and the exposed dp reduction. A rank's slowdown is
// its time over that of the ranks doing the same work (the same pipeline
// rank: every tp and dp replica of a stage; the median of their faster half).
// World rank 0 keeps the last `window` samples per rank; a median below
// `min_slowdown` counts as 1 (noise: on ranks sharing 2 cores, ranks doing
// the same work measure up to 1.67x apart, and for a few steps even 2x).
// Once a rank's estimate has differed from the slowdown the running layout
// was planned for by more than `threshold` for `confirm` steps in a row, it
// re-plans (launch_plan.hpp replan: the same cluster and profile, with the
// measured slowdowns) and asks for the plan's layout when it is predicted at
// least `min_gain` faster than the running one on the measured cluster
// (the decision's "layout_request"; the trainer switches in memory). Either
// way the measured slowdowns become the ones planned for, so the same
// change does not re-plan again; a straggler that recovers is a change too.
// Every re-plan is logged with the measurements and both predictions.
// A uniform slowdown of every rank of a stage is invisible here (nothing to
// compare with), and so is a layout with one rank per pipeline rank.
//
// Pipeline links are measured too: each rank's seconds per message received
// from its pipeline predecessor (the link emulation's timing with
// emulate.cluster, else a ping-pong probe every `probe_every` steps), over
// the cluster model's time for the same message on that link
// (link_model_times), relative to the median of the faster half of all the
// links' ratios (a uniform error of the model cancels). Links are windowed,
// floored and confirmed like ranks; a changed link re-plans with the
// measured link factors (the simulator's SimOptions::slow_links). A link
// the new layout no longer uses keeps the factor it was last measured at.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "parallel/adapt/change_detector.hpp"
#include "parallel/control/hook.hpp"

namespace adgt::plan {

struct ReplanOptions {
  int warmup = 5;          // steps after a (re)start not measured (the first are slow)
  int window = 5;          // samples per rank (the median is the estimate)
  int confirm = 5;         // consecutive steps a change must hold before the re-plan
  double threshold = 0.25; // relative change of a rank's slowdown that re-plans
                           // (make_replan_controller: parallel.adapt_threshold)
  double min_slowdown = 2.0; // a rank's slowdown below this counts as 1 (noise)
  double min_gain = 0.05;  // predicted gain that switches
  int probe_every = 10;    // steps between link probes on real transports
};

// Shared by the controllers made for each layout of the run (the trainer
// makes a new one after every switch).
struct ReplanState {
  std::vector<std::string> hosts;  // launcher rank -> host (the launch's)
  std::vector<std::string> fixed;  // the keys the user set (kept by the planner)
  std::map<int, double> planned;   // launcher rank -> slowdown the running layout assumes
  // {launcher a, launcher b} (a < b) -> link factor the running layout assumes (> 1 only)
  std::map<std::pair<int, int>, double> planned_links;
  int64_t replans = 0, switches = 0;
};

// The decider, apart from the loop (unit-tested): one step's per-rank
// samples in, a decision out when due. One adapt::ChangeDetector per rank
// and link holds the window, its median and the band around the planned
// slowdown; the confirmation is over all of them together. `plan` runs the planner (replan() in
// the trainer; a stub in tests) and returns {overrides or empty, record}.
struct ReplanSample {
  int launcher = 0, stage = 0;
  double seconds = 0;
};
// One pipeline link's sample: launcher ranks a != b, the measured seconds of
// a message and the cluster model's for the same message (both > 0 to count).
struct ReplanLink {
  int a = 0, b = 0;
  double seconds = 0, model = 0;
};
using LinkKey = std::pair<int, int>;  // {launcher a, launcher b}, a < b
class ReplanDecider {
 public:
  using PlanFn = std::function<nlohmann::json(const std::map<int, double>& slow,
                                              const std::map<LinkKey, double>& slow_links)>;
  ReplanDecider(ReplanOptions o, std::shared_ptr<ReplanState> s) : o_(o), s_(std::move(s)) {}
  // Adds a step's samples (ranks, and the links measured this step);
  // returns {} (nothing to do) or the decision: {"measured_slowdown":
  // {rank: f}, "planned_for": {...}, "measured_link_slowdown": {"a-b": f},
  // "planned_for_links": {...}, ... plan's record}.
  nlohmann::json add(const std::vector<ReplanSample>& step, const PlanFn& plan,
                     const std::vector<ReplanLink>& links = {});
  // The current estimate per launcher rank (the median of the window).
  std::map<int, double> estimate() const;
  // The same per link (links with a full window only).
  std::map<LinkKey, double> link_estimate() const;

 private:
  adapt::DetectorOptions detector_options() const;
  // A detector whose reference is `planned` (the slowdown planned for).
  adapt::ChangeDetector detector(double planned) const;
  double floored(double f) const;  // below min_slowdown: 1 (noise)
  ReplanOptions o_;
  std::shared_ptr<ReplanState> s_;
  std::map<int, adapt::ChangeDetector> ranks_;     // launcher rank -> its slowdowns
  std::map<LinkKey, adapt::ChangeDetector> links_;  // link -> its slowdowns
  int pending_ = 0;  // consecutive steps with a change
};

std::unique_ptr<Controller> make_replan_controller(const RunConfig& cfg,
                                                   std::shared_ptr<ReplanState> state,
                                                   ReplanOptions opts = {});

}  // namespace adgt::plan
