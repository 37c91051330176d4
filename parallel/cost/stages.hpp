// How many layers each pipeline stage holds (docs/config.md, "Pipeline
// stages"): the per-stage training FLOPs of parallel/cost/flops.hpp (the
// realistic convention: causal attention, MoE layers at top-k experts plus the
// router) and the min-max partition over them. What one rank then holds is
// core/model/stage_slice.hpp's stage_slice() of these counts.
//
// The model's L blocks are cut into S = pp x virtual_stages contiguous stages;
// stage 0 also holds the token embedding, stage S-1 the final norm and lm_head.
// Pure functions: no ranks, no communicators.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "parallel/cost/flops.hpp"

namespace adgt {

// Forward+backward FLOPs per token of each piece (the balancing weights), all
// from flops.hpp with AttentionCount::Causal:
//   layers[l] = 3 x layer_forward_flops(m, l, Causal).total()
//             (dense: 6 x (2*C*H*hd + 2*C*KV*hd + 3*C*F) + 6 x T x H*hd;
//              MoE: the FFN term is k experts' 3*C*Fe each plus the router's C*E)
//   embedding = 3 x C      a row copy and its scatter-add
//   head      = 6 x C x V  lm_head (final norm and loss: O(C + V), left out)
struct StageCostModel {
  std::vector<double> layers;  // (L)
  double embedding = 0, head = 0;
};
StageCostModel stage_cost_model(const ModelConfig& m);

// Training FLOPs per token of a stage holding layers [first, end), plus the
// embedding and/or the head: the sum of flops.hpp's training_pass() of each
// piece (F = forward, B = W = the backward halves).
PassFlops stage_pass_flops(const ModelConfig& m, int64_t first, int64_t end, bool embedding,
                           bool head);

// Contiguous layer counts for `stages` stages (each >= 1, summing to
// n_layers) that minimise the largest stage cost
//   cost(s) = count(s) x layer + (s == 0 ? first_extra : 0) + (s == stages-1 ? last_extra : 0).
// Among the optimal splits it returns a fixed one: start from the largest
// count each stage can hold under the optimum, then take the surplus away one
// layer at a time from the currently most expensive stage that still has more
// than one (ties: the earliest stage). So with equal costs the earlier stages
// get fewer layers (7 layers on 2 stages: {3, 4}). Costs within 1e-12 of the
// total model cost count as equal (rounding must not move a layer).
// Needs n_layers >= stages >= 1, layer > 0, extras >= 0 (std::invalid_argument).
std::vector<int64_t> balance_layers(int64_t n_layers, int stages, double layer,
                                    double first_extra, double last_extra);

// The same for layers of different costs (a MoE layer every moe_every-th):
// cost(s) = the sum of layer_costs over the stage's layers + its extras.
// When every layer costs the same this is exactly the split above. Otherwise
// the min-max optimum and, among the optimal splits, the smallest sum of
// squared stage costs (then the earlier stages with fewer layers).
// Needs layer_costs.size() >= stages >= 1, each cost > 0, extras >= 0.
std::vector<int64_t> balance_layers(const std::vector<double>& layer_costs, int stages,
                                    double first_extra, double last_extra);

// Layers of each model stage s = 0..S-1 (S = pp * virtual_stages):
// parallel.stage_layers when given; else for virtual_stages > 1 equal counts
// n_layers / S (validate() requires the division to be exact; the interleaved
// schedule assumes equal chunks); else balance_layers() with
// stage_cost_model(): stage 0 pays the embedding, stage S-1 the head.
// pp == 1 and virtual_stages == 1: {n_layers}. Expects a validated config
// (std::invalid_argument otherwise).
std::vector<int64_t> stage_layer_counts(const RunConfig& cfg);

}  // namespace adgt
