// Stage partition for pipeline parallelism: the cost model, the min-max
// balancer and the stage -> rank mapping (core/pipeline_stages.hpp).
#include "core/pipeline_stages.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace adgt {

StageCostModel stage_cost_model(const ModelConfig& m) {
  const double C = double(m.d_model), F = double(m.ffn_hidden), V = double(m.vocab_size);
  const double T = double(m.seq_len);
  const double kv = double(m.n_kv_heads) * double(m.head_dim());  // k and v width
  const double layer_params = 2 * C * C + 2 * C * kv + 3 * C * F;  // q,o + k,v + gate,up,down
  StageCostModel c;
  c.layer = 6 * layer_params + 3.0 * 2 * 2 * (T / 2) * C;  // + causal QK^T and AV, fwd + bwd
  c.embedding = 3 * C;
  c.head = 6 * C * V;
  return c;
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
  return balance_layers(L, int(S), c.layer, c.embedding, c.head);
}

int64_t StageSlice::num_layers() const {
  int64_t n = 0;
  for (const auto& [first, end] : chunks) n += end - first;
  return n;
}

StageSlice stage_slice(const std::vector<int64_t>& counts, int pp, int virtual_stages,
                       int pp_rank) {
  if (pp < 1 || virtual_stages < 1 || pp_rank < 0 || pp_rank >= pp ||
      counts.size() != size_t(pp) * size_t(virtual_stages))
    throw std::invalid_argument("stage_slice: need 0 <= pp_rank < pp and pp x virtual_stages "
                                "counts; got pp=" + std::to_string(pp) + " virtual_stages=" +
                                std::to_string(virtual_stages) + " pp_rank=" +
                                std::to_string(pp_rank) + " and " +
                                std::to_string(counts.size()) + " counts");
  std::vector<int64_t> first(counts.size() + 1, 0);  // first layer of each stage
  for (size_t s = 0; s < counts.size(); ++s) first[s + 1] = first[s] + counts[s];
  StageSlice out;
  for (int c = 0; c < virtual_stages; ++c) {
    const size_t s = size_t(c) * size_t(pp) + size_t(pp_rank);
    out.chunks.emplace_back(first[s], first[s + 1]);
  }
  out.embedding = pp_rank == 0;       // stage 0 = chunk 0 of rank 0
  out.head = pp_rank == pp - 1;       // stage S-1 = chunk v-1 of rank pp-1
  return out;
}

StageSlice whole_model(const ModelConfig& m) {
  StageSlice out;
  out.chunks.emplace_back(0, m.n_layers);
  return out;
}

}  // namespace adgt
