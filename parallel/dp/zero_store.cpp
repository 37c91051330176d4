#include "parallel/dp/zero_store.hpp"

#include <algorithm>
#include <exception>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"

namespace adgt {

namespace {

// Kept in flight before the oldest reduce-scatter is waited for: bounds the
// whole-unit gradients alive at once (the backward moves on meanwhile).
constexpr size_t kReducesInFlight = 2;

Tensor elems(void* p, DType dt, int64_t n) { return Tensor(p, dt, {n}); }

// n elements of a host copy of `src` (f32, f64 or bf16) as floats.
void to_floats(Backend& be, const Tensor& src, int64_t n, float* dst) {
  const size_t k = size_t(n);
  if (src.dtype == DType::F32) {
    be.to_host(dst, src.data, k * 4);
  } else if (src.dtype == DType::F64) {
    std::vector<double> d(k);
    be.to_host(d.data(), src.data, k * 8);
    for (size_t i = 0; i < k; ++i) dst[i] = float(d[i]);
  } else {
    ADGT_CHECK(src.dtype == DType::BF16, "ZeroStore: dtype " << dtype_name(src.dtype));
    std::vector<bf16_bits> h(k);
    be.to_host(h.data(), src.data, k * 2);
    for (size_t i = 0; i < k; ++i) dst[i] = bf16_to_float(h[i]);
  }
}

}  // namespace

ZeroStore::ZeroStore(Model& model, Backend& be, Comm& group, const ZeroOptions& o,
                     const float* initial, Comm* experts)
    : model_(model), be_(be), group_(group), experts_(experts), opt_(o), wdt_(model.dtype()),
      mdt_(model.master_dtype()) {
  ADGT_CHECK(o.level == 2 || o.level == 3, "ZeroStore: ZeRO level " << o.level << " (2 or 3)");
  ADGT_CHECK(o.prefetch >= 0, "parallel.zero3_prefetch=" << o.prefetch << " must be >= 0");
  const std::vector<GradUnit> units = model.grad_units();
  n_units_ = int(units.size());
  for (const GradUnit& u : units) chunk_of_.push_back(u.chunk);
  shards_ = plan_zero_shards(units, model.table(), group.size(), group.rank(),
                             experts ? experts->size() : 0, experts ? experts->rank() : 0);
  const int64_t S = std::max<int64_t>(shards_.shard_size, 1);
  master_ = Buffer(be, size_t(S) * dtype_size(mdt_));
  grad_ = Buffer(be, size_t(S) * dtype_size(mdt_));
  be.zero(elems(master_.data(), mdt_, S));
  be.zero(elems(grad_.data(), mdt_, S));
  if (initial) flat_host_to_shard(initial, size_t(model.flat_size()), master_shard());
  if (model.mixed()) {
    compute_ = Buffer(be, size_t(S) * dtype_size(wdt_));
    be.cast(elems(compute_.data(), wdt_, S), elems(master_.data(), mdt_, S));
  }
}

ZeroStore::~ZeroStore() {
  // Collectives still running write into buffers freed here: finish them.
  try {
    for (auto& [u, g] : gathered_) g.work.wait();
    for (Reduce& r : reducing_) r.work.wait();
  } catch (const std::exception&) {
    // The group failed; the error was reported where it happened.
  }
}

Tensor ZeroStore::master_shard() const {
  return elems(master_.data(), mdt_, std::max<int64_t>(shards_.shard_size, 1));
}
Tensor ZeroStore::grad_shard() const {
  return elems(grad_.data(), mdt_, std::max<int64_t>(shards_.shard_size, 1));
}
Tensor ZeroStore::compute_shard() const {
  if (!compute_.data()) return Tensor();
  return elems(compute_.data(), wdt_, std::max<int64_t>(shards_.shard_size, 1));
}

Tensor ZeroStore::slot(const Tensor& shard, const ZeroUnit& u) const {
  return elems(static_cast<char*>(shard.data) + size_t(u.offset) * dtype_size(shard.dtype),
               shard.dtype, u.per_rank);
}

void ZeroStore::account(int64_t delta) {
  working_ += delta;
  peak_working_ = std::max(peak_working_, working_);
}

Buffer ZeroStore::take(size_t bytes) {
  size_t best = pool_.size();
  // Within 1.5x: a small request (a reduce-scatter's output slot) does not
  // take a unit's buffer that a unit will want again, so the kept buffers
  // stay what the step uses at once, size by size.
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].bytes() >= bytes && pool_[i].bytes() <= bytes + bytes / 2 &&
        (best == pool_.size() || pool_[i].bytes() < pool_[best].bytes()))
      best = i;
  if (best == pool_.size()) return Buffer(be_, bytes);
  Buffer b = std::move(pool_[best]);
  pool_.erase(pool_.begin() + std::ptrdiff_t(best));
  return b;
}

