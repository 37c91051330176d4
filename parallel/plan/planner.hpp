// The planner behind parallel.auto (docs/planner.md): every feasible layout
// of the run for the cluster it is given — tp, pp, dp, ep, ZeRO-1, sequence
// parallelism, schedule and virtual stages, the stage split, micro-batch and
// recompute — whose memory fits with headroom (the dry-run estimator),
// ranked by the simulator (parallel/sim/, the one cost model); keys the user
// set are constraints. Pure: no MPI, nothing allocated on a device; the
// launch-time side (cluster detection, the profile, the broadcast) is
// launch_plan.hpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/sim/step_sim.hpp"
#include "parallel/sim/sweep.hpp"

namespace adgt::plan {

struct PlanInput {
  RunConfig base;                  // the run as configured
  std::vector<std::string> fixed;  // "section.key" the user set (explicit_keys()): kept
  int64_t world = 0;               // ranks to plan for
  cluster::Cluster cluster;        // with at least `world` devices
  sim::SimOptions sim;
  double headroom = 0.1;           // of each device's memory kept free
  size_t top = 10;                 // rows of the table (the search is exact for these)
  int64_t max_tp = 0;              // > 0: tp at most this (an NVLink domain); 0: a node
};

struct PlanRow {
  RunConfig cfg;  // base with the plan's layout
  sim::SimResult result;
  std::string layout;  // describe_layout()
  std::string limit;   // what limits it beyond compute: "bubble 18%", "dp comm 9%", ...
};

struct Plan {
  std::vector<PlanRow> rows;  // best first; rows[0] is the choice
  int64_t world = 0;
  int64_t candidates = 0, simulated = 0, bounded = 0;
  int64_t rejected_rules = 0, rejected_memory = 0, rejected_fixed = 0;
  std::vector<std::string> fixed;  // the constraints that applied (layout keys only)
  std::vector<std::string> fixed_values;  // their values as the user set them
  double seconds = 0;              // planning time (after the profile)
  std::string costs;               // the cost table's describe()
  const PlanRow& chosen() const { return rows.front(); }
};

// The layout keys the planner chooses (and keeps when the user set them):
// core/layout.hpp's layout_keys().

// Throws ConfigError when nothing fits: "parallel.auto: no plan for 8 ranks
// keeps parallel.pp=3 (set in RUN.yaml or by --set): ...; nearest feasible
// plans: ..." naming the constraints and the nearest plans without them.
Plan make_plan(const PlanInput& in, sim::OpCosts& costs);

// The plan's layout as --set overrides ("parallel.tp=4", ...): applied to the
// run file on every rank after rank 0 broadcasts them.
std::vector<std::string> plan_overrides(const RunConfig& chosen);

// What limits a plan beyond its compute: the largest of the bubble, each
// group's exposed communication and the optimizer as a share of the step
// ("bubble 18%"), "compute" when none reaches 5%; with " mem 93%" when the
// memory estimate takes more than 90% of the device.
std::string plan_limit(const sim::SimResult& r, const cluster::Cluster& cl);

// The table: the cluster, the constraints, the top rows with predicted step
// time, tokens/s, MFU, memory and limit, and how many layouts were
// considered; the chosen row marked.
std::string format_plan(const Plan& p, const cluster::Cluster& cl);

// Megatron-LM's usual hand choice, for comparison: tp = devices per node (the
// largest that divides the heads), the smallest pp that fits, dp the rest,
// 1F1B, micro-batch 1, sequence parallelism with tp > 1, no ZeRO, the least
// recompute that fits. Simulated; none when nothing of that form fits.
std::optional<PlanRow> megatron_default(const PlanInput& in, sim::OpCosts& costs);

// One JSON object for metrics.jsonl and the checkpoint meta: the chosen
// layout, its predicted step time, MFU and memory, the constraints, the
// cluster, the counts and the planning time.
std::string plan_json(const Plan& p, const cluster::Cluster& cl);

}  // namespace adgt::plan
