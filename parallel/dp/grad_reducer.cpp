#include "parallel/dp/grad_reducer.hpp"

#include "parallel/comm/site_comm.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

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
  table_ = model.table();
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
  staged_.resize(buckets_.size());
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
  ++step_report_.buckets[int(state_[i].level)];
  if (norms_) norms_->before_reduce(i, flat_range(model_.grads(), b.begin, b.end));
  if (state_[i].level != compress::Level::None) {
    // Queued for finish_grad_sync's batched reduce; a device bucket is staged
    // through host memory now (its gradients are final).
    if (!be_->is_host()) {
      staged_[i].resize(size_t(b.end - b.begin));
      be_->to_host(staged_[i].data(), static_cast<float*>(model_.grads().data) + b.begin,
                   size_t(b.end - b.begin) * 4);
    }
    queued_.push_back(i);
    return;
  }
  Tensor g = model_.grads();
  if (!state_[i].wan.empty()) {
    // Back to off after the cross-site level: the shard's residual (the
    // error of its site sum) goes into this rank's own part of the gradient,
    // once, so the site's sum carries it.
    const compress::BucketCodecState& w = state_[i].wan;
    auto* sc = dynamic_cast<SiteComm*>(&group(b));
    const int64_t n = b.end - b.begin;
    if (sc && !w.residual.empty()) {
      auto [first, real] = sc->split().shard(n, sc->rank());
      real = std::min<int64_t>(real, int64_t(w.residual.size()));
      std::vector<float> h(static_cast<size_t>(real));
      float* p = static_cast<float*>(g.data) + b.begin + first;
      if (!be_->is_host()) be_->to_host(h.data(), p, size_t(real) * 4);
      float* x = be_->is_host() ? p : h.data();
      for (int64_t k2 = 0; k2 < real; ++k2) x[k2] += w.residual[size_t(k2)];
      if (!be_->is_host()) be_->to_device(p, h.data(), size_t(real) * 4);
    }
    state_[i].wan = {};
  }
  if (!state_[i].codec.empty()) {
    // Back to off: the residuals not yet sent go into this gradient, once.
    compress::BucketCodecState& st = state_[i].codec;
    const int64_t n = b.end - b.begin;
    std::vector<float> h(static_cast<size_t>(n));
    float* p = static_cast<float*>(g.data) + b.begin;
    if (!be_->is_host()) be_->to_host(h.data(), p, size_t(n) * 4);
    float* x = be_->is_host() ? p : h.data();
    if (int64_t(st.residual.size()) == n)
      for (int64_t k = 0; k < n; ++k) x[k] += st.residual[size_t(k)];
    const auto [lo, hi] = compress::chunk_range(n, group(b).size(), group(b).rank(),
                                                b.op == BucketOp::ReduceScatter);
    if (int64_t(st.owner_residual.size()) == hi - lo)
      for (int64_t k = lo; k < hi; ++k) x[k] += st.owner_residual[size_t(k - lo)];
    if (!be_->is_host()) be_->to_device(p, h.data(), size_t(n) * 4);
    st = {};
  }
  if (b.op == BucketOp::AllReduce) {
    work_[i] = group(b).start_all_reduce(flat_range(g, b.begin, b.end));
  } else {
    // In place: this rank's chunk of the buffer receives its sum.
    work_[i] = group(b).start_reduce_scatter(flat_range(g, lo_, hi_), flat_range(g, b.begin, b.end));
  }
}

