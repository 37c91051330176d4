// Expert placement with replication (expert_slots.hpp).
#include "parallel/adapt/expert_slots.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace adgt::adapt {
namespace {

double imbalance_of(const std::vector<double>& finish) {
  const double mean = std::accumulate(finish.begin(), finish.end(), 0.0) / double(finish.size());
  return mean > 0 ? *std::max_element(finish.begin(), finish.end()) / mean - 1 : 0;
}

}  // namespace

SlotPlan plan_expert_slots(const std::vector<double>& load_in, const std::vector<double>& capacity,
                           int slots) {
  const int E = int(load_in.size()), R = int(capacity.size());
  if (E == 0 || R == 0) throw std::invalid_argument("expert slots: no experts or no ranks");
  for (double c : capacity)
    if (!(c > 0)) throw std::invalid_argument("expert slots: every rank's capacity must be > 0");
  if (int64_t(slots) * R < E)
    throw std::invalid_argument("expert slots: " + std::to_string(R) + " ranks x " +
                                std::to_string(slots) + " slots cannot hold " + std::to_string(E) +
                                " experts; use parallel.expert_slots >= " +
                                std::to_string((E + R - 1) / R));
  double total = 0;
  for (double l : load_in) {
    if (!(l >= 0)) throw std::invalid_argument("expert slots: a load is negative or NaN");
    total += l;
  }
  std::vector<double> load(size_t(E), 1.0 / E);
  if (total > 0)
    for (int e = 0; e < E; ++e) load[size_t(e)] = load_in[size_t(e)] / total;

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
    double best_t = 0;
    for (int r = 0; r < R; ++r) {
      if (int(p.ranks[size_t(r)].size()) >= slots) continue;
      bool holds = false;
      for (const auto& x : p.ranks[size_t(r)]) holds |= x.expert == rp.expert;
      if (holds) continue;
      const double t = (p.served[size_t(r)] + rp.load) / capacity[size_t(r)];
      if (best < 0 || t < best_t) best = r, best_t = t;
    }
    if (best < 0) throw std::logic_error("expert slots: no free slot for a replica");
    p.ranks[size_t(best)].push_back({rp.expert, 1.0 / p.replicas[size_t(rp.expert)]});
    p.served[size_t(best)] += rp.load;
  }
  // 3. Water-filling of the replicated experts' shares.
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
