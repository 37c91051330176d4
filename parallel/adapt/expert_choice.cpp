// The placement a re-placement asks for (expert_choice.hpp).
#include "parallel/adapt/expert_choice.hpp"

#include <algorithm>
#include <cmath>

#include "core/model/moe_placement.hpp"
#include "core/model/moe_replicas.hpp"

namespace adgt::adapt {

std::vector<std::vector<ExpertReplica>> served_by(const std::vector<int64_t>& owner,
                                                  const std::string& replicas, int ep) {
  const int E = int(owner.size());
  const ExpertPlacement pl(E, ep, std::vector<int>(owner.begin(), owner.end()));
  const ExpertReplicas r = ExpertReplicas::parse(pl, replicas, 0);
  std::vector<std::vector<ExpertReplica>> ranks(static_cast<size_t>(ep));
  for (int e = 0; e < E; ++e) {
    if (!r.any()) {
      ranks[size_t(pl.owner(e))].push_back({e, 1.0});
      continue;
    }
    for (size_t j = 0; j < r.holders(e).size(); ++j)
      ranks[size_t(r.holders(e)[j])].push_back({e, r.shares(e)[j]});
  }
  return ranks;
}

std::string replicas_text(const SlotPlan& p, const std::vector<int64_t>& owner) {
  const int E = int(owner.size()), ep = int(p.ranks.size());
  std::vector<std::vector<int>> h(static_cast<size_t>(E));
  std::vector<std::vector<double>> s(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) h[size_t(e)] = {int(owner[size_t(e)])}, s[size_t(e)] = {0.0};
  for (size_t r = 0; r < p.ranks.size(); ++r)
    for (const ExpertReplica& x : p.ranks[r]) {
      if (int64_t(r) == owner[size_t(x.expert)]) {
        s[size_t(x.expert)][0] = x.share;
      } else if (x.share >= 1e-6) {
        h[size_t(x.expert)].push_back(int(r));
        s[size_t(x.expert)].push_back(x.share);
      }
    }
  for (int e = 0; e < E; ++e) {  // renormalised (dropped crumbs), rounded to 1e-6
    double sum = 0;
    for (double x : s[size_t(e)]) sum += x;
    double acc = 0;
    for (size_t j = 1; j < s[size_t(e)].size(); ++j) {
      s[size_t(e)][j] = std::round(s[size_t(e)][j] / sum * 1e6) / 1e6;
      acc += s[size_t(e)][j];
    }
    s[size_t(e)][0] = std::max(0.0, 1.0 - acc);
  }
  const ExpertPlacement pl(E, ep, std::vector<int>(owner.begin(), owner.end()));
  return ExpertReplicas(pl, h, s, 0).describe();
}

PlacementChoice choose_placement(const std::vector<double>& load, const std::vector<double>& cap,
                                 const std::vector<int64_t>& now, const std::string& now_replicas,
                                 int slots, const ReplicaCosts& costs, bool keep_owners) {
  const int E = int(load.size()), ep = int(cap.size()), per = E / ep;
  const auto most_replicas = [&](const SlotPlan& q, const std::vector<int64_t>& o) {
    size_t m = 0;
    for (size_t r = 0; r < q.ranks.size(); ++r) {
      size_t n = 0;
      for (const ExpertReplica& x : q.ranks[r]) n += o[size_t(x.expert)] != int64_t(r) && x.share >= 1e-6;
      m = std::max(m, n);
    }
    return double(m);
  };
  PlacementChoice c;
  const auto now_ranks = served_by(now, now_replicas, ep);
  c.imbalance_now = replicas_imbalance(load, cap, now_ranks);
  size_t now_shadows = 0;
  for (size_t r = 0; r < now_ranks.size(); ++r) {
    size_t n = 0;
    for (const ExpertReplica& x : now_ranks[r]) n += now[size_t(x.expert)] != int64_t(r);
    now_shadows = std::max(now_shadows, n);
  }
  const bool costed = costs.expert_s > 0;
  // Predicted expert time plus replica traffic of a plan (costed), or its imbalance.
  const auto score = [&](const SlotPlan& q, const std::vector<int64_t>& o) {
    if (!costed) return 1 + q.imbalance;
    return costs.expert_s * (1 + q.imbalance) / (1 + c.imbalance_now) +
           costs.per_replica_s * most_replicas(q, o);
  };
  c.predicted_now_s = costed ? costs.expert_s + costs.per_replica_s * double(now_shadows) : 0;
  if (keep_owners) {
    SlotPlan bare;  // the owners alone, no replicas
    bare.ranks = served_by(now, "", ep);
    bare.imbalance = replicas_imbalance(load, cap, bare.ranks);
    c.owner = now;
    // The replicas in use with their shares re-filled (no holder changes),
    // unless fresh replicas on the same owners, or (costed) none, are
    // better by more than 1%.
    c.plan = refill_shares(load, cap, now_ranks);
    const auto consider = [&](const SlotPlan& q) {
      if (score(q, now) * 1.01 < score(c.plan, now)) c.plan = q;
    };
    if (slots > per) consider(plan_expert_replicas(load, cap, now, slots));
    if (costed) consider(bare);
    c.predicted_s = costed ? score(c.plan, c.owner) : 0;
    c.replicas = replicas_text(c.plan, c.owner);
    return c;
  }
  // Without replicas: the plan that keeps experts where they are, unless it
  // is more than 2% worse than the plan that ignores where they are.
  SlotPlan single = plan_expert_slots(load, cap, per, &now);
  {
    const SlotPlan fresh = plan_expert_slots(load, cap, per);
    if ((1 + single.imbalance) > (1 + fresh.imbalance) * 1.02) single = fresh;
  }
  std::vector<int64_t> single_owner(size_t(E), 0);
  for (size_t r = 0; r < single.ranks.size(); ++r)
    for (const ExpertReplica& x : single.ranks[r]) single_owner[size_t(x.expert)] = int64_t(r);
  c.plan = single;
  c.owner = single_owner;
  if (slots > per) {
    c.plan = plan_expert_replicas(load, cap, now, slots);
    c.owner = now;
    auto consider = [&](const SlotPlan& q, const std::vector<int64_t>& o) {
      if (score(q, o) * 1.01 < score(c.plan, c.owner)) c.plan = q, c.owner = o;
    };
    consider(plan_expert_replicas(load, cap, single_owner, slots), single_owner);
    const SlotPlan free = plan_expert_slots(load, cap, slots);
    std::vector<int64_t> o;
    if (choose_owners(free, now, per, o)) consider(free, o);
    if (costed) consider(single, single_owner);  // replicas must pay for their traffic
  }
  c.predicted_s = costed ? score(c.plan, c.owner) : 0;
  c.replicas = replicas_text(c.plan, c.owner);
  return c;
}

}  // namespace adgt::adapt
