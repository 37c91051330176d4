// The simulator's line of `adgt-train --dry-run` (docs/simulator.md): the
// predicted step time of the run file on the given cluster (--cluster), or on
// this machine when the run would train on its CPU (the cpu-here preset with
// every rank sharing this host's cores, costed by a short profile of the CPU
// backend).
#pragma once
#include <string>

#include "core/config.hpp"

namespace adgt::sim {

// The text to print (lines ending in '\n'). Throws ConfigError for a bad
// cluster name or file.
std::string dry_run_prediction(const RunConfig& cfg, const std::string& cluster);

}  // namespace adgt::sim
