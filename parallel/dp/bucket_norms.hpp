// Squared gradient norms per gradient bucket, before and after the
// data-parallel reduce, summed over steps: the inputs of the compression
// controller's noise-scale and critical-regime signals
// (control/compress_controller.cpp, docs/compression.md). The reducer
// (grad_reducer.hpp) feeds a tracker it is given; measuring is this file's
// job, reducing the reducer's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"

namespace adgt {

struct BucketNormStats {
  std::vector<double> local_sq;    // this rank's gradient before the reduce (its pre-scaled share)
  std::vector<double> reduced_sq;  // after the reduce; all-reduce buckets / group size (so a
                                   // sum over the group counts the bucket once); -1: not measured
                                   // (ZeRO-1 reduce-scatter buckets)
  int64_t steps = 0;
};

class BucketNormTracker {
 public:
  // `be`: the gradients' backend. Host gradients only: on a device each sum
  // of squares would be a host read per bucket and step, so nothing is
  // measured there (measuring() is false).
  BucketNormTracker(Backend& be, size_t buckets);
  bool measuring() const { return be_.is_host(); }
  // Bucket i's final gradient, before its reduce starts.
  void before_reduce(size_t i, const Tensor& grads);
  // After the step's reduce: bucket i's reduced gradient, summed over a group
  // of `group_size` ranks (all-reduce buckets), or not measured (reduce-scatter).
  void after_reduce(size_t i, const Tensor& grads, int group_size, bool all_reduce);
  void end_step() { ++stats_.steps; }
  const BucketNormStats& stats() const { return stats_; }
  void reset();

 private:
  Backend& be_;
  BucketNormStats stats_;
};

}  // namespace adgt
