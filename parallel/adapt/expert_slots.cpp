// Expert placement with replication (expert_slots.hpp).
#include "parallel/adapt/expert_slots.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace adgt::adapt {
namespace {

constexpr double kStay = 0.02;  // plan_expert_slots' slack for keeping an expert where it is

double imbalance_of(const std::vector<double>& finish) {
  const double mean = std::accumulate(finish.begin(), finish.end(), 0.0) / double(finish.size());
  return mean > 0 ? *std::max_element(finish.begin(), finish.end()) / mean - 1 : 0;
}

// The loads as shares of their sum (even when all are 0), after the inputs
// are checked; `what` begins the messages.
std::vector<double> shares_of(const std::vector<double>& load, const std::vector<double>& capacity,
                              const std::string& what) {
  if (load.empty() || capacity.empty()) throw std::invalid_argument(what + ": no experts or no ranks");
  for (double c : capacity)
    if (!(c > 0)) throw std::invalid_argument(what + ": every rank's capacity must be > 0");
  double total = 0;
  for (double l : load) {
    if (!(l >= 0)) throw std::invalid_argument(what + ": a load is negative or NaN");
    total += l;
  }
  std::vector<double> share(load.size(), 1.0 / double(load.size()));
  if (total > 0)
    for (size_t e = 0; e < load.size(); ++e) share[e] = load[e] / total;
  return share;
}

// Moves tokens of replicated experts from the slowest-finishing replica's
// rank to a faster one holding the same expert, as far as evens the two,
// until no move helps; then p.finish and p.imbalance. load: normalised;
// p.served must match p.ranks.
void water_fill(SlotPlan& p, const std::vector<double>& load, const std::vector<double>& capacity) {
  const int E = int(load.size()), R = int(capacity.size());
  auto finish = [&](int r) { return p.served[size_t(r)] / capacity[size_t(r)]; };
  for (int iter = 0; iter < 64 * E; ++iter) {
    bool moved = false;
    // Ranks by finishing time, slowest first.
    std::vector<int> order(static_cast<size_t>(R));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return finish(a) > finish(b); });
    for (int from : order) {
      double gain_best = 1e-12;
      int to = -1;
      size_t from_i = 0, to_i = 0;
      double amount = 0;
      for (size_t i = 0; i < p.ranks[size_t(from)].size(); ++i) {
        const ExpertReplica& x = p.ranks[size_t(from)][i];
        if (p.replicas[size_t(x.expert)] < 2 || x.share <= 0) continue;
        for (int r = 0; r < R; ++r) {
          if (r == from) continue;
          for (size_t j = 0; j < p.ranks[size_t(r)].size(); ++j) {
            if (p.ranks[size_t(r)][j].expert != x.expert) continue;
            const double gap = finish(from) - finish(r);
            if (gap <= 0) continue;
            // Moving m of the load: finish(from) -= m/c_from, finish(r) += m/c_r.
            double m = gap / (1 / capacity[size_t(from)] + 1 / capacity[size_t(r)]);
            m = std::min(m, x.share * load[size_t(x.expert)]);
            const double gain = m / capacity[size_t(from)];
            if (gain > gain_best) gain_best = gain, to = r, from_i = i, to_i = j, amount = m;
          }
        }
      }
      if (to < 0) continue;
      ExpertReplica& a = p.ranks[size_t(from)][from_i];
      ExpertReplica& b = p.ranks[size_t(to)][to_i];
      const double ds = amount / load[size_t(a.expert)];
      a.share = std::max(0.0, a.share - ds);
      b.share += ds;
      p.served[size_t(from)] -= amount;
      p.served[size_t(to)] += amount;
      moved = true;
      break;  // re-sort after each move
    }
    if (!moved) break;
  }
  p.finish.resize(size_t(R));
  for (int r = 0; r < R; ++r) p.finish[size_t(r)] = finish(r);
  p.imbalance = imbalance_of(p.finish);
}

