// AdamW over this rank's part of the flat parameter buffer. Without ZeRO the
// part is the whole buffer; with ZeRO-1 (`shards`: the data-parallel group)
// it is chunk dp_rank of dp equal chunks, and after the update the master
// chunks are all-gathered (fp32, so every rank's master stays whole for
// checkpoints) and the compute copy refreshed from them. Gradients are the
// reduced ones of GradReducer (whose lo/hi are the same chunk).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/model/model.hpp"
#include "core/optimizer.hpp"
#include "parallel/dp/zero_store.hpp"

namespace adgt {

class ShardedAdamW {
 public:
  // shards: the ZeRO-1 group (nullptr or a group of one: no sharding).
  ShardedAdamW(Backend& be, Model& model, const TrainConfig& t, Comm* shards);
  // ZeRO-2/3: AdamW over the store's shard (its master, gradient and, in
  // mixed precision, compute shards); after each update the store publishes
  // the new weights (ZeroStore::after_update).
  ShardedAdamW(Backend& be, Model& model, const TrainConfig& t, ZeroStore& store);

  // Applies one AdamW update (`adam_step`: 1-based count of updates) to this
  // rank's part with its gradients clipped by `clip_coef` (< 1 scales; applied
  // as AdamW reads them, the gradient buffer itself is left unscaled).
  void step(double lr, int64_t adam_step, double clip_coef);

  // ZeRO-1: this rank's moments are the flat range [lo, hi).
  bool sharded() const { return shards_ != nullptr; }
  ZeroStore* zero_store() const { return store_; }  // ZeRO-2/3, else nullptr
  int64_t lo() const { return opt_->lo(); }
  int64_t hi() const { return opt_->hi(); }
  AdamW& adamw() { return *opt_; }
  // AdamW state of the whole local flat buffer on the host (gathered over the
  // shards: collective under ZeRO-1).
  std::vector<float> full_exp_avg();
  std::vector<float> full_exp_avg_sq();
  // The same into `out` (resized; its memory reused: a checkpoint's staging buffer).
  void full_exp_avg(std::vector<float>& out);
  void full_exp_avg_sq(std::vector<float>& out);
  // Restores AdamW state from whole-local-buffer host vectors (this rank's part).
  void load_state(const std::vector<float>& m, const std::vector<float>& v);

 private:
  std::vector<float> gather_state(const Tensor& t);
  void gather_state(const Tensor& t, std::vector<float>& out);

  Backend& be_;
  Model& model_;
  Comm* shards_;
  ZeroStore* store_ = nullptr;
  std::unique_ptr<AdamW> opt_;
};

}  // namespace adgt
