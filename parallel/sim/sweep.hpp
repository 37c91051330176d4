// Every layout of a run for a number of devices, simulated and ranked
// (adgt-sim --sweep; the planner builds on it): tp over the divisors of the
// heads that fit in a node, pp over the divisors of the layers, dp the rest;
// micro-batch sizes dividing the per-replica batch; ZeRO-1 with dp > 1;
// sequence parallelism with tp > 1; schedules 1f1b, interleaved (2 chunks)
// and zb-h1 with pp > 1; recompute none, selective and full. A layout is kept
// when layout_errors() has nothing against it and the dry-run memory fits the
// device with `headroom` to spare.
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
};

struct SweepOptions {
  double headroom = 0.1;     // keep 10% of the device memory free
  bool keep_user_keys = false;
  int64_t max_tp = 0;        // 0: devices per node
};

// `gpus` devices of `cl` (with_gpus applied by the caller). Rows sorted by
// step time; also returns how many layouts were rejected by rule and by memory.
struct SweepResult {
  std::vector<SweepRow> rows;
  int64_t rejected_rules = 0, rejected_memory = 0;
};
SweepResult sweep_layouts(const RunConfig& base, int64_t gpus, const cluster::Cluster& cl,
                          OpCosts& costs, const SweepOptions& opts = {},
                          const SimOptions& sim = {});

std::string describe_layout(const RunConfig& cfg);

}  // namespace adgt::sim
