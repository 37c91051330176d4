// The timeline of a schedule: per-rank start and end of every compute
// instruction from per-stage times (not the simulator: that is parallel/sim/).
//
// Semantics (the validator's, validate.hpp): every rank starts at time 0 and
// runs its list in order. A compute instruction starts when the previous one
// on the rank has ended and lasts f[s], b[s], w[s] or b[s] + w[s] (fused
// Backward) of its stage s. A Send takes no time on the sender; its message
// arrives comm after it is issued (right after the producing compute). A Recv
// blocks the rank until the message has arrived. WaitSends takes no time.
// Dependencies across ranks are exactly the Send/Recv pairs, so the timeline
// is the earliest one the lists allow.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/instruction.hpp"

namespace adgt::pp {

struct Interval {
  int index;    // position in the rank's instruction list
  Instr instr;  // a compute instruction
  double start;
  double end;
};

struct Timeline {
  std::vector<std::vector<Interval>> timeline;  // [rank]: compute instructions, in list order
  double makespan = 0;                          // the last compute end over all ranks
  std::vector<double> busy;                     // [rank]: sum of compute durations
  std::vector<double> idle;                     // [rank]: makespan - busy
  // The two usual bubble conventions (docs/pipeline-schedules.md):
  double bubble_fraction = 0;  // sum idle / (pp * makespan): share of all rank-time lost;
                               // 1F1B, equal times: (p-1)/(m+p-1)
  double bubble_ratio = 0;     // sum idle / sum busy: bubble relative to the ideal compute
                               // time (Megatron, ZB paper); 1F1B, equal times: (p-1)/m
  std::vector<int> max_outstanding_sends;  // [rank]: most messages sent and not yet received
                                           // at one time (buffers an executor must allow)
};

// Throws ScheduleError when costs do not fit (check_costs) or the lists
// cannot complete (run validate() for the reason).
Timeline time_schedule(const Schedule& s, const StageCosts& costs);

// The same with each compute instruction's duration multiplied by
// scale(rank, index) (> 0; index: its position in the rank's list): one
// draw of the instructions' jitter (expected_makespan).
Timeline time_schedule(const Schedule& s, const StageCosts& costs,
                   const std::function<double(int rank, int index)>& scale);

// The makespan the schedule can expect when single instructions take
// longer or shorter than their stage's median (StageCosts::jitter): the mean
// over costs.jitter_samples draws, each instruction's time its median times
// a ratio drawn from the measured ratios (a seeded generator: the same
// inputs give the same figure). Without jitter (or samples < 1),
// time_schedule()'s makespan.
double expected_makespan(const Schedule& s, const StageCosts& costs, std::uint64_t seed = 0x5eed);

}  // namespace adgt::pp