// The greedy assignment's dead end: every free slot is on a rank that
// already holds `expert`. Moves another replica from a rank q without
// `expert` to a rank r with a free slot (one that does not hold the moved
// replica's expert), so q's slot takes `expert`; returns q. The rank whose
// finishing time grows least wins (ties: the lower indices).
int make_room(SlotPlan& p, const std::vector<double>& load, const std::vector<double>& capacity, int expert,
              double rep_load, int slots) {
  const int R = int(p.ranks.size());
  const auto holds = [&](int r, int e) {
    for (const ExpertReplica& x : p.ranks[size_t(r)])
      if (x.expert == e) return true;
    return false;
  };
  int best_r = -1, best_q = -1;
  size_t best_i = 0;
  double best_t = 0;
  for (int r = 0; r < R; ++r) {
    if (int(p.ranks[size_t(r)].size()) >= slots) continue;
    for (int q = 0; q < R; ++q) {
      if (q == r || holds(q, expert)) continue;
      for (size_t i = 0; i < p.ranks[size_t(q)].size(); ++i) {
        const ExpertReplica& x = p.ranks[size_t(q)][i];
        if (holds(r, x.expert)) continue;
        const double moved = x.share * load[size_t(x.expert)];
        const double t = std::max((p.served[size_t(q)] - moved + rep_load) / capacity[size_t(q)],
                                  (p.served[size_t(r)] + moved) / capacity[size_t(r)]);
        if (best_r < 0 || t < best_t) best_r = r, best_q = q, best_i = i, best_t = t;
      }
    }
  }
  if (best_r < 0) throw std::logic_error("expert slots: no free slot for a replica");
  const ExpertReplica x = p.ranks[size_t(best_q)][best_i];
  const double moved = x.share * load[size_t(x.expert)];
  p.ranks[size_t(best_q)].erase(p.ranks[size_t(best_q)].begin() + std::ptrdiff_t(best_i));
  p.served[size_t(best_q)] -= moved;
  p.ranks[size_t(best_r)].push_back(x);
  p.served[size_t(best_r)] += moved;
  return best_q;
}

}  // namespace

SlotPlan plan_expert_slots(const std::vector<double>& load_in, const std::vector<double>& capacity,
                           int slots, const std::vector<int64_t>* stay) {
  const int E = int(load_in.size()), R = int(capacity.size());
  const std::vector<double> load = shares_of(load_in, capacity, "expert slots");
  if (int64_t(slots) * R < E)
    throw std::invalid_argument("expert slots: " + std::to_string(R) + " ranks x " +
                                std::to_string(slots) + " slots cannot hold " + std::to_string(E) +
                                " experts; use parallel.expert_slots >= " +
                                std::to_string((E + R - 1) / R));

  // 1. Replica counts (at most one replica of an expert per rank).
  SlotPlan p;
  p.replicas.assign(size_t(E), 1);
  for (int64_t spare = int64_t(slots) * R - E; spare > 0; --spare) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (p.replicas[size_t(e)] < R &&
          (best < 0 || load[size_t(e)] / p.replicas[size_t(e)] >
                           load[size_t(best)] / p.replicas[size_t(best)]))
        best = e;
    if (best < 0) break;
    ++p.replicas[size_t(best)];
  }
  // 2. Assignment, heaviest replica first.
  struct Rep {
    int expert;
    double load;
  };
  std::vector<Rep> reps;
  for (int e = 0; e < E; ++e)
    for (int k = 0; k < p.replicas[size_t(e)]; ++k)
      reps.push_back({e, load[size_t(e)] / p.replicas[size_t(e)]});
  std::stable_sort(reps.begin(), reps.end(), [](const Rep& a, const Rep& b) { return a.load > b.load; });
  p.ranks.assign(size_t(R), {});
  p.served.assign(size_t(R), 0);
  for (const Rep& rp : reps) {
    int best = -1;
    double best_t = 0, stay_t = -1;
    const int home = stay && size_t(rp.expert) < stay->size() ? int((*stay)[size_t(rp.expert)]) : -1;
    for (int r = 0; r < R; ++r) {
      if (int(p.ranks[size_t(r)].size()) >= slots) continue;
      bool holds = false;
      for (const auto& x : p.ranks[size_t(r)]) holds |= x.expert == rp.expert;
      if (holds) continue;
      const double t = (p.served[size_t(r)] + rp.load) / capacity[size_t(r)];
      if (best < 0 || t < best_t) best = r, best_t = t;
      if (r == home) stay_t = t;
    }
    // The expert's current rank, when it finishes within kStay of the best.
    if (stay_t >= 0 && stay_t <= best_t * (1 + kStay)) best = home;
    if (best < 0) best = make_room(p, load, capacity, rp.expert, rp.load, slots);
    p.ranks[size_t(best)].push_back({rp.expert, 1.0 / p.replicas[size_t(rp.expert)]});
    p.served[size_t(best)] += rp.load;
  }
  // 3. Water-filling of the replicated experts' shares.
  water_fill(p, load, capacity);
  return p;
}

