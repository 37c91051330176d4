// Which layers each pipeline stage holds (docs/config.md, "Pipeline stages").
//
// The model's L blocks are cut into S = pp x virtual_stages contiguous stages;
// chunk c of pipeline rank r is stage s = c*pp + r (the convention of
// parallel/schedule, docs/pipeline-schedules.md). Stage 0 also holds the
// token embedding, stage S-1 the final norm and lm_head. Pure functions: no
// ranks, no communicators; the pipeline pieces in parallel/ call these.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/config.hpp"

namespace adgt {

// Forward+backward cost per token of each piece, in FLOPs (the balancing
// weights). With C = d_model, F = ffn_hidden, V = vocab_size, T = seq_len,
// KV*hd = n_kv_heads x head_dim:
//   layer     = 6 x (2*C*C + 2*C*KV*hd + 3*C*F)        q,o + k,v + gate,up,down (2 FLOPs per
//               + 6 x T x C                            multiply-add, x3 for fwd + bwd), plus
//                                                      causal attention scores and values:
//                                                      3 x 2 x 2 x (T/2) x C
//   embedding = 3 x C                                  a row lookup and its scatter-add
//   head      = 6 x C x V                              lm_head (final norm and loss: O(C + V),
//                                                      left out)
struct StageCostModel {
  double layer = 0, embedding = 0, head = 0;
};
StageCostModel stage_cost_model(const ModelConfig& m);

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

// Layers of each model stage s = 0..S-1 (S = pp * virtual_stages):
// parallel.stage_layers when given; else for virtual_stages > 1 equal counts
// n_layers / S (validate() requires the division to be exact; the interleaved
// schedule assumes equal chunks); else balance_layers() with
// stage_cost_model(): stage 0 pays the embedding, stage S-1 the head.
// pp == 1 and virtual_stages == 1: {n_layers}. Expects a validated config
// (std::invalid_argument otherwise).
std::vector<int64_t> stage_layer_counts(const RunConfig& cfg);

// What one pipeline rank holds.
struct StageSlice {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // global layer range [first, end) per chunk
  bool embedding = true;  // model.embed_tokens (stage 0: chunk 0 of pp rank 0)
  bool head = true;       // model.norm and lm_head (stage S-1: chunk v-1 of pp rank pp-1)
  int64_t num_layers() const;  // layers over all chunks
};
// The slice of pipeline rank `pp_rank` for per-stage counts `counts`
// (counts.size() == pp * virtual_stages): chunk c is stage c*pp + pp_rank.
StageSlice stage_slice(const std::vector<int64_t>& counts, int pp, int virtual_stages,
                       int pp_rank);
// No pipeline: one chunk [0, n_layers), embedding and head.
StageSlice whole_model(const ModelConfig& m);

}  // namespace adgt
