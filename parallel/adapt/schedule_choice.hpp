// The schedule re-plan of run-time adaptation (issue 16, docs/adaptation.md):
// from measured per-stage F, B and W times, every generator that fits the
// pipeline (1F1B, ZB-H1 and the greedy list scheduler with its variants;
// with several chunks per rank interleaved and greedy over the chunks, whose
// candidates include the interleaved order with split backwards) is simulated with
// those times, and the shortest makespan within the memory limit wins. The
// limit is twofold: at most pp micro-batches in flight to the input backward
// (1F1B's), and no rank holding more activations to its last backward
// (weight gradients included) than `held_limit`, by default the most a rank
// holds under `current` (pp::max_held_activations; the schedule the run was
// planned with, so the memory estimate of --dry-run stays valid). Pure: the
// same inputs give the same schedule on every rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/schedule/costs.hpp"
#include "parallel/schedule/instruction.hpp"

namespace adgt::adapt {

struct ScheduleChoice {
  pp::Schedule schedule;          // with the gradient reductions in place, validated
  std::string name;               // "greedy (zb-h1)", "1f1b", ...
  double predicted_s = 0;         // its simulated makespan with the measured times
  double current_predicted_s = 0; // the schedule in use, simulated with the same times
  std::vector<std::pair<std::string, double>> candidates;  // every one considered
};

// `current`: the schedule in use (its pp, micro-batches and chunks are
// kept). Candidates that fail to generate or validate, or hold more than
// `held_limit` (< 0: current's most), are skipped.
ScheduleChoice choose_schedule(const pp::Schedule& current, const pp::StageCosts& measured,
                               std::int64_t held_limit = -1);

}  // namespace adgt::adapt