SlotPlan plan_expert_replicas(const std::vector<double>& load_in, const std::vector<double>& capacity,
                              const std::vector<int64_t>& owner, int slots) {
  const int E = int(load_in.size()), R = int(capacity.size());
  if (int(owner.size()) != E) throw std::invalid_argument("expert replicas: one owner per expert");
  const std::vector<double> load = shares_of(load_in, capacity, "expert replicas");
  SlotPlan p;
  p.ranks.assign(size_t(R), {});
  p.served.assign(size_t(R), 0);
  p.replicas.assign(size_t(E), 1);
  for (int e = 0; e < E; ++e) {
    const int r = int(owner[size_t(e)]);
    if (r < 0 || r >= R) throw std::invalid_argument("expert replicas: an owner outside the ranks");
    p.ranks[size_t(r)].push_back({e, 1.0});
    p.served[size_t(r)] += load[size_t(e)];
  }
  for (int r = 0; r < R; ++r)
    if (int(p.ranks[size_t(r)].size()) > slots)
      throw std::invalid_argument("expert replicas: a rank owns more experts than its slots");
  // Spare slots, one at a time: the expert with the most load per replica
  // that some rank with a free slot does not hold yet, onto the rank among
  // those that finishes first (share 0 until the water-filling).
  auto holds = [&](int r, int e) {
    for (const ExpertReplica& x : p.ranks[size_t(r)])
      if (x.expert == e) return true;
    return false;
  };
  for (;;) {
    int best_e = -1, best_r = -1;
    for (int e = 0; e < E; ++e) {
      if (best_e >= 0 && load[size_t(e)] / p.replicas[size_t(e)] <=
                             load[size_t(best_e)] / p.replicas[size_t(best_e)])
        continue;
      int r_e = -1;
      for (int r = 0; r < R; ++r)
        if (int(p.ranks[size_t(r)].size()) < slots && !holds(r, e) &&
            (r_e < 0 || p.served[size_t(r)] / capacity[size_t(r)] <
                            p.served[size_t(r_e)] / capacity[size_t(r_e)]))
          r_e = r;
      if (r_e >= 0) best_e = e, best_r = r_e;
    }
    if (best_e < 0) break;
    p.ranks[size_t(best_r)].push_back({best_e, 0.0});
    ++p.replicas[size_t(best_e)];
  }
  water_fill(p, load, capacity);
  return p;
}

SlotPlan refill_shares(const std::vector<double>& load_in, const std::vector<double>& capacity,
                       const std::vector<std::vector<ExpertReplica>>& ranks) {
  const int E = int(load_in.size()), R = int(capacity.size());
  const std::vector<double> load = shares_of(load_in, capacity, "expert shares");
  if (int(ranks.size()) != R)
    throw std::invalid_argument("expert shares: " + std::to_string(ranks.size()) + " ranks' holders for " +
                                std::to_string(R) + " capacities");
  SlotPlan p;
  p.ranks = ranks;
  p.replicas.assign(size_t(E), 0);
  p.served.assign(size_t(R), 0);
  std::vector<double> total(size_t(E), 0.0);
  for (const auto& r : ranks)
    for (const ExpertReplica& x : r) {
      if (x.expert < 0 || x.expert >= E)
        throw std::invalid_argument("expert shares: expert " + std::to_string(x.expert) + " out of range");
      ++p.replicas[size_t(x.expert)];
      total[size_t(x.expert)] += x.share;
    }
  for (int e = 0; e < E; ++e)
    if (!(total[size_t(e)] > 0))
      throw std::invalid_argument("expert shares: expert " + std::to_string(e) + " is not served");
  for (size_t r = 0; r < p.ranks.size(); ++r)
    for (ExpertReplica& x : p.ranks[r]) {
      x.share /= total[size_t(x.expert)];  // shares sum to 1 per expert
      p.served[r] += x.share * load[size_t(x.expert)];
    }
  water_fill(p, load, capacity);
  return p;
}

