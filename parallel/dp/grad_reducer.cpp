#include "parallel/dp/grad_reducer.hpp"

#include <algorithm>
#include <chrono>

#include "kernels/check.hpp"

namespace adgt {

namespace {
Tensor flat_range(Tensor f, int64_t b, int64_t e) {
  return Tensor(static_cast<char*>(f.data) + size_t(b) * dtype_size(f.dtype), f.dtype, {e - b});
}
}  // namespace

GradReducer::GradReducer(Model& model, Comm& dp, Comm* edp, bool zero, double bucket_mb)
    : model_(model), dp_(dp), edp_(edp), zero_(zero && dp.size() > 1) {
  const int64_t n = model.flat_size();
  if (zero_) {
    ADGT_CHECK(n % dp.size() == 0, "ZeRO-1: flat buffer " << n << " not divisible by dp="
                                                           << dp.size());
    lo_ = dp.rank() * (n / dp.size());
    hi_ = lo_ + n / dp.size();
  } else {
    lo_ = 0;
    hi_ = n;
  }
  units_ = model.grad_units();
  BucketPlanInput in;
  in.units = units_;
  in.table = model.table();
  in.flat_size = n;
  in.bucket_elems = std::max<int64_t>(
      1024, int64_t(bucket_mb * 1024 * 1024) / int64_t(dtype_size(model.master_dtype())));
  in.zero = zero_;
  in.expert_groups = edp_ != nullptr;
  in.reduce_dp = dp.size() > 1;
  in.reduce_edp = edp_ && edp_->size() > 1;
  buckets_ = plan_grad_buckets(in);
  state_.resize(buckets_.size());
  work_.resize(buckets_.size());
  reset();
}

void GradReducer::reset() {
  missing_.resize(buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) missing_[i] = buckets_[i].need;
  started_.assign(buckets_.size(), 0);
  unit_done_.assign(units_.size(), 0);
}

std::function<void(int64_t, int64_t)> GradReducer::ready_hook() {
  if (buckets_.empty()) return {};
  return [this](int64_t b, int64_t e) { unit_ready(b, e); };
}

void GradReducer::unit_ready(int64_t b, int64_t e) {
  auto it = std::find_if(units_.begin(), units_.end(),
                         [&](const GradUnit& u) { return u.begin == b && u.end == e; });
  ADGT_CHECK(it != units_.end(), "GradReducer: [" << b << ", " << e << ") is no gradient unit");
  const size_t k = size_t(it - units_.begin());
  if (unit_done_[k]) return;
  unit_done_[k] = 1;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& bk = buckets_[i];
    if (bk.chunk >= 0 && bk.chunk != it->chunk) continue;
    const int64_t over = std::min(bk.end, e) - std::max(bk.begin, b);
    if (over <= 0) continue;
    missing_[i] -= over;
    if (missing_[i] == 0) start(i);
  }
  progress();
}

void GradReducer::chunk_ready(int chunk) {
  for (const GradUnit& u : units_)
    if (u.chunk == chunk) unit_ready(u.begin, u.end);
}

void GradReducer::start(size_t i) {
  if (started_[i]) return;
  started_[i] = 1;
  const GradBucket& b = buckets_[i];
  Tensor g = model_.grads();
  if (b.op == BucketOp::AllReduce) {
    work_[i] = group(b).start_all_reduce(flat_range(g, b.begin, b.end));
  } else {
    // In place: this rank's chunk of the buffer receives its sum.
    work_[i] = group(b).start_reduce_scatter(flat_range(g, lo_, hi_), flat_range(g, b.begin, b.end));
  }
}

void GradReducer::start_grad_sync() {
  for (size_t i = 0; i < buckets_.size(); ++i) start(i);
}

void GradReducer::progress() {
  // One pass per group moves every started bucket of it (a Work's test would
  // repeat that pass for each bucket).
  for (Comm* c : comms()) c->progress();
}

void GradReducer::finish_grad_sync() {
  const auto t0 = std::chrono::steady_clock::now();
  start_grad_sync();
  for (Work& w : work_) w.wait();
  wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  reset();
}

std::vector<Comm*> GradReducer::comms() const {
  std::vector<Comm*> c;
  if (dp_.size() > 1) c.push_back(&dp_);
  if (edp_ && edp_->size() > 1 && edp_ != &dp_) c.push_back(edp_);
  return c;
}

}  // namespace adgt
