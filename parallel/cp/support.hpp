// What context parallelism does not run yet (docs/context-parallel.md,
// "What remains"): the one list the trainer refuses before the launch, the
// engine checks, and the planner reads before it considers cp for a run.
#pragma once
#include <string>

#include "core/config.hpp"

namespace adgt {

// Why this run's context parallelism cannot train yet ("" when it can, or
// cp = 1): the combinations not wired, each naming the key and a fix.
std::string context_parallel_unsupported(const RunConfig& cfg);

}  // namespace adgt