void ZeroStore::give(Buffer b) {
  if (b.data()) pool_.push_back(std::move(b));
}

// ---------------------------------------------------------------- weights

void ZeroStore::start_gather(int su) {
  if (gathered_.count(su)) return;
  const ZeroUnit& u = shards_.units[size_t(su)];
  const int64_t n = u.per_rank * u.ranks;
  Gather g;
  g.buf = take(size_t(n) * dtype_size(wdt_));
  account(int64_t(size_t(n) * dtype_size(wdt_)));
  const Tensor from = model_.mixed() ? compute_shard() : master_shard();
  g.work = group_of(u).start_all_gather(elems(g.buf.data(), wdt_, n), slot(from, u));
  ++cur_.gathers;
  cur_.gather_bytes += int64_t(size_t(u.per_rank) * dtype_size(wdt_)) * (u.ranks - 1);
  gathered_.emplace(su, std::move(g));
}

void ZeroStore::start_unit(int g) {
  for (int su : segments(g)) start_gather(su);
}

void ZeroStore::wait_unit(int g) {
  for (int su : segments(g)) wait_gather(su);
}

int ZeroStore::segment_at(int g, int64_t at) const {
  for (int su : segments(g)) {
    const ZeroUnit& u = shards_.units[size_t(su)];
    if (at >= u.begin && at < u.end) return su;
  }
  ADGT_CHECK(false, "ZeroStore: flat element " << at << " is not in gradient unit " << g);
}

void ZeroStore::wait_gather(int su) {
  Gather& g = gathered_.at(su);
  if (g.waited) return;
  const double t0 = now_();
  g.work.wait();
  cur_.gather_wait_s += now_() - t0;
  g.waited = true;
}

void ZeroStore::free_gather(int su) {
  auto it = gathered_.find(su);
  if (it == gathered_.end()) return;
  it->second.work.wait();  // a prefetch not used: it must land before its buffer goes
  const ZeroUnit& u = shards_.units[size_t(su)];
  account(-int64_t(size_t(u.per_rank * u.ranks) * dtype_size(wdt_)));
  give(std::move(it->second.buf));
  gathered_.erase(it);
}

std::vector<int> ZeroStore::upcoming(Pass pass, int g) const {
  // grad_units' order is the backward's; the forward runs it backwards.
  std::vector<int> out;
  for (int k = 1; k <= opt_.prefetch; ++k) {
    const int n = pass == Pass::Backward ? g + k : g - k;
    if (n < 0 || n >= n_units_ || chunk_of_[size_t(n)] != chunk_of_[size_t(g)]) break;  // the chunk's pass
    out.push_back(n);
  }
  return out;
}

