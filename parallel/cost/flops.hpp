// FLOP counts of the model, per token: the only place FLOP formulas live
// (docs/parallel.md, "One cost model"). MFU, the dry run, stage balancing and
// the pipeline's predicted stage times all count with these functions.
//
// Notation: C d_model, H heads, KV kv heads, hd head_dim, F ffn_hidden, Fe the
// expert FFN width, E n_experts, k moe_top_k, V vocab_size, T seq_len, L layers.
// A multiply-add is 2 FLOPs; an (out x in) weight applied to one token costs
// 2 * out * in. Counts are for the whole (unsharded) model.
//
// Two conventions, chosen by the caller:
// - MFU (mfu_flops_per_token; the dry run prints it): the PaLM appendix B /
//   Megatron convention, 6 * N_matmul + 12 * L * H * hd * T per token. The
//   attention core is counted non-causal (AttentionCount::Full: every query
//   against all T keys), lm_head is counted even when tied, the embedding
//   lookup is free, and a MoE token counts the k experts it runs (plus the
//   router). So our MFU is comparable with published numbers.
// - Stage balancing and predicted times (parallel/cost/stages.hpp): the
//   realistic cost: the causal attention core (AttentionCount::Causal: T/2
//   keys per query on average), MoE layers at k experts plus the router, and
//   the embedding's row copy and scatter-add.
//
// Training = forward + backward, backward = 2 x forward, split into its input
// gradient (dX = dY W: one forward's FLOPs) and weight gradient (dW = dY^T X:
// one forward's FLOPs) halves; the pipeline's BackwardInput / BackwardWeight
// split (parallel/schedule) is planned with these halves. For the weight-free
// pieces (the attention core, the embedding's scatter-add) the same halves are
// a convention, not a count.
#pragma once
#include <cstdint>

#include "core/config.hpp"

namespace adgt {

// How the attention core (QK^T and PV) is counted.
enum class AttentionCount {
  Full,    // T keys per query: the MFU convention (no causal discount)
  Causal,  // T/2 keys per query on average (the T x T scores halved): what runs
};

// Forward FLOPs per token of one transformer layer, by piece.
struct LayerFlops {
  double attention_proj = 0;  // q, k, v, o: 2 * (2*C*H*hd + 2*C*KV*hd)
  double attention_core = 0;  // QK^T and PV: 2 * 2*hd*H * keys per query (T or T/2)
  double ffn = 0;             // dense_ffn_flops or, in a MoE layer, moe_ffn_flops
  double total() const { return attention_proj + attention_core + ffn; }
};

// One training pass split as the pipeline schedules it, for any piece.
struct PassFlops {
  double forward = 0;
  double backward_input = 0;   // gradient w.r.t. the piece's input (BackwardInput)
  double backward_weight = 0;  // gradient w.r.t. its weights (BackwardWeight)
  double total() const { return forward + backward_input + backward_weight; }
  PassFlops& operator+=(const PassFlops& o);
};

// q, k, v and o projections: 2 * (2*C*H*hd + 2*C*KV*hd).
double attention_projection_flops(const ModelConfig& m);
// Scores QK^T and the weighted sum PV: 2 * 2*hd*H*T (Full) or half of it (Causal).
double attention_core_flops(const ModelConfig& m, AttentionCount count);
// Dense SwiGLU FFN (gate, up, down): 2 * 3*C*F.
double dense_ffn_flops(const ModelConfig& m);
// MoE FFN: the k experts a token runs, 2 * 3*C*Fe each, plus the router 2*C*E.
// (Routing, softmax and combine are O(E + k*C): left out.)
double moe_ffn_flops(const ModelConfig& m);
// All pieces of layer `layer` (MoE FFN where ModelConfig::is_moe_layer).
LayerFlops layer_forward_flops(const ModelConfig& m, int64_t layer, AttentionCount count);
// The embedding: a row copy of C elements (counted as C).
double embedding_forward_flops(const ModelConfig& m);
// lm_head: 2*C*V (the final norm and the loss are O(C + V): left out).
double head_forward_flops(const ModelConfig& m);

// A piece with `forward` FLOPs in training: backward = 2 x forward, in an
// input-gradient and a weight-gradient half.
PassFlops training_pass(double forward);

// Executed FLOPs of single ops, by shape: what the simulator (parallel/sim/
// ops.cpp) times. They differ from the model's count above in one place: the
// attention core's backward. The model (training_pass, MFU) counts every
// backward as 2 x its forward; the flash-style kernels that run recompute the
// scores QK^T in the backward, so its executed FLOPs are dV, dP, dQ, dK (4
// GEMMs) plus that recompute: kAttentionBackwardExecuted x the forward. MFU
// stays a model-FLOP figure comparable with published ones; step times come
// from what runs.
inline constexpr double kAttentionBackwardExecuted = 2.5;
// (m x k) times (k x n): 2 m n k.
double gemm_flops(double m, double n, double k);
// The causal attention core of b sequences of t tokens, h query heads of
// head_dim hd: forward QK^T and PV over the causal half, 2 GEMMs x 2 FLOPs x
// b t (t/2) h hd; backward kAttentionBackwardExecuted x that.
double attention_core_executed_flops(double b, double t, double h, double hd, bool backward);

// The MFU convention above: training (3 x forward) FLOPs per token over the L
// layers (AttentionCount::Full) and lm_head; no embedding. Equals
// 6 * N_matmul_active + 12 * L * H * hd * T.
double mfu_flops_per_token(const ModelConfig& m);

}  // namespace adgt
