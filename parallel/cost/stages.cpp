// Stage partition for pipeline parallelism: the per-stage FLOPs and the
// min-max balancer (parallel/cost/stages.hpp).
#include "parallel/cost/stages.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace adgt {

StageCostModel stage_cost_model(const ModelConfig& m) {
  StageCostModel c;
  for (int64_t l = 0; l < m.n_layers; ++l)
    c.layers.push_back(
        training_pass(layer_forward_flops(m, l, AttentionCount::Causal).total()).total());
  c.embedding = training_pass(embedding_forward_flops(m)).total();
  c.head = training_pass(head_forward_flops(m)).total();
  return c;
}

PassFlops stage_pass_flops(const ModelConfig& m, int64_t first, int64_t end, bool embedding,
                           bool head) {
  double forward = 0;
  for (int64_t l = first; l < end; ++l)
    forward += layer_forward_flops(m, l, AttentionCount::Causal).total();
  PassFlops p = training_pass(forward);
  if (embedding) p += training_pass(embedding_forward_flops(m));
  if (head) p += training_pass(head_forward_flops(m));
  return p;
}

std::vector<int64_t> balance_layers(int64_t n_layers, int stages, double layer,
                                    double first_extra, double last_extra) {
  if (stages < 1 || n_layers < stages)
    throw std::invalid_argument("balance_layers: need n_layers >= stages >= 1, got n_layers=" +
                                std::to_string(n_layers) + " stages=" + std::to_string(stages));
  if (!(layer > 0) || !(first_extra >= 0) || !(last_extra >= 0) || !std::isfinite(layer) ||
      !std::isfinite(first_extra) || !std::isfinite(last_extra))
    throw std::invalid_argument("balance_layers: need layer > 0 and finite extras >= 0");
  const size_t S = size_t(stages);
  std::vector<double> extra(S, 0.0);
  extra[0] += first_extra;
  extra[S - 1] += last_extra;
  auto cost = [&](size_t s, int64_t k) { return double(k) * layer + extra[s]; };
  // Costs closer than `tol` count as equal, so rounding (a fused multiply-add
  // at one call site and not another) cannot move a layer across a boundary.
  const double tol = 1e-12 * (double(n_layers) * layer + first_extra + last_extra);
  // The most layers stage s can take without exceeding `bound`.
  auto cap = [&](size_t s, double bound) {
    double q = std::floor((bound - extra[s]) / layer);
    int64_t k = q < 0 ? 0 : q > double(n_layers) ? n_layers : int64_t(q);
    while (k < n_layers && cost(s, k + 1) <= bound + tol) ++k;
    while (k > 0 && cost(s, k) > bound + tol) --k;
    return k;
  };
  auto feasible = [&](double bound) {
    int64_t total = 0;
    for (size_t s = 0; s < S; ++s) {
      const int64_t k = cap(s, bound);
      if (k < 1) return false;
      total += k;
    }
    return total >= n_layers;
  };
  // The optimum is the cost of some stage at some count: try those in order.
  std::vector<double> candidates;
  for (size_t s = 0; s < S; ++s)
    if (s == 0 || s == S - 1 || s == 1)  // stages 1..S-2 all share extra 0
      for (int64_t k = 1; k <= n_layers; ++k) candidates.push_back(cost(s, k));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  size_t lo = 0, hi = candidates.size() - 1;  // candidates[hi] (all stages at n_layers) is feasible
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (feasible(candidates[mid])) hi = mid;
    else lo = mid + 1;
  }
  const double bound = candidates[lo];
  std::vector<int64_t> counts(S);
  int64_t total = 0;
  for (size_t s = 0; s < S; ++s) total += counts[s] = cap(s, bound);
  // Take the surplus from the most expensive stage with more than one layer
  // (ties: the earliest); no stage cost rises, so the maximum stays optimal.
  for (; total > n_layers; --total) {
    size_t pick = S;
    for (size_t s = 0; s < S; ++s)
      if (counts[s] > 1 && (pick == S || cost(s, counts[s]) > cost(pick, counts[pick]) + tol))
        pick = s;
    --counts[pick];
  }
  return counts;
}

