// A Mixtral-style sparse mixture-of-experts FFN block (HF MixtralSparseMoeBlock)
// with expert parallelism, hand-written forward and backward on the Backend.
//
// Semantics, per token row t of this rank's input x (N, C):
//   logits = x Wg^T (E), probs = softmax(logits), computed in the tensor dtype.
//   Selection: the top_k experts by score = probs + bias (bias only with
//   aux_free; ties go to the lower expert id), in descending score order.
//   Weights: the chosen experts' probs renormalised to sum 1 over the k
//   (Mixtral's norm_topk_prob); bias never enters them.
//   Expert e (SwiGLU): y_e(x) = w2 (silu(w1 x) * (w3 x)); w1, w3 (F, C), w2 (C, F).
//   out[t] = sum over the chosen, kept experts e of weight[t,e] * y_e(x[t]).
//
// Capacity (capacity_factor > 0): each rank's rows (or each capacity_segment
// rows of them; under context parallelism the micro-batch's whole
// sequences, set_sequence_split) form a capacity group; expert e accepts at most
// ceil(capacity_factor * rows * top_k / E) of a group's assignments, in token
// order; the rest are dropped: they contribute 0 and their weight is NOT
// renormalised away over the surviving experts (a token with every choice
// dropped outputs 0; in a transformer the residual carries it). Dropless
// (capacity_factor <= 0) is the default.
//
// Auxiliary load-balancing loss (Switch Transformer), over all tokens of the
// ep group: aux = E * sum_e f_e * P_e, f_e = (assignments routed to e, before
// drops) / (N_total * top_k), P_e = mean over tokens of probs[:, e]. f_e is a
// constant in the gradient. NOTE: HF's load_balancing_loss_func does not divide
// by top_k, so HF's value is top_k * aux (use coef_hf * top_k for the same
// gradient). forward() returns aux; the loss term is aux_loss_coef * aux, and
// backward adds aux_grad_scale * aux_loss_coef * d(aux) to dx and dWg.
//
// Aux-loss-free balancing (DeepSeek-V3, aux_free): the selection bias is state,
// not a parameter; update_bias(load) after each optimizer step adds
// bias_rate * sign(mean(load) - load_e). Pass the step's load summed over every
// micro-batch, layer call and every rank that shares the router outside the ep
// group (dp), so all replicas keep one bias; stats().load is already summed
// over the ep group.
//
// Expert parallelism: the ep group (a Comm, nullptr = one rank) splits the E
// experts over its ranks by an ExpertPlacement table. Each rank routes its own
// tokens (the router is replicated), sends each kept assignment's row to the
// expert's owner (all_to_all of per-expert counts, then all_to_allv of rows,
// ordered by destination rank, local expert, token), which runs its experts on
// the received rows grouped by expert in (source rank, token) order, and sends
// the results back; the source rank combines them with the weights. The
// backward mirrors it. forward/backward are collective over the ep group: every
// ep rank must call them in the same order (any N per rank, N <= max_tokens).
//
// Gradients: all accumulate (+=), dx included. dWg is this rank's partial sum
// over its tokens: the router is replicated over dp AND ep, so the trainer sums
// it over every rank holding a replica (dp x ep), like the other dense weights.
// Expert grads live on the owning rank and already include every ep rank's
// tokens; they need summing only over the expert-data-parallel replicas.
//
// Replicas (set_replicas; moe_replicas.hpp): a rank may also serve shadows of
// other ranks' experts. The layer keeps the shadows' weights and gradients
// itself; MoeParams still hold the owned experts only. sync_replicas copies
// the owners' weights into the shadows (call it after every change to the
// weights, before the next forward); each backward returns the shadows'
// gradients to their owners, which add them (collective over ep). The row
// split: the counts exchange is an all-gather of every rank's kept counts
// per expert, and the send buffer is the dispatch plan's order permuted into
// (destination, its local expert) blocks.
//
// Slots: a micro-batch in flight keeps what its backward needs in a slot
// (add_slot(); forward(slot) overwrites, backward(slot) reads). A buffer of
// the expert rows is sized on first use for recv_reserve(N) rows (the
// capacity's most with moe_capacity_factor, else the uniform routing's N k:
// what parallel/cost/memory.cpp estimates) and grows, 25% to spare, only
// when a routing needs more; the rows sent are at most N k.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm.hpp"
#include "core/model/fp8_linear.hpp"
#include "core/model/moe_capacity.hpp"
#include "core/model/moe_placement.hpp"
#include "core/model/moe_replicas.hpp"
#include "kernels/backend.hpp"

