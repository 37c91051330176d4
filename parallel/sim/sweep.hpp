// Every layout of a run for a number of devices, simulated and ranked
// (adgt-sim --sweep, and the planner of parallel/plan/): tp over the divisors
// of the heads that fit in a node, pp over the divisors of the devices up to
// the layers, dp the rest; ep over the divisors of dp and the experts (MoE);
// micro-batch sizes dividing the per-replica batch; ZeRO-1 with dp > 1;
// sequence parallelism on and off with tp > 1; schedules 1f1b, interleaved (2
// or 4 chunks) and zb-h1 with pp > 1 (zb-v is simulated when a run asks for
// it, not swept yet), the layers split evenly or, where the
// stages' speeds differ (node_speed, slow ranks), in proportion to them;
// recompute none, selective and full. A layout is kept when layout_errors()
// has nothing against it and the dry-run memory fits the device with
// `headroom` to spare. Keys named in `fixed` keep the base run's value.
//
// Exact branch and bound: candidates are simulated in the order of a lower
// bound of their step time (the busiest pipeline rank's compute at its speed,
// micro-batch by micro-batch, with nothing overlapped away), and once `keep`
// rows are simulated, a candidate whose bound exceeds the keep-th best step
// time is not simulated (the bound never exceeds the simulated time).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "parallel/sim/step_sim.hpp"

namespace adgt::sim {

struct SweepRow {
  RunConfig cfg;       // the run with the layout in parallel.* and train.micro_batch/recompute
  SimResult result;
  std::string layout;  // "tp=8 pp=2 dp=16 zero=1 sp=1 1f1b v=1 mb=1 rc=selective"
  double lower_bound_s = 0;
};

struct SweepOptions {
  double headroom = 0.1;            // keep 10% of the device memory free
  // "section.key" names held at the base run's value (the planner's
  // constraints): parallel.tp, pp, dp, cp, cp_mode, ep, zero, sequence_parallel, schedule,
  // virtual_stages, stage_layers, microbatches, expert_placement,
  // train.micro_batch, recompute, recompute_layers. Other names are ignored.
  std::vector<std::string> fixed;
  int64_t max_tp = 0;               // 0: devices per node
  size_t keep = 0;                  // > 0: simulate until the best `keep` are certain
  // Context parallelism (cp_mode ring) for long sequences: cp > 1 where each
  // rank keeps at least kCpMinTokens tokens of a sequence. parallel.cp (and
  // cp_mode) given with --set hold it; false: cp as the base run has it.
  bool context_parallel = true;
  // Rank by energy per token (device.power, docs/power.md) instead of step
  // time: every candidate is simulated (the bound is a time's). Throws
  // ConfigError when the cluster's device has no power model.
  bool energy = false;
};
constexpr int64_t kCpMinTokens = 4096;

// `gpus` devices of `cl` (with_gpus applied by the caller). Rows sorted by
// step time (energy per token with opts.energy); with keep > 0, at most the rows it had to simulate (the best
// `keep` among them are the best of all candidates).
struct SweepResult {
  std::vector<SweepRow> rows;
  int64_t candidates = 0;  // layouts that passed the rules, the constraints and memory
  int64_t rejected_rules = 0, rejected_memory = 0, rejected_fixed = 0, bounded = 0;
};
SweepResult sweep_layouts(const RunConfig& base, int64_t gpus, const cluster::Cluster& cl,
                          OpCosts& costs, const SweepOptions& opts = {},
                          const SimOptions& sim = {});

// The lower bound the sweep orders candidates by (seconds).
double step_lower_bound(const RunConfig& cfg, const cluster::Cluster& cl, OpCosts& costs,
                        const SimOptions& sim = {});

// Layers per stage (pp x virtual_stages entries) in proportion to each
// pipeline rank's speed (the slowest device of its tp x dp ranks: node_speed
// and slow ranks), each stage at least one layer; empty when every pipeline
// rank runs at the same speed.
std::vector<int64_t> speed_weighted_stages(const RunConfig& cfg, const cluster::Cluster& cl,
                                           const SimOptions& sim = {});

std::string describe_layout(const RunConfig& cfg);

}  // namespace adgt::sim
