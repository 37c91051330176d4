// A schedule's per-rank instruction lists as JSON, as a controller
// broadcasts a new schedule, and back (validated).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "parallel/pipeline/instruction.hpp"

namespace adgt {

// A schedule's per-rank instruction lists as JSON ([[op, microbatch, chunk,
// peer], ...] per rank: what a controller broadcasts), and back: the lists
// with `like`'s pp, micro-batches and chunks, validated (throws
// ScheduleError naming the broken rule).
nlohmann::json schedule_ranks_json(const pp::Schedule& s);
pp::Schedule schedule_from_json(const pp::Schedule& like, const std::string& name,
                                const std::string& detail, const nlohmann::json& ranks);

}  // namespace adgt
