// parallel.expert_replace_interval (docs/adaptation.md, "Expert placement at
// run time"): the experts re-placed over the ep ranks while training.
//
// After every step each rank records, for itself and without communication
// (Controller::record), its MoE layers' expert loads, its own experts' rows
// and compute time (thread CPU time x the emulated slowdown on host
// backends), and the CPU time of the layers' dense part; a decision gathers
// the window since the last one (at most 10 steps) in one all-reduce and
// one all-gather. World rank 0 sums the window's loads and takes each ep
// index's speed (its slowest holder's over the tp, pp and edp replicas)
// from the dense compute against its stage's median, pooled over the last
// 50 steps (it does not depend on where the experts are). Every `interval`
// steps it decides with choose_placement (expert_choice.hpp): without spare
// slots (parallel.expert_slots) every expert once, capacity-weighted longest
// processing time first; with them, replicas of the hot experts too. With
// spare slots it also re-plans the replicas alone every 10 steps between
// placements (on the current owners, applied in place), and moves owners
// early when that is 15% better than the replicas alone can do. It asks
// for the result when the slowest rank's expected expert time drops by at
// least 5% (2% for replicas alone): parallel.expert_placement when owners
// move (in memory: the experts' weights and AdamW moments move between
// ranks) and parallel.expert_replicas (set in place when it is the only
// change). parallel.expert_replace_dry_run logs the decisions and applies
// none.
// Placement moves work between ranks only: without replicas each expert
// computes the same rows in the same order wherever it is, so the losses are
// the static run's bit for bit; replicas split an expert's rows (the
// gradient is summed in another order: within rounding).
#pragma once
#include <memory>

#include "core/config.hpp"
#include "parallel/control/hook.hpp"

namespace adgt::adapt {

std::unique_ptr<Controller> make_expert_placement_controller(const RunConfig& cfg);

}  // namespace adgt::adapt
