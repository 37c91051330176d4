#include "parallel/dp/sharded_adamw.hpp"

#include <algorithm>

#include "kernels/check.hpp"

namespace adgt {

namespace {
Tensor flat_range(Tensor f, int64_t b, int64_t e) {
  return Tensor(static_cast<char*>(f.data) + size_t(b) * dtype_size(f.dtype), f.dtype, {e - b});
}
}  // namespace

ShardedAdamW::ShardedAdamW(Backend& be, Model& model, const TrainConfig& t, Comm* shards)
    : be_(be), model_(model), shards_(shards && shards->size() > 1 ? shards : nullptr) {
  const int64_t n = model.flat_size();
  int64_t lo = 0, hi = n;
  if (shards_) {
    ADGT_CHECK(n % shards_->size() == 0, "ZeRO-1: flat buffer " << n << " not divisible by dp="
                                                                 << shards_->size());
    lo = shards_->rank() * (n / shards_->size());
    hi = lo + n / shards_->size();
  }
  opt_ = std::make_unique<AdamW>(be, model.table(), t, model.master_dtype(), lo, hi);
}

ShardedAdamW::ShardedAdamW(Backend& be, Model& model, const TrainConfig& t, ZeroStore& store)
    : be_(be), model_(model), shards_(nullptr), store_(&store) {
  opt_ = std::make_unique<AdamW>(be, store.shards().table, t, model.master_dtype(), 0,
                                 std::max<int64_t>(store.shards().shard_size, 1));
}

void ShardedAdamW::step(double lr, int64_t adam_step, double clip_coef) {
  // The clipping coefficient is applied as AdamW reads each gradient (a
  // separate scale pass read and wrote every gradient once more: 54 GB a
  // step for a 7B model on one GPU, ~3% of its step).
  const double gs = clip_coef < 1.0 ? clip_coef : 1.0;
  if (store_) {
    opt_->step(store_->master_shard(), store_->grad_shard(), lr, adam_step, store_->compute_shard(), gs);
    store_->after_update();
    return;
  }
  // Mixed precision: AdamW updates the fp32 master weights and writes their
  // bf16 copy in the same pass; under ZeRO the master chunks are gathered and
  // the compute copy is refreshed from them.
  if (!shards_) {
    opt_->step(model_.master(), model_.grads(), lr, adam_step,
               model_.mixed() ? model_.params() : Tensor(), gs);
    return;
  }
  opt_->step(model_.master(), model_.grads(), lr, adam_step, Tensor(), gs);
  // In place: this rank's chunk of the master buffer is the all-gather's input.
  shards_->all_gather(model_.master(), flat_range(model_.master(), lo(), hi()));
  model_.sync_params();
}

std::vector<float> ShardedAdamW::gather_state(const Tensor& t) {
  std::vector<float> out;
  gather_state(t, out);
  return out;
}

void ShardedAdamW::gather_state(const Tensor& t, std::vector<float>& out) {
  if (store_) return store_->shard_to_flat_host(t, out);
  if (!shards_) return opt_->to_host(t, out);
  Buffer full(be_, size_t(model_.flat_size()) * dtype_size(model_.master_dtype()));
  Tensor f(full.data(), model_.master_dtype(), {model_.flat_size()});
  shards_->all_gather(f, t);
  opt_->to_host(f, out);
}

std::vector<float> ShardedAdamW::full_exp_avg() { return gather_state(opt_->exp_avg()); }
std::vector<float> ShardedAdamW::full_exp_avg_sq() { return gather_state(opt_->exp_avg_sq()); }
void ShardedAdamW::full_exp_avg(std::vector<float>& out) { gather_state(opt_->exp_avg(), out); }
void ShardedAdamW::full_exp_avg_sq(std::vector<float>& out) { gather_state(opt_->exp_avg_sq(), out); }

void ShardedAdamW::load_state(const std::vector<float>& m, const std::vector<float>& v) {
  ADGT_CHECK(int64_t(m.size()) == model_.flat_size() && int64_t(v.size()) == model_.flat_size(),
             "ShardedAdamW::load_state: " << m.size() << " and " << v.size()
                                          << " values for a flat buffer of " << model_.flat_size());
  if (store_) {
    store_->flat_host_to_shard(m.data(), m.size(), opt_->exp_avg());
    store_->flat_host_to_shard(v.data(), v.size(), opt_->exp_avg_sq());
    return;
  }
  opt_->from_host(opt_->exp_avg(), std::vector<float>(m.begin() + lo(), m.begin() + hi()));
  opt_->from_host(opt_->exp_avg_sq(), std::vector<float>(v.begin() + lo(), v.begin() + hi()));
}

}  // namespace adgt
