// From a run configuration to its pipeline schedule: the stage costs the
// simulator and the greedy generator plan with, the schedule itself, and the
// text `adgt-train --print-schedule` prints. No MPI: usable before launch.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "parallel/cost/stages.hpp"  // stage_layer_counts: the stages the plan schedules
#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/instruction.hpp"

namespace adgt {

// Per-stage times predicted from FLOPs (parallel/cost/stages.hpp: the layers of
// stage_layer_counts, stage_pass_flops): F = the stage's forward FLOPs, B and W
// the backward's input- and weight-gradient halves (each = F under flops.hpp's
// convention); comm 0. Units: GFLOP per micro-batch.
pp::StageCosts predicted_stage_costs(const RunConfig& cfg);

// The schedule of parallel.schedule for this configuration's pp, pipeline
// micro-batches and virtual stages; greedy plans with `costs` (default: the
// predicted ones) under a memory limit of pp micro-batches in flight (1F1B's
// peak). Validated (pp::validate) before it is returned.
pp::Schedule make_pipeline_schedule(const RunConfig& cfg, const pp::StageCosts* costs = nullptr);

// The schedule of the run's configuration with the data-parallel gradient
// reduction placed in it (pp::with_grad_reductions).
pp::Schedule engine_schedule(const RunConfig& cfg, const pp::StageCosts* costs = nullptr);

// The per-rank timeline (simulated with the predicted costs), the stage
// layout and the predicted bubble: `adgt-train --print-schedule`.
std::string describe_pipeline_schedule(const RunConfig& cfg);

}  // namespace adgt