double placement_imbalance(const std::vector<double>& load, const std::vector<double>& capacity,
                           const std::vector<int64_t>& owner) {
  if (owner.size() != load.size())
    throw std::invalid_argument("placement_imbalance: one owner per expert");
  std::vector<double> served(capacity.size(), 0);
  for (size_t e = 0; e < load.size(); ++e) served.at(size_t(owner[e])) += load[e];
  for (size_t r = 0; r < served.size(); ++r) served[r] /= capacity[r];
  return imbalance_of(served);
}

double replicas_imbalance(const std::vector<double>& load, const std::vector<double>& capacity,
                          const std::vector<std::vector<ExpertReplica>>& ranks) {
  if (ranks.size() != capacity.size())
    throw std::invalid_argument("replicas_imbalance: one replica list per rank");
  std::vector<double> served(capacity.size(), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const ExpertReplica& x : ranks[r]) served[r] += load.at(size_t(x.expert)) * x.share;
    served[r] /= capacity[r];
  }
  return imbalance_of(served);
}

bool choose_owners(const SlotPlan& p, const std::vector<int64_t>& now, int per_rank,
                   std::vector<int64_t>& owner) {
  const int R = int(p.ranks.size()), E = int(now.size());
  std::vector<std::vector<int>> cand(static_cast<size_t>(E));  // ranks holding each expert
  for (int r = 0; r < R; ++r)
    for (const ExpertReplica& x : p.ranks[size_t(r)]) cand.at(size_t(x.expert)).push_back(r);
  owner.assign(size_t(E), -1);
  std::vector<int> left(static_cast<size_t>(R), per_rank);
  for (int e = 0; e < E; ++e) {  // the current owner where it still holds the expert
    const auto& c = cand[size_t(e)];
    const int o = int(now[size_t(e)]);
    if (std::find(c.begin(), c.end(), o) != c.end() && left[size_t(o)] > 0)
      owner[size_t(e)] = o, --left[size_t(o)];
  }
  // Kuhn's augmenting paths over rank capacities for the rest.
  std::vector<char> seen;
  std::function<bool(int)> place = [&](int e) {
    for (int r : cand[size_t(e)]) {
      if (seen[size_t(r)]) continue;
      seen[size_t(r)] = 1;
      if (left[size_t(r)] > 0) {
        owner[size_t(e)] = r, --left[size_t(r)];
        return true;
      }
      for (int f = 0; f < E; ++f)
        if (owner[size_t(f)] == r && f != e) {
          owner[size_t(f)] = -1;
          ++left[size_t(r)];
          if (place(f)) {
            --left[size_t(r)];
            owner[size_t(e)] = r;
            return true;
          }
          owner[size_t(f)] = r;
          --left[size_t(r)];
        }
    }
    return false;
  };
  for (int e = 0; e < E; ++e) {
    if (owner[size_t(e)] >= 0) continue;
    seen.assign(size_t(R), 0);
    if (!place(e)) return false;
  }
  return true;
}

std::string describe(const SlotPlan& p) {
  std::ostringstream os;
  char b[64];
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    std::snprintf(b, sizeof b, "rank %zu (finish %.4f):", r, p.finish[r]);
    os << b;
    for (const auto& x : p.ranks[r]) {
      std::snprintf(b, sizeof b, " e%d", x.expert);
      os << b;
      if (x.share < 1) {
        std::snprintf(b, sizeof b, "(%.2f)", x.share);
        os << b;
      }
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace adgt::adapt
