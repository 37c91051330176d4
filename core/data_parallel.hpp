// The optimizer step over the data-parallel group: gradients all-reduced in
// buckets as the backward completes them (parallel.zero: 0), or reduce-scattered
// so that each rank updates its own chunk of the weights and AdamW state and
// the weights are all-gathered back (ZeRO-1, parallel.zero: 1). Reductions are
// sums in the gradient dtype (fp32); the loss is pre-scaled by 1/(accum * dp).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"

namespace adgt {

class DataParallel {
 public:
  // `pp`: the pipeline group (stages hold disjoint parameters; the gradient
  // norm sums over it); nullptr without pipeline parallelism.
  // `ep` / `edp` (mixture of experts with expert parallelism): expert weights
  // differ across the ep group, so their gradients are reduced over the
  // expert-data-parallel group `edp` instead of dp, and their squares summed
  // over ep in the gradient norm. nullptr: no expert parallelism.
  DataParallel(Backend& be, Model& model, const TrainConfig& t, const ParallelConfig& p, Comm& dp,
               Comm& tp, Comm* pp = nullptr, Comm* ep = nullptr, Comm* edp = nullptr);

  // For Model::backward on the last micro-batch of a step (nullptr-equivalent
  // when there is nothing to overlap).
  std::function<void(int64_t, int64_t)> bucket_hook();
  // Completes the gradient reduction (remaining buckets, or the ZeRO reduce-scatter).
  void finish_gradients();
  // The whole reduction at once, when no bucket_hook ran (pipeline steps):
  // all-reduce in bucket-sized pieces, or the ZeRO reduce-scatter.
  void reduce_gradients();
  // Global gradient norm over every rank's shard (replicated tensors counted once).
  double grad_norm();
  // Clips by `coef` and applies AdamW to this rank's part, then (ZeRO) all-gathers weights.
  void step(double lr, int64_t adam_step, double clip_coef);

  AdamW& optimizer() { return *opt_; }
  bool zero() const { return zero_; }
  // AdamW state of the whole local flat buffer on the host (gathered over dp under ZeRO).
  std::vector<float> full_exp_avg();
  std::vector<float> full_exp_avg_sq();
  // Restores AdamW state from whole-local-buffer host vectors (taking this rank's chunk).
  void load_state(const std::vector<float>& m, const std::vector<float>& v);

 private:
  void flush_bucket();
  std::vector<float> gather_state(const Tensor& t);
  Tensor range(Tensor flat, int64_t b, int64_t e) const;

  Backend& be_;
  Model& model_;
  Comm& dp_;
  Comm& tp_;
  Comm* pp_;
  Comm* ep_;
  Comm* edp_;
  bool zero_;
  // With expert parallelism: maximal flat ranges [begin, end) and whether they hold expert weights.
  struct Run { int64_t begin, end; bool expert; };
  std::vector<Run> runs_;
  int64_t bucket_elems_;
  int64_t lo_, hi_;           // this rank's chunk of the flat buffer (whole buffer without ZeRO)
  int64_t pend_b_ = -1, pend_e_ = -1;
  std::unique_ptr<AdamW> opt_;
  Buffer chunk_;              // ZeRO: (hi - lo) scratch for reduce-scatter / all-gather
};

}  // namespace adgt
