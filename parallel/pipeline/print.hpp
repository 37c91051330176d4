// The text Gantt chart of a simulated schedule, for `adgt-schedule --print`
// and `adgt-train --print-schedule`.
//
//   1f1b: pp=2, m=2, v=1; one character = 0.5 time units
//   rank 0 |F0F1....B0--..B1--|
//   rank 1 |..F0B0--F1B1--....|
//
// Each compute instruction is drawn from its simulated start to its end: its
// label (F forward, B backward or its input part, W weight gradient, then
// the micro-batch), '-' for the rest of its time, '.' where the rank is idle.
// With v = 2, chunk 1 is lower case (f3, b3, w3); with v > 2 the chunk
// follows a dot (F3.2). The last lines give the makespan and the predicted
// bubble in both conventions (timeline.hpp).
#pragma once

#include <string>

#include "parallel/pipeline/instruction.hpp"
#include "parallel/pipeline/timeline.hpp"

namespace adgt::pp {

struct TimelineOptions {
  double time_per_char = 0;  // 0: the shortest compute instruction gets just its label's width
};

// The label of a compute instruction: "F3", "b0" (v = 2, chunk 1), "W12", "F3.2" (v > 2).
std::string label(const Instr& in, int virtual_stages);

std::string timeline(const Schedule& s, const Timeline& sim, const TimelineOptions& opt = {});

}  // namespace adgt::pp
