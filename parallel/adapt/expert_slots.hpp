// Heterogeneous-capacity expert placement with replication (HERMP,
// docs/adaptation.md): which experts each expert-parallel rank holds
// and what share of each expert's tokens each replica serves, so that every
// rank's expected MoE time — the tokens it serves over its measured
// throughput — is balanced.
//
//  1. Replicas: every expert once; the spare slots (ranks x slots - experts)
//     go one at a time to the expert with the most load per replica
//     (DeepSeek's EPLB rule).
//  2. Assignment: replicas in decreasing load, each to the rank whose
//     finishing time (served load / capacity) grows least among the ranks
//     with a free slot that do not hold that expert yet (longest processing
//     time first, capacity-weighted).
//  3. Shares: tokens of a replicated expert move from the replica on the
//     slowest-finishing rank to its replica on the fastest-finishing one,
//     as far as evens the two, until no move helps (water-filling).
//
// Pure and deterministic (ties break by the lower index): decided on one
// rank or on all, the table is the same.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adgt::adapt {

struct ExpertReplica {
  int expert = 0;
  double share = 1;  // of the expert's tokens this replica serves
};

struct SlotPlan {
  std::vector<std::vector<ExpertReplica>> ranks;  // per ep rank: its replicas (<= slots)
  std::vector<double> served;    // per rank: load served (fraction of all tokens)
  std::vector<double> finish;    // per rank: served / capacity
  // Capacity-weighted imbalance: max finish / mean finish - 1 (0: even).
  double imbalance = 0;
  std::vector<int> replicas;     // per expert: its replica count
};

// `load`: per expert, its tokens (any positive scale; normalised here).
// `capacity`: per ep rank, its measured throughput (relative). `slots`: per
// rank, at least ceil(experts / ranks). Throws std::invalid_argument naming
// the input that is wrong.
// `stay` (optional): each expert's current rank; a replica then stays on it
// when that finishes within 2% of the best rank's, so a re-placement moves
// fewer experts' state.
SlotPlan plan_expert_slots(const std::vector<double>& load, const std::vector<double>& capacity,
                           int slots, const std::vector<int64_t>* stay = nullptr);

// Replicas on fixed owners: every expert stays with owner[e] and the spare
// slots (slots - experts owned) take replicas of the experts with the most
// load per replica, each on the rank with a free slot that finishes first;
// then the shares are water-filled as in plan_expert_slots. Every expert's
// owner is among its holders by construction.
SlotPlan plan_expert_replicas(const std::vector<double>& load, const std::vector<double>& capacity,
                              const std::vector<int64_t>& owner, int slots);

// The same holders (per rank its (expert, share)s, every expert held at
// least once), their shares water-filled for `load` from where they are.
SlotPlan refill_shares(const std::vector<double>& load, const std::vector<double>& capacity,
                       const std::vector<std::vector<ExpertReplica>>& ranks);

// The imbalance of a plain placement: expert e wholly on owner[e].
double placement_imbalance(const std::vector<double>& load, const std::vector<double>& capacity,
                           const std::vector<int64_t>& owner);

// The imbalance of replicas as a plan holds them: per rank its (expert, share)s.
double replicas_imbalance(const std::vector<double>& load, const std::vector<double>& capacity,
                          const std::vector<std::vector<ExpertReplica>>& ranks);

// An owner for every expert among the ranks that hold it in `p`, exactly
// per_rank experts per rank (a bipartite matching; the experts' current
// owners `now` kept where they can be, so few optimizer states move).
// False when no such choice exists.
bool choose_owners(const SlotPlan& p, const std::vector<int64_t>& now, int per_rank,
                   std::vector<int64_t>& owner);

// "rank 0: e3 (0.52) e17 ...", one line per rank.
std::string describe(const SlotPlan& p);

}  // namespace adgt::adapt