std::vector<int64_t> balance_layers(const std::vector<double>& layer_costs, int stages,
                                    double first_extra, double last_extra) {
  const int64_t L = int64_t(layer_costs.size());
  for (double c : layer_costs)
    if (!(c > 0) || !std::isfinite(c))
      throw std::invalid_argument("balance_layers: need every layer cost > 0 and finite");
  if (L > 0 && std::all_of(layer_costs.begin(), layer_costs.end(),
                           [&](double c) { return c == layer_costs[0]; }))
    return balance_layers(L, stages, layer_costs[0], first_extra, last_extra);
  if (stages < 1 || L < stages)
    throw std::invalid_argument("balance_layers: need n_layers >= stages >= 1, got n_layers=" +
                                std::to_string(L) + " stages=" + std::to_string(stages));
  if (!(first_extra >= 0) || !(last_extra >= 0) || !std::isfinite(first_extra) ||
      !std::isfinite(last_extra))
    throw std::invalid_argument("balance_layers: need finite extras >= 0");
  const size_t S = size_t(stages), N = size_t(L);
  std::vector<double> prefix(N + 1, 0.0);  // prefix[j]: layers [0, j)
  for (size_t l = 0; l < N; ++l) prefix[l + 1] = prefix[l] + layer_costs[l];
  // Stage s holding layers [i, j).
  auto cost = [&](size_t s, size_t i, size_t j) {
    return prefix[j] - prefix[i] + (s == 0 ? first_extra : 0.0) +
           (s + 1 == S ? last_extra : 0.0);
  };
  const double tol = 1e-12 * (prefix[N] + first_extra + last_extra);
  const double inf = std::numeric_limits<double>::infinity();
  // lo[s][i]: the smallest largest cost of stages s..S-1 over layers [i, N);
  // then sq[s][i]: the smallest sum of their squared costs with none above the
  // optimum. Stage s starts at a layer i in [s, N - (S - s)].
  std::vector<std::vector<double>> lo(S + 1, std::vector<double>(N + 1, inf)), sq = lo;
  lo[S][N] = sq[S][N] = 0;
  for (size_t s = S; s-- > 0;)
    for (size_t i = s; i + (S - s) <= N; ++i)
      for (size_t j = i + 1; j + (S - s - 1) <= N; ++j)
        lo[s][i] = std::min(lo[s][i], std::max(cost(s, i, j), lo[s + 1][j]));
  const double bound = lo[0][0] + tol;
  for (size_t s = S; s-- > 0;)
    for (size_t i = s; i + (S - s) <= N; ++i)
      for (size_t j = i + 1; j + (S - s - 1) <= N; ++j)
        if (cost(s, i, j) <= bound)
          sq[s][i] = std::min(sq[s][i], cost(s, i, j) * cost(s, i, j) + sq[s + 1][j]);
  // Forward: each stage takes the fewest layers that keep both optima.
  const double sq_tol = 1e-12 * sq[0][0];
  std::vector<int64_t> counts;
  for (size_t s = 0, i = 0; s < S; ++s) {
    size_t j = i + 1;
    while (cost(s, i, j) > bound ||
           cost(s, i, j) * cost(s, i, j) + sq[s + 1][j] > sq[s][i] + sq_tol)
      ++j;
    counts.push_back(int64_t(j - i));
    i = j;
  }
  return counts;
}

std::vector<int64_t> stage_layer_counts(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int64_t L = cfg.model.n_layers;
  const int64_t S = p.pp * p.virtual_stages;
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument("stage_layer_counts: " + what + " (pp=" + std::to_string(p.pp) +
                                " virtual_stages=" + std::to_string(p.virtual_stages) +
                                " n_layers=" + std::to_string(L) +
                                "); the config was not validated");
  };
  if (S < 1 || L < S) fail("fewer layers than stages");
  if (!p.stage_layers.empty()) {
    if (int64_t(p.stage_layers.size()) != S) fail("parallel.stage_layers has the wrong length");
    int64_t sum = 0;
    for (int64_t c : p.stage_layers) {
      if (c < 1) fail("parallel.stage_layers has an entry < 1");
      sum += c;
    }
    if (sum != L) fail("parallel.stage_layers does not sum to n_layers");
    return p.stage_layers;
  }
  if (S == 1) return {L};
  if (p.virtual_stages > 1) {
    if (L % S != 0) fail("n_layers is not divisible by the stage count");
    return std::vector<int64_t>(size_t(S), L / S);
  }
  const StageCostModel c = stage_cost_model(cfg.model);
  return balance_layers(c.layers, int(S), c.embedding, c.head);
}

}  // namespace adgt
