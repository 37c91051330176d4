// The expert placement a re-placement asks for (docs/adaptation.md, "Expert
// replicas"): owners and replicas from the measured loads and rank
// capacities, as the parallel.expert_replace_interval controller and the
// benchmark (tests/tools/bench_expert_placement.cpp) decide it.
//
// Without spare slots (slots = E / ep) every expert once: plan_expert_slots,
// keeping experts on their current ranks where that costs under 2%.
// With them, the best of three plans by capacity-weighted imbalance:
//  - replicas on the current owners (applied in place: no state moves),
//  - replicas on the owners of the plan without replicas,
//  - the free plan of plan_expert_slots, with an owner chosen among each
//    expert's holders (choose_owners; skipped when none exists);
// the first wins unless another is better by more than 1% of step time.
// With costs, each plan's predicted time is expert_s x (1 + its imbalance) /
// (1 + the current one's) plus per_replica_s x the most replicas on a rank,
// and the plan without replicas is a candidate too: replicas must pay for
// their traffic.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/adapt/expert_slots.hpp"

namespace adgt::adapt {

// What replicas cost per step, and the expert time they can save, both
// measured (zeros: replicas are free, and the imbalance alone decides).
struct ReplicaCosts {
  double expert_s = 0;     // the slowest rank's expert time per step, in the placement in use
  double per_replica_s = 0;  // one replica's weight sync plus gradient return per step
};

struct PlacementChoice {
  std::vector<int64_t> owner;  // parallel.expert_placement
  std::string replicas;        // parallel.expert_replicas ("" none)
  SlotPlan plan;               // its replicas and predicted imbalance
  double imbalance_now = 0;    // of the placement in use
  double predicted_s = 0;      // with costs: its predicted expert time plus replica traffic
  double predicted_now_s = 0;  // the same for the placement in use
};

// load: per expert; capacity: per ep rank (relative); now_owner and
// now_replicas: the placement in use; slots >= E / ep. keep_owners: only
// the plans that leave every expert with its owner (replicas on the current
// owners, or, with costs, none): a change of replicas alone, applied in
// place with no optimizer state moved (the controller's between-placement
// re-plans).
PlacementChoice choose_placement(const std::vector<double>& load, const std::vector<double>& capacity,
                                 const std::vector<int64_t>& now_owner, const std::string& now_replicas,
                                 int slots, const ReplicaCosts& costs = {}, bool keep_owners = false);

// Per rank, the (expert, share)s it serves under owners and a replicas text.
std::vector<std::vector<ExpertReplica>> served_by(const std::vector<int64_t>& owner,
                                                  const std::string& replicas, int ep);

// A plan's replicas as parallel.expert_replicas' text for owners `owner`:
// owners first, holders with a share under 1e-6 left out, shares rounded to
// 1e-6 (the owner's makes the sum 1).
std::string replicas_text(const SlotPlan& p, const std::vector<int64_t>& owner);

}  // namespace adgt::adapt