void GradReducer::reduce_compressed() {
  if (queued_.empty()) return;
  // Batches: per group, per level, in the order of their first bucket (the
  // same on every rank of a group: the same buckets and levels).
  std::sort(queued_.begin(), queued_.end());
  std::vector<std::pair<Comm*, compress::Level>> keys;
  for (size_t i : queued_) {
    const std::pair<Comm*, compress::Level> k{&group(buckets_[i]), state_[i].level};
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  for (const auto& [c, l] : keys) {
    if (auto* sc = dynamic_cast<SiteComm*>(c); sc && compress::quantized(l)) {
      std::vector<size_t> ids;
      for (size_t i : queued_)
        if (&group(buckets_[i]) == c && state_[i].level == l) ids.push_back(i);
      reduce_over_sites(*sc, l, ids);
      continue;
    }
    std::vector<compress::BatchItem> items;
    std::vector<size_t> ids;
    for (size_t i : queued_) {
      if (&group(buckets_[i]) != c || state_[i].level != l) continue;
      const GradBucket& b = buckets_[i];
      const int64_t n = b.end - b.begin;
      float* p = static_cast<float*>(model_.grads().data) + b.begin;
      compress::BatchItem it;
      it.view = {be_->is_host() ? p : staged_[i].data(), b.begin, n, b.op == BucketOp::ReduceScatter};
      it.state = &state_[i].codec;
      items.push_back(it);
      ids.push_back(i);
      step_report_.fp32_bytes += compress::fp32_ring_bytes(n, c->size(), b.op == BucketOp::ReduceScatter);
    }
    const int64_t bytes0 = c->stats().bytes;
    const double t0 = now_();
    compress::reduce_buckets(*c, l, items, table_, settings_);
    step_report_.seconds += now_() - t0;
    step_report_.sent_bytes += c->stats().bytes - bytes0;
    if (!be_->is_host())
      for (size_t i : ids) {
        const GradBucket& b = buckets_[i];
        be_->to_device(static_cast<float*>(model_.grads().data) + b.begin, staged_[i].data(),
                       size_t(b.end - b.begin) * 4);
        staged_[i] = {};
      }
  }
  queued_.clear();
}

void GradReducer::reduce_over_sites(SiteComm& sc, compress::Level l, const std::vector<size_t>& ids) {
  // Per bucket (n elements; k ranks a site, this rank at place `place`): the
  // fp32 reduce-scatter inside the site into this rank's m = ceil(n/k)
  // elements, then every bucket's shard compressed across the sites in one
  // batch (the codec's error feedback per bucket shard), then the fp32
  // all-gather inside the site. A ZeRO-1 bucket is reduced whole (its chunk
  // is part of it).
  const int64_t k = sc.split().per_site;
  const double t0 = now_();
  const int64_t bytes0 = sc.stats().bytes;
  std::vector<std::vector<float>> padded(ids.size()), shard(ids.size());
  std::vector<compress::BatchItem> items;
  for (size_t j = 0; j < ids.size(); ++j) {
    const size_t i = ids[j];
    const GradBucket& b = buckets_[i];
    const int64_t n = b.end - b.begin, m = (n + k - 1) / k;
    float* p = be_->is_host() ? static_cast<float*>(model_.grads().data) + b.begin : staged_[i].data();
    padded[j].assign(size_t(k * m), 0.0f);
    std::copy(p, p + n, padded[j].begin());
    shard[j].assign(size_t(m), 0.0f);
    sc.local().reduce_scatter(Tensor(shard[j].data(), DType::F32, {m}),
                              Tensor(padded[j].data(), DType::F32, {k * m}));
    // The shard's real elements (the last place's may end early; padding stays 0).
    const auto [first, real] = sc.split().shard(n, sc.rank());
    compress::BatchItem it;
    it.view = {shard[j].data(), b.begin + first, real, false};
    it.state = &state_[i].wan;
    items.push_back(it);
    step_report_.fp32_bytes += compress::fp32_ring_bytes(n, sc.size(), b.op == BucketOp::ReduceScatter);
  }
  // Every member of a cross group holds the same place, so the same shard
  // ranges: the batch matches across the sites.
  std::vector<compress::BatchItem> nonempty;
  for (const auto& it : items)
    if (it.view.n > 0) nonempty.push_back(it);
  if (!nonempty.empty()) compress::reduce_buckets(sc.cross(), l, nonempty, table_, settings_);
  for (size_t j = 0; j < ids.size(); ++j) {
    const size_t i = ids[j];
    const GradBucket& b = buckets_[i];
    const int64_t n = b.end - b.begin, m = int64_t(shard[j].size());
    sc.local().all_gather(Tensor(padded[j].data(), DType::F32, {k * m}),
                          Tensor(shard[j].data(), DType::F32, {m}));
    float* p = be_->is_host() ? static_cast<float*>(model_.grads().data) + b.begin : staged_[i].data();
    std::copy(padded[j].begin(), padded[j].begin() + n, p);
    if (!be_->is_host()) {
      be_->to_device(static_cast<float*>(model_.grads().data) + b.begin, staged_[i].data(), size_t(n) * 4);
      staged_[i] = {};
    }
  }
  step_report_.seconds += now_() - t0;
  step_report_.sent_bytes += sc.stats().bytes - bytes0;
}

void GradReducer::set_compression(const compress::Settings& s, Backend& be) {
  ADGT_CHECK(s.level == compress::Level::None || model_.master_dtype() == DType::F32,
             "parallel.grad_compression=" << compress::level_name(s.level)
                                          << " needs fp32 gradients, but train.dtype=f64 keeps "
                                             "them in f64; use train.dtype f32 or bf16, or "
                                             "parallel.grad_compression=off");
  ADGT_CHECK(s.powersgd_rank >= 1, "parallel.powersgd_rank=" << s.powersgd_rank << " must be >= 1");
  settings_ = s;
  be_ = &be;
  for (size_t i = 0; i < buckets_.size(); ++i) set_level(int(i), s.level);
}

void GradReducer::set_level(int bucket_id, compress::Level l) {
  ADGT_CHECK(bucket_id >= 0 && size_t(bucket_id) < buckets_.size(),
             "GradReducer::set_level: bucket " << bucket_id << " of " << buckets_.size());
  ADGT_CHECK(be_ != nullptr, "GradReducer::set_level: call set_compression first");
  BucketState& st = state_[size_t(bucket_id)];
  if (st.level == l) return;
  if (l == compress::Level::None || st.level == compress::Level::PowerSgd) st.codec.q.clear();
  if (l == compress::Level::PowerSgd && !st.codec.owner_residual.empty()) {
    // PowerSGD has no owner step: the owner's residual joins this rank's
    // (it is then sent once, in the next sum).
    const GradBucket& b = buckets_[size_t(bucket_id)];
    const int64_t n = b.end - b.begin;
    const auto [lo, hi] = compress::chunk_range(n, group(b).size(), group(b).rank(),
                                                b.op == BucketOp::ReduceScatter);
    if (int64_t(st.codec.residual.size()) != n) st.codec.residual.assign(size_t(n), 0.0f);
    if (int64_t(st.codec.owner_residual.size()) == hi - lo)
      for (int64_t k = lo; k < hi; ++k) st.codec.residual[size_t(k)] += st.codec.owner_residual[size_t(k - lo)];
    st.codec.owner_residual.clear();
  }
  st.level = l;
}

std::string GradReducer::level_mix() const {
  int64_t count[compress::kLevels] = {};
  for (const BucketState& s : state_) ++count[int(s.level)];
  std::ostringstream os;
  int kinds = 0;
  for (int l = 0; l < compress::kLevels; ++l) kinds += count[l] > 0;
  if (kinds <= 1) return state_.empty() ? "off" : compress::level_name(state_[0].level);
  for (int l = compress::kLevels - 1; l >= 0; --l)
    if (count[l]) os << (os.tellp() > 0 ? "," : "") << compress::level_name(compress::Level(l)) << ':' << count[l];
  return os.str();
}

bool GradReducer::has_compression_state() const {
  for (const BucketState& b : state_)
    if (!b.codec.empty()) return true;
  return false;
}

void GradReducer::clear_compression_state() {
  for (BucketState& b : state_) b.codec = b.wan = {};
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
  const double t0 = now_();
  start_grad_sync();
  const double compressed0 = step_report_.seconds;
  reduce_compressed();
  for (Work& w : work_) w.wait();
  wait_s_ = now_() - t0 - (step_report_.seconds - compressed0);
  if (norms_) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const GradBucket& b = buckets_[i];
      norms_->after_reduce(i, flat_range(model_.grads(), b.begin, b.end), group(b).size(),
                           b.op == BucketOp::AllReduce);
    }
    norms_->end_step();
  }
  report_ = step_report_;
  step_report_ = {};
  reset();
}

std::vector<Comm*> GradReducer::comms() const {
  std::vector<Comm*> c;
  if (dp_.size() > 1) c.push_back(&dp_);
  if (edp_ && edp_->size() > 1 && edp_ != &dp_) c.push_back(edp_);
  return c;
}

}  // namespace adgt
