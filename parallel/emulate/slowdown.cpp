// The compute slowdown hook (slowdown.hpp; docs/emulation.md).
#include "parallel/emulate/slowdown.hpp"

#include <algorithm>

#include "kernels/check.hpp"
#include "parallel/emulate/clock.hpp"

namespace adgt::emulate {

ComputeSlowdown::ComputeSlowdown(double factor, std::shared_ptr<EmulatedRank> rank, Backend* be)
    : factor_(factor), rank_(std::move(rank)), be_(be) {
  ADGT_CHECK(factor >= 1, "compute slowdown: factor " << factor << " < 1");
}

double ComputeSlowdown::now() const { return rank_ ? rank_->clock.now() : wall_seconds(); }

bool ComputeSlowdown::virtual_clock() const { return rank_ && rank_->clock.is_virtual(); }

bool ComputeSlowdown::model_clock() const {
  return rank_ && rank_->clock.kind() == ClockKind::Model;
}

double ComputeSlowdown::compute_now() const {
  return rank_ ? rank_->clock.compute_now() : thread_cpu_seconds();
}

void ComputeSlowdown::begin() {
  if (!active()) return;
  t0_ = now();
  comm0_ = comm_seconds();
}

void ComputeSlowdown::catch_up() {
  if (!active()) return;
  if (be_) be_->synchronize();
  const double t = now();
  const double compute = std::max(0.0, (t - t0_) - (comm_seconds() - comm0_));
  const double extra = (factor_ - 1) * compute;
  if (rank_)
    rank_->clock.wait_until(t + extra);  // virtual: the slow device's time, no sleep
  else
    sleep_until(t + extra);
  slept_ += extra;
  begin();
}

std::function<void(int64_t, int64_t)> ComputeSlowdown::wrap(
    std::function<void(int64_t, int64_t)> hook) {
  if (!hook || !active()) return hook;
  return [this, hook = std::move(hook)](int64_t b, int64_t e) {
    catch_up();
    hook(b, e);
  };
}

}  // namespace adgt::emulate