namespace adgt {

// model.moe_bias_init_zipf's initial selection bias (experiments with
// skewed routing): bias_e = -s beta ln(e + 1) for expert e = 0..E-1, beta =
// init_std sqrt(d_model) sqrt(6) / (pi E). At init a router logit has the
// standard deviation init_std sqrt(d_model) (its input is RMS-normalised),
// so a probability deviates from 1/E by about logit / E; beta is the scale
// of a Gumbel variable of that deviation, under which a first choice by
// probs + bias falls on expert e with probability proportional to
// (e + 1)^-s (Zipf(s)). The logits are Gaussian, not Gumbel, and grow as
// the router learns: the skew is measured, not assumed (docs/adaptation.md).
std::vector<double> zipf_selection_bias(int64_t n_experts, int64_t d_model, double init_std, double s);

struct MoeOptions {
  int64_t n_experts = 8, top_k = 2;
  double aux_loss_coef = 0.01;  // loss term coef * aux; 0: no aux gradient (aux still reported)
  bool aux_free = false;        // DeepSeek-V3 selection bias
  double bias_rate = 1e-3;      // bias step per update_bias
  double capacity_factor = 0;   // <= 0: dropless
  // Rows per capacity group (0: all of a call's rows on this rank). Lets one
  // process reproduce a multi-rank run's drops on the union of its tokens.
  int64_t capacity_segment = 0;
  // The aux loss's token set: the whole ep group (true), or this rank's rows
  // only (false: each rank's micro-batch is balanced on its own, so the
  // objective does not depend on the expert-parallel layout; the model uses it).
  bool aux_over_ep_group = true;
};

// One layer's weights (or their gradients, same shapes). Views, e.g. into the
// model's flat buffers; the per-expert vectors hold this rank's experts only,
// in ExpertPlacement::local_experts(rank) order (ascending global id).
struct MoeParams {
  Tensor gate;                 // (E, C) router, HF block_sparse_moe.gate.weight
  std::vector<Tensor> w1, w3;  // (F, C) each, HF experts.{e}.w1/w3.weight
  std::vector<Tensor> w2;      // (C, F) each, HF experts.{e}.w2.weight
  // Optional, the fused gate/up (train.fused_projections): (2F, C) each, w1's
  // rows then w3's (the same memory as w1[i] and w3[i], adjacent). When set,
  // each expert runs one gate/up GEMM and the packed SwiGLU; forward and
  // backward must be given the same choice.
  std::vector<Tensor> w13;
};

struct MoeStats {
  // (E) assignments routed to each expert over the ep group, before drops.
  std::vector<int64_t> load;
  int64_t tokens = 0;         // token rows over the ep group
  int64_t dropped = 0;        // assignments dropped by capacity, over the ep group
  int64_t dropped_local = 0;  // of them, this rank's tokens
  double imbalance = 0;       // max(load) / mean(load)
  double aux_loss = 0;        // aux (without coef)
  int64_t a2a_bytes = 0;      // this rank's all-to-all payload bytes sent (forward)
  double a2a_seconds = 0;     // wall time in the forward's all-to-alls
  int64_t a2a_bytes_bwd = 0;  // the same for the slot's backward
  double a2a_seconds_bwd = 0;
  // This rank's experts (its local FFNs): rows they computed, forward and
  // backward, and the backend spans of their compute (Backend::span_begin;
  // -1: not measured), for Backend::span_seconds until the backend's
  // clear_spans().
  int64_t expert_rows = 0, expert_rows_bwd = 0;
  int64_t shadow_rows = 0;  // of expert_rows, the rows this rank's replicas (shadows) served
  int expert_span = -1, expert_span_bwd = -1;
};

class MoeLayer {
 public:
  // dt: F32, F64, or BF16 (mixed precision: bf16 weights and activations,
  // fp32 gradients, routing in fp32 on the backend). max_tokens: most rows per call on this rank. C: d_model,
  // F: expert hidden size. placement: owner rank per expert (empty:
  // contiguous). ep: the expert-parallel group (nullptr: one rank, all experts).
  // aux_group (context parallelism: the cp group, whose ranks hold the other
  // tokens of this rank's sequences; nullptr: none): with
  // aux_over_ep_group false, the aux loss is over the rows of every rank of
  // aux_group (their routed counts, probability sums and rows summed over it:
  // one value on each), each rank's backward giving its own rows' share of
  // its gradient; pass backward the aux_grad_scale of the whole micro-batch.
  MoeLayer(Backend& be, DType dt, int64_t max_tokens, int64_t C, int64_t F, MoeOptions o,
           std::vector<int> placement = {}, Comm* ep = nullptr, Comm* aux_group = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  int add_slot();  // returns the new slot's index
  int num_slots() const;

  // out (N, C) overwritten from x (N, C). Returns aux (without coef).
  double forward(int slot, Tensor out, const Tensor& x, const MoeParams& p);
  // dx (N, C) += dL/dx; grads += dL/dW, given dout = dL/dout (N, C) of the
  // slot's last forward, with the aux term's gradient scaled by
  // aux_grad_scale * aux_loss_coef (pass the scale applied to the LM loss
  // gradient of this micro-batch, e.g. 1 / micro-batches).
  // return_shadows false: the replicas' gradients stay in the shadows and
  // add up until a backward with true sends them to the owners (once per
  // step, in the last micro-batch's backward).
  void backward(int slot, Tensor dx, const MoeParams& p, const MoeParams& grads, const Tensor& dout,
                double aux_grad_scale, bool return_shadows = true);

  const MoeStats& stats(int slot) const;
  const MoeStats& last_stats() const;  // of the most recent forward

  const std::vector<double>& bias() const { return bias_; }
  void set_bias(std::vector<double> b);  // checkpoint restore; size E
  void update_bias(const std::vector<int64_t>& load);

  // Replicas of this layer's experts (none by default); the placement must be
  // the layer's. The shadows need a sync_replicas before the next forward.
  void set_replicas(const ExpertReplicas& r);
  const ExpertReplicas& replicas() const { return rep_; }
  // Copies each replicated expert's weights from its owner into its shadows.
  // p: this rank's owned experts (as forward takes them). Collective over ep.
  void sync_replicas(const MoeParams& p);

  // train.dtype fp8: the experts' GEMMs on FP8 operands through f's sites
  // (core/model/fp8_linear.hpp), `sites` indexed by global expert e * 3 +
  // projection: 0 w1 (the fused w13 when the layer runs fused), 1 w3, 2 w2
  // (-1: that GEMM stays bf16). Each expert's rows on this rank are one
  // GEMM's operand, scaled from their own amax (or the site's history).
  void set_fp8(Fp8Linears* f, std::vector<int> sites);

  // Context parallelism (moe_capacity.hpp): how this rank's rows sit in
  // the micro-batch. With a capacity whose groups span the ranks of
  // s.group (capacity_segment 0, or one that does not divide a chunk),
  // forward counts each group's assignments over s.group (an all-gather of
  // per-run counts and a host read per call), so the drops are one
  // process's. Without it (the default) the groups are this rank's rows.
  void set_sequence_split(MoeSequenceSplit s);

  const MoeOptions& options() const { return opt_; }
  const ExpertPlacement& placement() const { return place_; }
  const std::vector<int64_t>& local_experts() const;  // this rank's, ascending
  int ep_rank() const;

 private:
  struct Slot;
  struct Scratch;
  // forward()'s parts, in order. The router's plan read to the host once:
  // this rank's counts (lr), the ep group's sums (red) and the counts
  // received for this rank's experts (rc), all in `host`; tok the send order.
  struct RoutePlan {
    std::vector<double> host;
    // Into host: this rank's stats, the ep group's sums, the received
    // counts, the aux group's sums (lr when there is none).
    const double *lr = nullptr, *red = nullptr, *rc = nullptr, *ar = nullptr;
    Tensor tok;
  };
  RoutePlan route_forward(Slot& s, const Tensor& x, const MoeParams& p);
  void load_and_aux_loss(Slot& s, const RoutePlan& rp);
  // The rows sent to (Ms) and received from (Mr) the ep ranks and the
  // expert-major order of the received ones; replica_rows splits a
  // replicated expert's rows over its holders.
  void plan_rows(Slot& s, const RoutePlan& rp, int64_t& Ms, int64_t& Mr);
  void replica_rows(Slot& s, const RoutePlan& rp, std::vector<int64_t>& rcounts);
  void dispatch_rows(Slot& s, const Tensor& tok, int64_t Ms, int64_t Mr, bool fused);
  Tensor run_experts(Slot& s, const MoeParams& full, int64_t Mr);
  // An expert's GEMM (Backend::linear_forward / linear_backward), in FP8 when
  // set_fp8 gave expert e's projection a site. le: this rank's held index.
  int fp8_site(int64_t le, int proj) const;
  void expert_forward(int64_t le, int proj, Tensor y, const Tensor& x, const Tensor& w);
  void expert_backward(int64_t le, int proj, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                       const Tensor& w, bool accumulate_dx);
  void return_rows(Slot& s, const Tensor& ye, int64_t Ms, int64_t Mr);
  void check_params(const MoeParams& p, const char* what) const;
  // p followed by the shadows' weights (grads: their gradients).
  MoeParams with_shadows(const MoeParams& p, bool grads) const;
  // Shadow s's block of w1, w3, w2 (fused: w13 is w1 then w3) in b.
  void shadow_views(MoeParams& p, const Buffer& b, DType dt, bool fused) const;
  // The replicas' all-to-all-v between owners and holders (elements per ep
  // rank and displacements): `owned_*` this rank's experts shadowed on each
  // rank (owned_idx: their local indices, in that order), `shadow_*` this
  // rank's shadows of each rank's experts. The sync sends owned and receives
  // shadows; the gradients' return is the reverse.
  struct ShadowTraffic {
    std::vector<int64_t> owned_c, owned_d, shadow_c, shadow_d, owned_idx;
    int64_t owned = 0, shadows = 0;
  };
  ShadowTraffic shadow_traffic() const;
  // Sends each shadow's gradient to its owner, which adds it to grads.
  void return_shadow_grads(const MoeParams& grads);
  // Gradients and the combine weights' gradient: fp32 under bf16, else the layer's dtype.
  DType grad_dtype() const { return dt_ == DType::BF16 ? DType::F32 : dt_; }
  // A (rows, cols) view of b, grown to hold max(rows, reserve_rows) rows:
  // exactly so on first use and while rows stay within the reserve, with 25%
  // to spare beyond it.
  Tensor grow(Buffer& b, int64_t rows, int64_t cols, DType dt, int64_t reserve_rows = 0);
  int64_t recv_reserve(int64_t N) const;
  void upload_i32(Tensor dst, const std::vector<int32_t>& src);
  void a2av(Tensor out, const std::vector<int64_t>& recv_rows, const Tensor& in,
            const std::vector<int64_t>& send_rows, MoeStats& st, bool bwd);

  Backend& be_;
  DType dt_;
  int64_t max_tokens_, C_, F_, E_, k_;
  MoeOptions opt_;
  SelfComm self_;
  Comm* ep_;
  Comm* aux_;  // the aux loss's other ranks (context parallelism); nullptr: none
  ExpertPlacement place_;
  ExpertReplicas rep_;
  std::vector<std::vector<int64_t>> held_;  // per ep rank: owned experts, then shadows
  std::vector<std::vector<size_t>> hidx_;   // per ep rank and held expert: its holder index
  std::vector<int32_t> slot_host_;          // slot_ on the host
  Buffer shadow_w_, shadow_g_;              // per shadow: w1, w3, w2 (weights; gradients)
  bool synced_ = false;
  std::vector<double> bias_;  // (E) selection bias (aux_free)
  Buffer bias_dev_;           // its device copy, uploaded before a forward when changed
  bool bias_dirty_ = true;
  Buffer slot_;               // (E) int32: each expert's place in the send order
  Fp8Linears* fp8_ = nullptr;
  std::vector<int> fp8_sites_;  // (E, 3) see set_fp8
  MoeSequenceSplit split_;      // see set_sequence_split
  int64_t split_runs_n_ = -1;   // the rows split_runs_ was cut for (-1: none yet)
  MoeCapacityRuns split_runs_;  // moe_capacity_runs(split_, segment, N), checked once per N
  // The plan's capacity for a call of N rows (priors from the cp group
  // when its groups span ranks: collective over split_.group then).
  Backend::MoeCapacity capacity(const Tensor& choice, int64_t N);
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Scratch> scratch_;
  int last_slot_ = -1;
};

}  // namespace adgt