void ZeroStore::begin_unit(Pass pass, int g, const std::vector<int>& reads) {
  group_.progress();
  if (experts_) experts_->progress();
  reap(false);
  if (opt_.level < 3) return;
  auto reads_unit = [&](int su) {
    const int gu = shards_.units[size_t(su)].grad_unit;
    return std::find(reads.begin(), reads.end(), gu) != reads.end();
  };
  // Free what the pass has moved past: in the forward the units after this
  // one in grad_units' order (unless they stay until the backward), in the
  // backward the ones before it.
  const bool free_behind = pass == Pass::Backward || opt_.reshard_after_forward;
  if (opt_.pipelined) {
    // Passes of chunks and micro-batches interleave: everything but this
    // unit, its reads and its prefetched ones goes (or, not resharding,
    // nothing until the update).
    if (opt_.reshard_after_forward) {
      std::vector<int> keep = reads;  // grad units
      keep.push_back(g);
      for (int n : upcoming(pass, g)) keep.push_back(n);
      std::vector<int> drop;
      for (const auto& [su, gat] : gathered_) {
        (void)gat;
        const int gu = shards_.units[size_t(su)].grad_unit;
        if (std::find(keep.begin(), keep.end(), gu) == keep.end()) drop.push_back(su);
      }
      for (int su : drop) free_gather(su);
    }
  } else if (free_behind) {
    std::vector<int> drop;
    for (const auto& [su, gat] : gathered_) {
      (void)gat;
      const int gi = shards_.units[size_t(su)].grad_unit;
      const bool behind = pass == Pass::Forward ? gi > g : gi < g;
      // The forward keeps the units the backward starts with (the head and
      // the prefetched ones after it: FSDP does not reshard the last unit).
      const bool backward_first = pass == Pass::Forward && gi <= opt_.prefetch;
      if (behind && !backward_first && !reads_unit(su)) drop.push_back(su);
    }
    for (int su : drop) free_gather(su);
  }
  // The unit first, then what it also reads and the prefetched ones, in
  // the pass's order; only the unit is waited for now: another read (the
  // next layer's first norm, at the end of this layer's forward) waits in
  // weights() when the model reaches it, so its gather travels meanwhile.
  start_unit(g);
  if (opt_.prefetch > 0)  // prefetch 0: each gather starts when it is needed
    for (int r : reads) start_unit(r);
  for (int n : upcoming(pass, g)) start_unit(n);
  wait_unit(g);
}

char* ZeroStore::weights(int g, int64_t at) {
  // A read the pass named (begin_unit's `reads`) may still be arriving, or
  // (prefetch 0) not started: gathered now, in the same order on every rank.
  const int su = segment_at(g, at);
  start_gather(su);
  wait_gather(su);
  return static_cast<char*>(gathered_.at(su).buf.data()) +
         size_t(at - shards_.units[size_t(su)].begin) * dtype_size(wdt_);
}

// -------------------------------------------------------------- gradients

char* ZeroStore::grads(int g, int64_t at) {
  const int su = segment_at(g, at);
  auto it = unit_grads_.find(su);
  if (it == unit_grads_.end()) {
    const ZeroUnit& u = shards_.units[size_t(su)];
    const int64_t n = u.per_rank * u.ranks;
    Buffer b = take(size_t(n) * dtype_size(mdt_));
    be_.zero(elems(b.data(), mdt_, n));
    account(int64_t(size_t(n) * dtype_size(mdt_)));
    it = unit_grads_.emplace(su, std::move(b)).first;
  }
  return static_cast<char*>(it->second.data()) +
         size_t(at - shards_.units[size_t(su)].begin) * dtype_size(mdt_);
}

void ZeroStore::grads_done(int g) {
  if (opt_.pipelined) return;  // the chunk's ReduceGrads (chunk_done)
  reduce(g);
}

void ZeroStore::chunk_done(int chunk) {
  for (int g = 0; g < n_units_; ++g)
    if (chunk_of_[size_t(g)] == chunk) reduce(g);
}

void ZeroStore::reduce(int g) {
  for (int su : segments(g)) {
  const ZeroUnit& u = shards_.units[size_t(su)];
  grads(g, u.begin);  // a unit whose gradients nothing wrote still takes part (zeros)
  Reduce r;
  r.unit = su;
  r.grad = std::move(unit_grads_.at(su));
  unit_grads_.erase(su);
  r.out = take(size_t(u.per_rank) * dtype_size(mdt_));
  account(int64_t(size_t(u.per_rank) * dtype_size(mdt_)));
  r.work = group_of(u).start_reduce_scatter(elems(r.out.data(), mdt_, u.per_rank),
                                             elems(r.grad.data(), mdt_, u.per_rank * u.ranks));
  ++cur_.reduces;
  cur_.reduce_bytes += int64_t(size_t(u.per_rank) * dtype_size(mdt_)) * (u.ranks - 1);
  reducing_.push_back(std::move(r));
  group_of(u).progress();
  reap(false);
  }
}

