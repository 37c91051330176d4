// The schedule re-plan of run-time adaptation (issue 16, docs/adaptation.md):
// from measured per-stage F, B and W times, every generator that fits the
// pipeline (1F1B, ZB-H1 and the greedy list scheduler with its variants;
// interleaved when there are several chunks per rank) is simulated with
// those times, and the shortest makespan within the memory limit (the
// micro-batches in flight that 1F1B holds: the plan's memory estimate stays
// valid) wins. Pure: the same inputs give the same schedule on every rank.
#pragma once
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
// kept). Candidates that fail to generate or validate are skipped.
ScheduleChoice choose_schedule(const pp::Schedule& current, const pp::StageCosts& measured);

}  // namespace adgt::adapt
