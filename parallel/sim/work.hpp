// What one rank computes and communicates for one micro-batch of one model
// stage, as op lists with local shapes (docs/simulator.md, "Work"): the
// forward (F), the input gradient (B) and the weight gradient (W) of every
// layer, the embedding and the head, with the tensor- and expert-parallel
// collectives inside them, the recompute the configuration asks for, the
// pipeline message sizes, the gradient buckets and the optimizer step. It
// mirrors core/model/model_forward_backward.cpp op for op; collectives are
// given as (kind, group, bytes) so the simulator costs them for each rank's
// group on the cluster.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/sim/ops.hpp"

namespace adgt::sim {

struct CommOp {
  cluster::Collective kind = cluster::Collective::AllReduce;
  // tp, ep or cp (in a layer); dp / edp / pp / world, or dpcp / edpcp under
  // context parallelism (the step)
  Group group = Group::tp;
  double bytes = 0;         // collective_time's `bytes`
  // A step collective's place: before the first instruction, between the
  // gradient reduction and the update, or after the update.
  enum When : uint8_t { Start, BeforeUpdate, AfterUpdate } when = BeforeUpdate;
  // In a layer: the collective `repeat` times, each overlapped with the
  // compute of `hide` (ops also counted in the piece's own ops), so each
  // repetition exposes max(0, its time - theirs): the ring's K/V exchange
  // with the attention of the block before it (parallel/cp/ring_attention.cpp).
  int64_t repeat = 1;
  std::vector<Op> hide;
  // Collectives of the same group that share the link and the window
  // (ZeRO-3: a unit's weight gather with an earlier unit's gradient
  // reduce-scatter, both during the compute of the unit before): their
  // times add to this one's before `hide` is taken off.
  std::vector<std::pair<cluster::Collective, double>> with;
};

// A piece of work in execution order: ops, then the collectives that follow
// them (a tensor-parallel all-reduce after the o projection, ...). A piece may
// end a layer's gradient: `grads_done_layer` >= 0 names the layer whose weight
// gradients are final when the piece ends (-1: none; the embedding is layer
// -2, the head layer n_layers).
struct Piece {
  std::vector<Op> ops;
  std::vector<CommOp> comms;
  int64_t grads_done_layer = -1;
};

struct PassWork {
  std::vector<Piece> pieces;
};

// One model stage (a chunk of one pipeline rank) for one micro-batch.
struct StageWork {
  int64_t first_layer = 0, end_layer = 0;  // [first, end)
  bool embedding = false, head = false;
  PassWork forward;         // F
  PassWork input_grad;      // B alone (with the recompute it needs)
  PassWork weight_grad;     // W alone
  PassWork backward;        // B and W fused, layer by layer (Backward)
  double activation_bytes = 0;  // one SendAct / SendGrad message
};

// A gradient bucket of this rank (the reducer's plan, approximated by whole
// layers: parallel/dp/grad_buckets.hpp closes a bucket once it holds
// bucket_mb; the units here are layers, so a bucket ends on a layer boundary).
struct BucketWork {
  int chunk = 0;                 // -1: ZeRO-1's one bucket of every chunk
  std::vector<int64_t> layers;   // whose gradients it holds (ready when all are final)
  double bytes = 0;              // fp32 gradient bytes
  Group group = Group::dp;       // dp, or edp for expert weights
  bool reduce_scatter = false;   // ZeRO-1
};

struct RankWork {
  std::vector<StageWork> chunks;   // (virtual_stages)
  std::vector<BucketWork> buckets; // in start order
  std::vector<Op> optimizer;       // the update: sum of squares, AdamW
  // The step's blocking collectives in order (parallel/engine/engine.cpp,
  // trainer.cpp, pipeline/executor.cpp): the pipeline's start barrier, the
  // loss and bubble all-reduces, the gradient norm's, the stop-signal
  // agreement, ZeRO-1's parameter all-gather. Groups of one are left out.
  std::vector<CommOp> step_comms;
  double param_elems = 0;          // this rank's parameters
  double expert_param_elems = 0;   // of which expert weights (ZeRO-2/3 with ep: their own segment, over edp)
};

// How the run being simulated computes what adgt computes one way: for
// comparing with other frameworks' published runs (docs/simulator.md).
struct WorkOptions {
  bool unfused_attention = false;  // scores in memory: batched GEMMs, softmax (Megatron-LM
                                   // before FlashAttention) instead of the flash kernels
  bool dropout = false;            // attention and hidden dropout (GPT-3-era recipes)
  // The share of routed tokens each expert gets (model.n_experts entries,
  // normalised here); empty: uniform. With parallel.expert_placement (or
  // contiguous blocks) this decides each ep rank's expert work; the ep group
  // runs in lockstep at its all-to-alls, so every rank is costed as the
  // busiest (adgt-sim --moe-skew: a Zipf law over the expert ids).
  std::vector<double> expert_load;
};

// Zipf shares (e + 1)^-s of n experts, normalised (s = 0: uniform).
std::vector<double> zipf_load(int64_t n, double s);

// Bytes per element of the compute dtype (train.dtype): 2 bf16, 8 f64, else 4.
int compute_bytes(const RunConfig& cfg);

// The work of pipeline rank `pp_rank` (every tp and dp rank of it does the
// same) for the validated configuration `cfg` (its layout keys in effect).
RankWork rank_work(const RunConfig& cfg, int pp_rank, const WorkOptions& opts = {});

// Seconds of pipeline rank pp_rank's compute in one step at nominal speed,
// nothing overlapped: accum_steps() x every chunk's forward and backward (the
// cheaper of the fused and the split backward), plus the update. The sweep's
// lower bound and what a power cap costs a rank (power_slowdown.hpp) read it.
double rank_step_compute(const RunConfig& cfg, int pp_rank, OpCosts& costs, const WorkOptions& opts = {});

}  // namespace adgt::sim