void ZeroStore::reap(bool all) {
  while (!reducing_.empty()) {
    Reduce& r = reducing_.front();
    const bool must = all || reducing_.size() > kReducesInFlight;
    if (!must && !r.work.test()) break;
    const double t0 = now_();
    r.work.wait();
    cur_.reduce_wait_s += now_() - t0;
    const ZeroUnit& u = shards_.units[size_t(r.unit)];
    be_.add_inplace(slot(grad_shard(), u), elems(r.out.data(), mdt_, u.per_rank));
    account(-int64_t(size_t(u.per_rank * (u.ranks + 1)) * dtype_size(mdt_)));
    give(std::move(r.grad));
    give(std::move(r.out));
    reducing_.pop_front();
  }
}

void ZeroStore::begin_step() {
  be_.zero(grad_shard());
  cur_ = {};
}

void ZeroStore::finish_grads() {
  reap(true);
  ADGT_CHECK(unit_grads_.empty(), "ZeroStore: " << unit_grads_.size()
                                                << " gradient units written but never completed "
                                                   "by the backward");
  last_ = cur_;
}

// ----------------------------------------------------------------- update

void ZeroStore::after_update() {
  if (opt_.level >= 3) {
    std::vector<int> all;
    for (const auto& [su, g] : gathered_) all.push_back(su);
    for (int su : all) free_gather(su);
    return;
  }
  // ZeRO-2: the new weights, unit by unit, into the model's flat buffer.
  const double t0 = now_();
  const Tensor from = model_.mixed() ? compute_shard() : master_shard();
  Buffer tmp = take(size_t(std::max<int64_t>(shards_.max_unit, 1)) * dtype_size(wdt_));
  const Tensor params = model_.params();
  for (const ZeroUnit& u : shards_.units) {
    const int64_t n = u.per_rank * u.ranks;
    group_of(u).all_gather(elems(tmp.data(), wdt_, n), slot(from, u));
    be_.copy(elems(static_cast<char*>(params.data) + size_t(u.begin) * dtype_size(wdt_), wdt_,
                   u.end - u.begin),
             elems(tmp.data(), wdt_, u.end - u.begin));
  }
  give(std::move(tmp));
  last_.update_gather_s = now_() - t0;
}

// -------------------------------------------------------------- host copies

void ZeroStore::shard_to_flat_host(const Tensor& shard, std::vector<float>& out) {
  out.assign(size_t(model_.flat_size()), 0.0f);
  const DType dt = shard.dtype;
  Buffer tmp = take(size_t(std::max<int64_t>(shards_.max_unit, 1)) * dtype_size(dt));
  for (const ZeroUnit& u : shards_.units) {
    group_of(u).all_gather(elems(tmp.data(), dt, u.per_rank * u.ranks), slot(shard, u));
    to_floats(be_, elems(tmp.data(), dt, u.end - u.begin), u.end - u.begin, out.data() + u.begin);
  }
  give(std::move(tmp));
}

void ZeroStore::flat_host_to_shard(const float* flat, size_t n, Tensor shard) {
  ADGT_CHECK(int64_t(n) == model_.flat_size(),
             "ZeroStore: " << n << " values for a flat buffer of " << model_.flat_size());
  const size_t S = size_t(std::max<int64_t>(shards_.shard_size, 1));
  if (shard.dtype == DType::F32) {
    std::vector<float> h(S, 0.0f);
    for (const ZeroUnit& u : shards_.units)
      std::copy(flat + u.lo, flat + u.hi, h.begin() + u.offset);
    be_.to_device(shard.data, h.data(), S * 4);
  } else {
    ADGT_CHECK(shard.dtype == DType::F64, "ZeroStore: a " << dtype_name(shard.dtype) << " shard from the host");
    std::vector<double> h(S, 0.0);
    for (const ZeroUnit& u : shards_.units)
      std::copy(flat + u.lo, flat + u.hi, h.begin() + u.offset);
    be_.to_device(shard.data, h.data(), S * 8);
  }
}

void ZeroStore::load_weights(const float* flat, size_t n) {
  flat_host_to_shard(flat, n, master_shard());
  if (model_.mixed()) be_.cast(compute_shard(), master_shard());
  after_update();
}

void ZeroStore::publish() { after_update(); }

}  // namespace adgt
