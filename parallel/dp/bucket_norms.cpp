// Per-bucket squared gradient norms (bucket_norms.hpp).
#include "parallel/dp/bucket_norms.hpp"

namespace adgt {

BucketNormTracker::BucketNormTracker(Backend& be, size_t buckets) : be_(be) {
  stats_.local_sq.assign(buckets, 0.0);
  stats_.reduced_sq.assign(buckets, 0.0);
}

void BucketNormTracker::before_reduce(size_t i, const Tensor& grads) {
  if (measuring()) stats_.local_sq[i] += be_.sum_squares(grads);
}

void BucketNormTracker::after_reduce(size_t i, const Tensor& grads, int group_size, bool all_reduce) {
  if (!measuring()) return;
  if (!all_reduce) {
    stats_.reduced_sq[i] = -1;
    return;
  }
  stats_.reduced_sq[i] += be_.sum_squares(grads) / group_size;
}

void BucketNormTracker::reset() {
  stats_.local_sq.assign(stats_.local_sq.size(), 0.0);
  stats_.reduced_sq.assign(stats_.reduced_sq.size(), 0.0);
  stats_.steps = 0;
}

}  // namespace adgt
