// parallel.expert_replace_interval (docs/adaptation.md, "Expert placement at
// run time"): the experts re-placed over the ep ranks while training.
//
// After every step each rank reports its MoE layers' expert loads (tokens
// routed to each expert, summed over the world) and its own experts' rows
// and compute time (thread CPU time x the emulated slowdown on host
// backends; unmeasured elsewhere, when every rank counts as equally fast).
// World rank 0 keeps moving averages of the loads and of each ep rank's
// throughput (rows per second; the slowest holder of an ep index over the tp,
// pp and edp replicas). Every `interval` steps it decides with
// choose_placement (expert_choice.hpp): without spare slots
// (parallel.expert_slots) every expert once, capacity-weighted longest
// processing time first; with them, replicas of the hot experts too. It asks
// for the result when the slowest rank's expected expert time drops by at
// least 5%: parallel.expert_placement when owners move (an in-memory layout
// switch: the experts' weights and AdamW moments move between ranks) and
// parallel.expert_replicas (set in place when it is the only change).
// Placement moves work between ranks only: without replicas each expert
// computes the same rows in the same order wherever it is, so the losses are
// the static run's bit for bit; replicas split an expert's rows (the
// gradient is summed in another order: within rounding).
#pragma once
#include <memory>

#include "core/config.hpp"
#include "parallel/controller.hpp"

namespace adgt::adapt {

std::unique_ptr<Controller> make_expert_placement_controller(const RunConfig& cfg);

}  // namespace adgt::adapt
