// The training engine of one layout: this rank's model shard, its gradient
// reducer and optimizer, and (pp > 1) the pipeline executor, built from the
// run configuration and the process groups. It runs one optimizer step's
// forward and backward over the step's micro-batches and applies the update;
// the loop (trainer.hpp) owns the data, the logging, checkpoints and the
// controllers. A layout switch is a new Engine plus a reshard of the state.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/sharded.hpp"
#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/model/model.hpp"
#include "kernels/backend.hpp"
#include "parallel/dp/grad_reducer.hpp"
#include "parallel/dp/sharded_adamw.hpp"
#include "parallel/dp/zero_store.hpp"
#include "parallel/mesh/parallel_context.hpp"
#include "parallel/pipeline/executor.hpp"
#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/run_schedule.hpp"

namespace adgt {

// What one step measured on this rank.
struct StepTimes {
  double dp_wait_s = 0;  // finish_grad_sync's wait: data-parallel reduction not hidden
  // ZeRO-2/3 (ZeroStore): the step's weight gathers and gradient
  // reduce-scatters, and the seconds the step waited for them (their
  // exposed part; dp_wait_s is their sum).
  int64_t zero_gathers = 0, zero_reduces = 0, zero_gather_bytes = 0;
  double zero_gather_wait_s = 0, zero_reduce_wait_s = 0;
  // The compressed buckets' reduce (encode, exchange, decode; docs/compression.md),
  // on the step's path after the wait: exposed data-parallel time as well.
  double dp_compressed_s = 0;
  double bubble = -1;    // pipeline: idle share of the pipeline group's step (< 0: no pipeline)
  // Of `bubble`, the share spent waiting for a neighbour (in receives, or
  // done before the slowest rank); the rest is host work between instructions.
  double bubble_idle = -1;
  // Pipeline: the most micro-batch activations a rank of the pipeline group
  // held at once (chunk slots, all chunks; PipelineExecutor::last_peak_held);
  // < 0: no pipeline.
  int64_t held = -1;
};

class Engine {
 public:
  // Built for ctx.layout (the layout keys of cfg.parallel are replaced by it);
  // ctx's groups must match it (nullptr entries: groups of one). init false:
  // the weights are left zero for a state the caller restores at once (an
  // in-memory layout switch), skipping the random draws.
  Engine(const RunConfig& cfg, const ParallelContext& ctx, Backend& be, bool init = true);
  ~Engine();

  // One optimizer step's forwards and backwards over accum micro-batches
  // (fetch(a, inputs, targets) fills micro-batch a of this rank), with the
  // gradients reduced over data parallelism. Returns the mean loss, the same
  // on every rank.
  double forward_backward(const MicroBatchFetch& fetch);
  // The global gradient norm (collective; the same on every rank).
  double grad_norm();
  // Clips by clip_coef, applies AdamW update number opt_step, then the MoE
  // bias update (aux-loss-free balancing).
  void apply_update(double lr, int64_t opt_step, double clip_coef);
  // Mean loss of one evaluation batch (host (B, T) tokens; targets < 0
  // ignored), the same on every rank.
  double eval_loss(const int32_t* inputs, const int32_t* targets);

  // A new expert placement (parallel.expert_placement) for the same ep
  // group, in memory without a new engine: every expert's weights (and
  // master copy) and AdamW moments go from its old owner to its new one in
  // one all-to-all per buffer, then the model's table and MoE layers follow.
  // Replicas are dropped (set them after). Collective over the world's ep
  // groups. Not with gradient compression's error feedback (its buckets'
  // residuals would belong to other experts): the caller switches instead.
  void move_experts(const std::vector<int64_t>& owner);
  // MoE expert replicas (parallel.expert_replicas' text, "" none) for this
  // layout's placement, within parallel.expert_slots; set and synced in
  // memory (collective over ep). Throws ConfigError naming the key.
  void set_expert_replicas(const std::string& text);
  Model& model() { return *model_; }
  Backend& backend() { return be_; }
  const RunConfig& config() const { return cfg_; }  // with the engine's layout and replicas
  // n elements of device memory for short use between steps (the pipeline
  // link probe, parallel/measure/pipeline_times.hpp); kept and grown, contents undefined.
  Tensor scratch_tensor(int64_t n, DType dt);
  ShardedAdamW& optimizer() { return *opt_; }
  GradReducer& reducer() { return *reducer_; }
  // ZeRO-2/3's store (parallel/dp/zero_store.hpp); nullptr at ZeRO 0 and 1.
  ZeroStore* zero_store() { return store_.get(); }
  PipelineExecutor* pipeline() { return pipe_.get(); }
  bool pipelined() const { return pipe_ != nullptr; }
  const ParallelContext& groups() const { return ctx_; }
  const Layout& layout() const { return layout_; }
  const StepTimes& last_times() const { return times_; }
  // This rank's place, for the checkpoint files.
  ShardLayout shard_layout() const;
  // The checkpoint's tensors: weights and AdamW state (only this rank's chunk
  // under ZeRO-1, with lay.state_lo/hi set), written into st's vectors (their
  // memory reused when big enough). Local: no communication.
  void fill_checkpoint(CheckpointState& st, ShardLayout& lay);
  // Restores weights and AdamW state from a loaded checkpoint.
  void restore_checkpoint(CheckpointState& st);
  // This rank's compute slowdown hook (an inactive one without emulation):
  // also the emulation's clock (virtual_clock(), now()) for what controllers time.
  const emulate::ComputeSlowdown& slowdown() const { return *slow_; }

 private:
  double run_micro_batches(const MicroBatchFetch& fetch);
  double run_pipeline_step(const MicroBatchFetch& fetch);
  void measure_bubble();  // times_.bubble and bubble_idle, over the pipeline group
  // The step's data-parallel reduction completed (the buckets, ZeRO-2/3's
  // store), its waits in times_.
  void finish_dp_grads();
  void finish_zero_grads();  // ZeRO-2/3: the store's reduce-scatters done, its times in times_

  RunConfig cfg_;  // with the engine's layout
  Buffer scratch_;  // scratch_tensor's
  ParallelContext ctx_;
  Layout layout_;
  SelfComm self_tp_{"tp"}, self_dp_{"dp"}, self_pp_{"pp"}, self_ep_{"ep"}, self_edp_{"edp"},
      self_world_{"world"}, self_cp_{"cp"}, self_dpcp_{"dpcp"};
  std::unique_ptr<ContextAttention> context_;  // parallel.cp > 1: the ring (before model_)
  Backend& be_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ZeroStore> store_;  // ZeRO-2/3: the model's gradients (and weights) by unit
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::unique_ptr<PipelineExecutor> pipe_;
  bool overlap_ = true;  // parallel.overlap false: every reduction starts after the backward
  emulate::ComputeSlowdown* slow_ = nullptr;  // ctx.slowdown, or an inactive one
  StepTimes times_;
  std::vector<int32_t> in_, tg_;
  std::vector<int32_t> in_local_, tg_local_;  // parallel.cp > 1: this rank's chunks of them
  // The tokens of a micro-batch this rank's model takes: all, or its cp chunks.
  std::pair<const int32_t*, const int32_t*> local_batch(const int32_t* in, const int32_t* tg);
};

}  // namespace adgt
