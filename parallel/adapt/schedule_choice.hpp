// The schedule re-plan of run-time adaptation (docs/adaptation.md):
// from measured per-stage F, B and W times, every generator that fits the
// pipeline (1F1B, ZB-H1 and the greedy list scheduler with its variants;
// with several chunks per rank interleaved and greedy over the chunks, whose
// candidates include the interleaved order with split backwards) is simulated with
// those times, and the shortest makespan within the memory limit wins (with
// the measured spread of single instructions, StageCosts::jitter, the
// shortest expected makespan: pp::expected_makespan). The
// limit is twofold: at most pp micro-batches in flight to the input backward
// (1F1B's), and no rank holding more activations to its last backward
// (weight gradients included) than `held_limit`, by default the most a rank
// holds under `current` (pp::max_held_activations; the schedule the run was
// planned with), and in the trainer every rank's estimated memory within the
// device's memory (memory_fits, memory_budget): a split backward's buffers
// (what --dry-run prints as what a re-plan may hold) are taken only where
// they fit.
// Pure: the same inputs give the same schedule on every rank.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/instruction.hpp"

namespace adgt::adapt {

struct ScheduleChoice {
  pp::Schedule schedule;          // with the gradient reductions in place, validated
  std::string name;               // "greedy (zb-h1)", "1f1b", ...
  double predicted_s = 0;         // its simulated makespan with the measured times
  double current_predicted_s = 0; // the schedule in use, simulated with the same times
  std::vector<std::pair<std::string, double>> candidates;  // every one considered
  std::vector<std::string> over_memory;  // candidates `fits` refused (not in candidates)
};

// `current`: the schedule in use (its pp, micro-batches and chunks are
// kept). Candidates that fail to generate or validate, hold more than
// `held_limit` (< 0: current's most), or that `fits` (when given) refuses,
// are skipped. The trainer's `fits` is memory_fits().
ScheduleChoice choose_schedule(const pp::Schedule& current, const pp::StageCosts& measured,
                               std::int64_t held_limit = -1,
                               const std::function<bool(const pp::Schedule&)>& fits = {});

// Whether a schedule's memory fits `budget_bytes` (< 0: no limit): the
// --dry-run estimate (parallel/cost/memory.hpp) of `cfg` run with
// `candidate` (its generator's buffers, the activations it holds on each
// rank: pp::held_activations), its largest rank's total. The trainer's
// budget is memory_budget().
bool memory_fits(const RunConfig& cfg, const pp::Schedule& candidate, double budget_bytes);

// The re-plan's memory budget: 90% of the device's memory (`capacity_bytes`,
// Backend::memory_capacity_bytes; the planner's headroom), or what `cfg`
// with the `planned` schedule is estimated to hold when that is more (the
// plan is never refused); < 0 when the capacity is unknown (host backends:
// no device limit).
double memory_budget(const RunConfig& cfg, const pp::Schedule& planned, std::int64_t capacity_bytes);

}  // namespace adgt::adapt
