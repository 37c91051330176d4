// The data-parallel gradient reduction: one code path for the bucketed
// all-reduce, ZeRO-1's reduce-scatter and the expert-data-parallel reduction
// (grad_buckets.hpp plans the buckets). A bucket's collective starts, as an
// asynchronous Comm Work, as soon as every gradient in it is final:
//  - in a step without pipeline parallelism, from the last micro-batch's
//    backward (ready_hook(): the model reports each unit as it completes);
//  - in a pipeline step, at the schedule's ReduceGrads(chunk) instruction
//    (chunk_ready()), so the reduction overlaps the rest of the rank's work.
// finish_grad_sync() waits for every bucket (Megatron-Core's
// start_grad_sync / finish_grad_sync). Sums are in the gradient dtype (fp32),
// in the transport's deterministic order; the loss is pre-scaled by
// 1/(accum * dp), so the sums are the mean gradients.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm.hpp"
#include "core/model/model.hpp"
#include "kernels/backend.hpp"
#include "parallel/dp/grad_buckets.hpp"

namespace adgt {

// Per-bucket state that outlives a step (gradient compression keeps its level
// and error-feedback residual here; empty until a codec uses it).
struct BucketState {
  int level = 0;      // 0: no compression (the reduce dtype of today)
  Buffer residual;    // error feedback, (end - begin) elements when used
};

class GradReducer {
 public:
  // `dp`: the data-parallel group. `edp`: with expert parallelism, the
  // expert-data-parallel group that reduces expert weights (nullptr: none).
  // `zero`: ZeRO-1 (a reduce-scatter: rank d keeps chunk d of the buffer).
  GradReducer(Model& model, Comm& dp, Comm* edp, bool zero, double bucket_mb);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  BucketState& state(int bucket_id) { return state_[size_t(bucket_id)]; }
  // This rank's part of the gradient buffer once reduced: its ZeRO-1 chunk,
  // else the whole buffer.
  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  bool zero() const { return zero_; }

  // For Model::backward on a step's last micro-batch; empty when nothing is reduced.
  std::function<void(int64_t, int64_t)> ready_hook();
  // The gradients of [begin, end) (one gradient unit) are final.
  void unit_ready(int64_t begin, int64_t end);
  // Every gradient of model chunk `chunk` is final.
  void chunk_ready(int chunk);
  // Starts every bucket not yet started (all gradients are final).
  void start_grad_sync();
  // Waits for every bucket and readies the next step. Under ZeRO-1 the
  // reduced chunk is then in grads()[lo, hi).
  void finish_grad_sync();
  // Moves the started collectives along (between pipeline instructions).
  void progress();
  // Seconds finish_grad_sync waited in its last call: the reduction time the
  // step did not hide behind compute.
  double last_wait_seconds() const { return wait_s_; }
  // The groups with started collectives (for a progress thread).
  std::vector<Comm*> comms() const;

 private:
  void start(size_t i);
  void reset();
  Comm& group(const GradBucket& b) const { return b.group == BucketGroup::DataParallel ? dp_ : *edp_; }

  Model& model_;
  Comm& dp_;
  Comm* edp_;
  bool zero_;
  int64_t lo_ = 0, hi_ = 0;
  std::vector<GradUnit> units_;
  std::vector<GradBucket> buckets_;
  std::vector<BucketState> state_;
  std::vector<int64_t> missing_;  // per bucket: elements not final yet this step
  std::vector<char> unit_done_;   // per unit, this step
  std::vector<Work> work_;        // per bucket
  std::vector<char> started_;     // per bucket, this step
  double wait_s_ = 0;
};

}  // namespace adgt
