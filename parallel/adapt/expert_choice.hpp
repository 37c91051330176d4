// The expert placement a re-placement asks for (docs/adaptation.md, "Expert
// replicas"): owners and replicas from the measured loads and rank
// capacities, as the parallel.expert_replace_interval controller and the
// benchmark (tests/tools/bench_expert_placement.cpp) decide it.
//
// Without spare slots (slots = E / ep) every expert once: plan_expert_slots.
// With them, the best of three plans by capacity-weighted imbalance:
//  - replicas on the current owners (applied in place: no state moves),
//  - replicas on the owners of the plan without replicas,
//  - the free plan of plan_expert_slots, with an owner chosen among each
//    expert's holders (choose_owners; skipped when none exists);
// the first wins unless another is better by more than 1% of step time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/adapt/expert_slots.hpp"

namespace adgt::adapt {

struct PlacementChoice {
  std::vector<int64_t> owner;  // parallel.expert_placement
  std::string replicas;        // parallel.expert_replicas ("" none)
  SlotPlan plan;               // its replicas and predicted imbalance
  double imbalance_now = 0;    // of the placement in use
};

// load: per expert; capacity: per ep rank (relative); now_owner and
// now_replicas: the placement in use; slots >= E / ep.
PlacementChoice choose_placement(const std::vector<double>& load, const std::vector<double>& capacity,
                                 const std::vector<int64_t>& now_owner, const std::string& now_replicas,
                                 int slots);

// Per rank, the (expert, share)s it serves under owners and a replicas text.
std::vector<std::vector<ExpertReplica>> served_by(const std::vector<int64_t>& owner,
                                                  const std::string& replicas, int ep);

// A plan's replicas as parallel.expert_replicas' text for owners `owner`:
// owners first, holders with a share under 1e-6 left out, shares rounded to
// 1e-6 (the owner's makes the sum 1).
std::string replicas_text(const SlotPlan& p, const std::vector<int64_t>& owner);

}  // namespace adgt::adapt
