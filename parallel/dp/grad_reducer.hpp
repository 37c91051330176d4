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
//
// Gradient compression (parallel/compress/, docs/compression.md): each bucket
// has a level. Level off is the collective above, unchanged. A compressed
// bucket is queued at its start and reduced synchronously in
// finish_grad_sync, batched: the compressed buckets of one group and level go
// through one collective per stage (compress::reduce_buckets: one
// all_to_allv + one all-gather, or PowerSGD's P and Q all-reduces), in the
// order of their first bucket on every rank, bit for bit what one reduce per
// bucket gives; error feedback is kept per bucket.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/model/model.hpp"
#include "kernels/backend.hpp"
#include "kernels/clock.hpp"
#include "parallel/compress/bucket_reduce.hpp"
#include "parallel/dp/bucket_norms.hpp"
#include "parallel/dp/grad_buckets.hpp"

namespace adgt {

// Per-bucket state that outlives a step.
class SiteComm;

struct BucketState {
  compress::Level level = compress::Level::None;  // None: the reduce of an uncompressed run
  compress::BucketCodecState codec;  // error feedback and PowerSGD's Q; empty until a codec uses it
  // A group reduced hierarchically over sites (parallel/comm/site_comm.hpp):
  // a quantized level compresses only the cross-site exchange of this rank's
  // shard, whose error feedback is kept here (docs/sites.md).
  compress::BucketCodecState wan;
};

// What the compressed buckets of the last step did, for the step line.
struct CompressionReport {
  int64_t buckets[compress::kLevels] = {};  // buckets per level (of those reduced)
  int64_t fp32_bytes = 0;  // bytes the fp32 ring would have sent for the compressed buckets
  int64_t sent_bytes = 0;  // bytes they did send (their groups' stats)
  double seconds = 0;      // wall time inside the compressed buckets' (synchronous) reduces
};

class GradReducer {
 public:
  // `dp`: the data-parallel group. `edp`: with expert parallelism, the
  // expert-data-parallel group that reduces expert weights (nullptr: none).
  // `zero`: ZeRO-1 (a reduce-scatter: rank d keeps chunk d of the buffer).
  GradReducer(Model& model, Comm& dp, Comm* edp, bool zero, double bucket_mb);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  BucketState& state(int bucket_id) { return state_[size_t(bucket_id)]; }
  const BucketState& state(int bucket_id) const { return state_[size_t(bucket_id)]; }
  const Comm& dp_group() const { return dp_; }
  const Comm* edp_group() const { return edp_; }  // nullptr: no expert data parallelism
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
  // Seconds finish_grad_sync waited in its last call for the uncompressed
  // buckets: the reduction time the step did not hide behind compute (the
  // compressed buckets' reduce is last_compression().seconds).
  double last_wait_seconds() const { return wait_s_; }
  // The clock the reduce is timed on (last_wait_seconds, the compressed
  // reduces' seconds): the wall clock, or the emulation's virtual clock
  // (the Engine sets it from its ComputeSlowdown), so these times and the
  // step's are in the same units.
  void set_clock(std::function<double()> now) { now_ = std::move(now); }
  // The groups with started collectives (for a progress thread).
  std::vector<Comm*> comms() const;
  // The group the dense buckets reduce over (dp x cp; a SiteComm when it
  // spans sites and parallel.site_reduce is hierarchical).
  Comm& data_group() const { return dp_; }

  // --- Gradient compression (docs/compression.md) ---
  // Every bucket's level becomes s.level, with s's codec settings. `be`: the
  // gradients' backend (a device backend's buckets are staged through host
  // memory). Needs fp32 gradients for a level other than off.
  void set_compression(const compress::Settings& s, Backend& be);
  // The controller's interface: bucket `bucket_id`'s level from its next
  // start on. Every rank of the bucket's group must make the same calls
  // between the same steps (decide on one rank, broadcast). Setting off keeps
  // the bucket's error-feedback residuals and adds them into its next
  // gradient once (no mass is lost); PowerSGD's Q is dropped.
  void set_level(int bucket_id, compress::Level l);
  compress::Level level(int bucket_id) const { return state_[size_t(bucket_id)].level; }
  const compress::Settings& compression() const { return settings_; }
  // The last finished step's compressed buckets.
  const CompressionReport& last_compression() const { return report_; }
  // The levels over the buckets: "int8" when all agree, else "int8:12,off:2".
  std::string level_mix() const;
  // Whether any bucket holds error-feedback residuals or PowerSGD's Q (its
  // checkpoint form: parallel/dp/compression_state.hpp), and dropping them.
  bool has_compression_state() const;
  void clear_compression_state();
  // A tracker of the buckets' squared norms before and after their reduce
  // (bucket_norms.hpp; one pass over each bucket each; nullptr: none, the
  // default). Shared: the tracker's owner reads it between steps.
  void set_norm_tracker(std::shared_ptr<BucketNormTracker> t) { norms_ = std::move(t); }

 private:
  void start(size_t i);
  // Reduces the queued compressed buckets, batched per group and level.
  void reduce_compressed();
  // The quantized buckets `ids` of a group reduced over sites: exact inside
  // each site, compressed (level l) across (docs/sites.md).
  void reduce_over_sites(SiteComm& sc, compress::Level l, const std::vector<size_t>& ids);
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
  std::vector<size_t> queued_;    // compressed buckets started this step, in start order
  std::vector<std::vector<float>> staged_;  // per bucket: a device bucket's host copy while queued
  double wait_s_ = 0;
  std::function<double()> now_ = [] { return wall_seconds(); };
  compress::Settings settings_;
  Backend* be_ = nullptr;         // set_compression's: stages device gradients
  std::vector<ParamSpec> table_;  // the model's table (compressible tensors, PowerSGD shapes)
  CompressionReport step_report_, report_;  // this step's so far, the last finished one's
  std::shared_ptr<BucketNormTracker> norms_;
};

}  // namespace adgt
