#include "core/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/check.hpp"

namespace adgt {

DataParallel::DataParallel(Backend& be, Model& model, const TrainConfig& t,
                           const ParallelConfig& p, Comm& dp, Comm& tp, Comm* pp, Comm* ep,
                           Comm* edp)
    : be_(be), model_(model), dp_(dp), tp_(tp), pp_(pp),
      ep_(ep && ep->size() > 1 ? ep : nullptr), edp_(ep_ ? edp : nullptr), zero_(p.zero == 1 && dp.size() > 1) {
  bucket_elems_ = std::max<int64_t>(
      1024, int64_t(p.bucket_mb * 1024 * 1024) / int64_t(dtype_size(model.master_dtype())));
  const int64_t n = model.flat_size();
  if (zero_) {
    ADGT_CHECK(n % dp.size() == 0, "ZeRO-1: flat buffer " << n << " not divisible by dp="
                                                           << dp.size());
    const int64_t chunk = n / dp.size();
    lo_ = dp.rank() * chunk;
    hi_ = lo_ + chunk;
    chunk_ = Buffer(be, size_t(chunk) * dtype_size(model.master_dtype()));
  } else {
    lo_ = 0;
    hi_ = n;
  }
  opt_ = std::make_unique<AdamW>(be, model.table(), t, model.master_dtype(), lo_, hi_);
  if (ep_) {
    ADGT_CHECK(!zero_, "DataParallel: ZeRO-1 with expert parallelism is not supported");
    ADGT_CHECK(edp_, "DataParallel: expert parallelism needs the expert-data-parallel group");
    const auto& tab = model.table();
    for (size_t i = 0; i < tab.size(); ++i) {
      const bool ex = tab[i].expert >= 0;
      const int64_t b = tab[i].offset,
                    e = i + 1 < tab.size() ? tab[i + 1].offset : model.flat_size();
      if (!runs_.empty() && runs_.back().expert == ex)
        runs_.back().end = e;
      else
        runs_.push_back({b, e, ex});
    }
  }
}

Tensor DataParallel::range(Tensor f, int64_t b, int64_t e) const {
  return Tensor(static_cast<char*>(f.data) + size_t(b) * dtype_size(f.dtype), f.dtype, {e - b});
}

std::function<void(int64_t, int64_t)> DataParallel::bucket_hook() {
  if (zero_ || dp_.size() == 1 || ep_) return {};
  return [this](int64_t b, int64_t e) {
    // Ranges arrive from the end of the buffer towards the start; merge the
    // contiguous ones and reduce a bucket once it is large enough.
    if (pend_b_ >= 0 && e == pend_b_) {
      pend_b_ = b;
    } else {
      flush_bucket();
      pend_b_ = b;
      pend_e_ = e;
    }
    if (pend_e_ - pend_b_ >= bucket_elems_) flush_bucket();
  };
}

void DataParallel::flush_bucket() {
  if (pend_b_ < 0) return;
  dp_.all_reduce(range(model_.grads(), pend_b_, pend_e_));
  pend_b_ = pend_e_ = -1;
}

void DataParallel::finish_gradients() {
  if (dp_.size() == 1) return;
  if (ep_) {
    reduce_gradients();
    return;
  }
  if (!zero_) {
    flush_bucket();
    return;
  }
  Tensor chunk(chunk_.data(), model_.master_dtype(), {hi_ - lo_});
  dp_.reduce_scatter(chunk, model_.grads());
  be_.copy(range(model_.grads(), lo_, hi_), chunk);
}

void DataParallel::reduce_gradients() {
  if (dp_.size() == 1) return;
  if (ep_) {  // expert weights over their replicas (edp), the rest over dp
    for (const Run& r : runs_) {
      Comm& c = r.expert ? *edp_ : dp_;
      if (c.size() == 1) continue;
      for (int64_t b = r.begin; b < r.end; b += bucket_elems_)
        c.all_reduce(range(model_.grads(), b, std::min(r.end, b + bucket_elems_)));
    }
    return;
  }
  if (!zero_) {
    for (int64_t b = 0; b < model_.flat_size(); b += bucket_elems_)
      dp_.all_reduce(range(model_.grads(), b, std::min(model_.flat_size(), b + bucket_elems_)));
    return;
  }
  finish_gradients();
}

double DataParallel::grad_norm() {
  // [sum over tensor-parallel shards, sum over replicated tensors, expert
  // weights (tp shards of this ep rank's experts)] of this rank's part.
  double s[3] = {0, 0, 0};
  for (const Segment& seg : segments_in(model_.table(), lo_, hi_)) {
    const ParamSpec& p = model_.table()[seg.param];
    const int slot = ep_ && p.expert >= 0 ? 2 : p.shard_dim < 0 ? 1 : 0;
    s[slot] += be_.sum_squares(range(model_.grads(), seg.begin, seg.end));
  }
  Tensor t(s, DType::F64, {2});
  if (zero_) dp_.all_reduce(t);      // chunks -> whole buffer
  if (ep_) {                         // experts: shards over tp, distinct experts over ep
    tp_.all_reduce(Tensor(s + 2, DType::F64, {1}));
    ep_->all_reduce(Tensor(s + 2, DType::F64, {1}));
    s[1] += s[2];
  }
  Tensor sharded(s, DType::F64, {1});
  tp_.all_reduce(sharded);           // shards -> whole tensors; replicated counted once
  if (pp_ && pp_->size() > 1) {      // stages -> the whole model
    double total[1] = {s[0] + s[1]};
    pp_->all_reduce(Tensor(total, DType::F64, {1}));
    return std::sqrt(total[0]);
  }
  return std::sqrt(s[0] + s[1]);
}

void DataParallel::step(double lr, int64_t adam_step, double clip_coef) {
  Tensor g = range(model_.grads(), lo_, hi_);
  if (clip_coef < 1.0) be_.scale_inplace(g, clip_coef);
  // Mixed precision: AdamW updates the fp32 master weights and writes their
  // bf16 copy in the same pass; under ZeRO the updated master chunks are
  // gathered (fp32, so every rank's master stays whole for checkpoints) and
  // the compute copy is refreshed from them.
  if (!zero_) {
    opt_->step(model_.master(), model_.grads(), lr, adam_step,
               model_.mixed() ? model_.params() : Tensor());
    return;
  }
  opt_->step(model_.master(), model_.grads(), lr, adam_step);
  Tensor chunk(chunk_.data(), model_.master_dtype(), {hi_ - lo_});
  be_.copy(chunk, range(model_.master(), lo_, hi_));
  dp_.all_gather(model_.master(), chunk);
  model_.sync_params();
}

std::vector<float> DataParallel::gather_state(const Tensor& t) {
  if (!zero_) return opt_->to_host(t);
  Buffer full(be_, size_t(model_.flat_size()) * dtype_size(model_.master_dtype()));
  Tensor f(full.data(), model_.master_dtype(), {model_.flat_size()});
  dp_.all_gather(f, t);
  return opt_->to_host(f);
}

std::vector<float> DataParallel::full_exp_avg() { return gather_state(opt_->exp_avg()); }
std::vector<float> DataParallel::full_exp_avg_sq() { return gather_state(opt_->exp_avg_sq()); }

void DataParallel::load_state(const std::vector<float>& m, const std::vector<float>& v) {
  ADGT_CHECK(int64_t(m.size()) == model_.flat_size() && int64_t(v.size()) == model_.flat_size(),
             "DataParallel::load_state: size mismatch");
  opt_->from_host(opt_->exp_avg(), std::vector<float>(m.begin() + lo_, m.begin() + hi_));
  opt_->from_host(opt_->exp_avg_sq(), std::vector<float>(v.begin() + lo_, v.begin() + hi_));
}

}  // namespace adgt
