#include "parallel/dp/zero_shards.hpp"

#include <algorithm>

#include "kernels/check.hpp"

namespace adgt {

int ZeroShards::unit_of(int64_t at) const {
  auto it = std::upper_bound(units.begin(), units.end(), at,
                             [](int64_t a, const ZeroUnit& u) { return a < u.begin; });
  if (it == units.begin()) return -1;
  --it;
  return at < it->end ? int(it - units.begin()) : -1;
}

ZeroShards plan_zero_shards(const std::vector<GradUnit>& grad_units,
                            const std::vector<ParamSpec>& table, int ranks, int rank,
                            int expert_ranks, int expert_rank) {
  ADGT_CHECK(ranks >= 1 && rank >= 0 && rank < ranks,
             "ZeRO shards: rank " << rank << " of " << ranks);
  ADGT_CHECK(expert_ranks == 0 || (expert_rank >= 0 && expert_rank < expert_ranks),
             "ZeRO shards: expert rank " << expert_rank << " of " << expert_ranks);
  ZeroShards z;
  z.ranks = ranks;
  z.rank = rank;
  std::vector<size_t> order(grad_units.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return grad_units[a].begin < grad_units[b].begin; });
  z.by_grad_unit.assign(grad_units.size(), {});
  auto add = [&](size_t k, int64_t b, int64_t e, int group) {
    const int P = group ? expert_ranks : ranks, r = group ? expert_rank : rank;
    ZeroUnit u;
    u.begin = b;
    u.end = e;
    u.group = group;
    u.ranks = P;
    u.grad_unit = int(k);
    const int64_t n = e - b;
    u.per_rank = ((n + P - 1) / P + 15) / 16 * 16;
    u.lo = std::min(u.end, u.begin + r * u.per_rank);
    u.hi = std::min(u.end, u.lo + u.per_rank);
    u.offset = z.shard_size;
    z.shard_size += u.per_rank;
    z.max_unit = std::max(z.max_unit, u.per_rank * P);
    z.by_grad_unit[k].push_back(int(z.units.size()));
    z.units.push_back(u);
  };
  for (size_t k : order) {
    const GradUnit& g = grad_units[k];
    ADGT_CHECK(g.end > g.begin, "ZeRO shards: empty gradient unit [" << g.begin << ", " << g.end << ")");
    ADGT_CHECK(z.units.empty() || z.units.back().end <= g.begin,
               "ZeRO shards: gradient units overlap at " << g.begin);
    // Expert parallelism: the unit's expert weights from the first one on.
    int64_t cut = g.end;
    if (expert_ranks > 0)
      for (const ParamSpec& p : table)
        if (p.expert >= 0 && p.offset >= g.begin && p.offset < g.end) cut = std::min(cut, p.offset);
    if (cut > g.begin) add(k, g.begin, cut, 0);
    if (cut < g.end) {
      for (const ParamSpec& p : table)
        ADGT_CHECK(!(p.offset >= cut && p.offset < g.end && p.expert < 0),
                   "ZeRO shards: " << p.name << " follows an expert weight in its unit");
      add(k, cut, g.end, 1);
    }
  }
  for (const ZeroUnit& u : z.units)
    for (const ParamSpec& p : table) {
      const int64_t b = std::max(u.lo, p.offset), e = std::min(u.hi, p.offset + p.numel);
      if (b >= e) continue;
      ParamSpec q = p;
      q.offset = u.offset + (b - u.lo);
      q.numel = e - b;
      q.shape = {q.numel};
      z.table.push_back(q);
    }
  // Every parameter element is in some unit (gradients outside the units
  // would never be reduced).
  for (const ParamSpec& p : table) {
    const int a = z.unit_of(p.offset), b = z.unit_of(p.offset + p.numel - 1);
    ADGT_CHECK(a >= 0 && a == b, "ZeRO shards: parameter " << p.name
                                                             << " is not inside one gradient unit");
  }
  return z;
}

}  // namespace adgt
