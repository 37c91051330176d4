// The hierarchical reduction over sites (site_comm.hpp; docs/sites.md).
#include "parallel/comm/site_comm.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "kernels/check.hpp"

namespace adgt {

// One hierarchical collective: its phases (each a started collective on a
// sub-group), the scratch they use, and what is copied back at the end.
struct SiteComm::Op {
  std::vector<std::pair<Comm*, std::function<Work()>>> phases;  // (its sub-group, its start)
  std::function<void()> finish;  // after the last phase completed (copy-backs)
  size_t next = 0;               // the next phase to start
  Work work;                     // the running phase's
  // Modelled clocks (an emulated transport; < 0 otherwise): when the caller
  // started the op, and when its last completed phase ended there. The next
  // phase is issued then, as a stream launching the chain would.
  double issued = -1, prev_end = -1;
  Comm* prev = nullptr;  // the sub-group of the running (or last) phase
  bool done = false;
  std::vector<char> buf1, buf2;  // scratch (host tensors)
  Buffer dev1, dev2;             // scratch (device tensors), back to the pool when done
  bool started_all() const { return next == phases.size(); }
};

struct SiteComm::OpWork : Work::Impl {
  SiteComm* comm;
  std::shared_ptr<Op> op;
  OpWork(SiteComm* c, std::shared_ptr<Op> o) : comm(c), op(std::move(o)) {}
  bool test() override {
    comm->advance(op.get(), false);
    return op->done;
  }
  void wait() override { comm->advance(op.get(), true); }
};

namespace {

Tensor flat(void* data, DType t, int64_t n) { return Tensor(data, t, {n}); }

char* at(const Tensor& t, int64_t elem) {
  return static_cast<char*>(t.data) + size_t(elem) * dtype_size(t.dtype);
}

}  // namespace

SiteComm::SiteComm(Comm& full, SiteSplit split, std::unique_ptr<Comm> local,
                   std::unique_ptr<Comm> cross, std::vector<std::unique_ptr<Comm>> keep, Backend* be)
    : full_(full), split_(std::move(split)), be_(be), keep_(std::move(keep)), local_(std::move(local)),
      cross_(std::move(cross)) {
  const int me = full_.rank();
  ADGT_CHECK(local_ && cross_, "SiteComm(" << name() << "): no sub-groups");
  ADGT_CHECK(int(split_.site.size()) == full_.size() && split_.sites * split_.per_site == full_.size(),
             "SiteComm(" << name() << "): a split of " << split_.site.size() << " ranks ("
                         << split_.sites << " sites x " << split_.per_site << ") for a group of "
                         << full_.size());
  ADGT_CHECK(local_->size() == split_.per_site && local_->rank() == split_.place[size_t(me)] &&
                 cross_->size() == split_.sites && cross_->rank() == split_.site[size_t(me)],
             "SiteComm(" << name() << "): sub-groups local " << local_->rank() << "/"
                         << local_->size() << " and cross " << cross_->rank() << "/"
                         << cross_->size() << " do not match group rank " << me << " (site "
                         << split_.site[size_t(me)] << ", place " << split_.place[size_t(me)]
                         << " of " << split_.per_site << ")");
}

SiteComm::~SiteComm() {
  // The sub-groups, then what they use, last made first (a wrapper before
  // the transport it wraps).
  local_.reset();
  cross_.reset();
  while (!keep_.empty()) keep_.pop_back();
}

char* SiteComm::scratch(Op& op, int which, DType dt, int64_t n, bool device, bool zeroed) {
  const size_t bytes = size_t(n) * dtype_size(dt);
  if (!device) {
    std::vector<char>& v = which == 1 ? op.buf1 : op.buf2;
    v.assign(bytes, 0);
    return v.data();
  }
  // The smallest kept buffer that holds it, else a new one. A buffer goes
  // back when its op is done: on a stream-ordered transport (NCCL) the next
  // op's first use is ordered after the compute stream's wait for it.
  size_t best = pool_.size();
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].bytes() >= bytes && (best == pool_.size() || pool_[i].bytes() < pool_[best].bytes()))
      best = i;
  Buffer b;
  if (best < pool_.size()) {
    b = std::move(pool_[best]);
    pool_.erase(pool_.begin() + std::ptrdiff_t(best));
  } else {
    b = Buffer(*be_, std::max<size_t>(bytes, 1));
  }
  char* p = static_cast<char*>(b.data());
  if (zeroed && n > 0) be_->zero(Tensor(p, dt, {n}));
  (which == 1 ? op.dev1 : op.dev2) = std::move(b);
  return p;
}

void SiteComm::copy_bytes(bool device, void* dst, const void* src, DType dt, int64_t n) {
  if (n <= 0) return;
  if (!device) {
    std::memcpy(dst, src, size_t(n) * dtype_size(dt));
    return;
  }
  be_->copy(Tensor(dst, dt, {n}), Tensor(const_cast<void*>(src), dt, {n}));
}

Work SiteComm::enqueue(std::shared_ptr<Op> op) {
  op->issued = full_.modelled_now();
  queue_.push_back(op);
  advance(nullptr, false);
  if (op->done) return {};
  return Work(std::make_shared<OpWork>(this, std::move(op)));
}

void SiteComm::advance(const Op* until, bool block) {
  for (;;) {
    // Phases start in one order on every rank: op by op; an op's phase once
    // its previous phase completed and the op before it started its last.
    for (size_t j = 0; j < queue_.size(); ++j) {
      Op& op = *queue_[j];
      for (;;) {
        if (op.work.pending()) {
          if (!op.work.test()) break;
          op.prev_end = op.prev->modelled_end();
        }
        if (op.started_all()) {
          if (!op.done) {
            if (op.finish) op.finish();
            op.done = true;
            for (Buffer* b : {&op.dev1, &op.dev2})
              if (b->data()) pool_.push_back(std::move(*b));
          }
          break;
        }
        if (j > 0 && !queue_[j - 1]->started_all()) break;
        auto& [sub, start] = op.phases[op.next];
        const double at = op.next == 0 ? op.issued : op.prev_end;
        if (at >= 0) sub->issue_at(at);
        ++op.next;
        op.work = start();
        op.prev = sub;
        op.prev_end = -1;
      }
      if (!op.started_all()) break;  // the ops after it wait for its last phase
    }
    while (!queue_.empty() && queue_.front()->done) queue_.pop_front();
    if (!block || !until || until->done) return;
    // The first op's running phase: every member reaches it in this order.
    Op& front = *queue_.front();
    front.work.wait();
    if (front.prev) front.prev_end = front.prev->modelled_end();
  }
}

void SiteComm::progress() {
  advance(nullptr, false);
  local_->progress();
  cross_->progress();
  full_.progress();
}

bool SiteComm::progress_from_thread() const {
  return full_.progress_from_thread() && local_->progress_from_thread() &&
         cross_->progress_from_thread();
}

Work SiteComm::start_all_reduce(Tensor t, ReduceOp op_kind) {
  if (op_kind != ReduceOp::Sum)  // a Max (flags, norms): small; the flat group's
    return full_.start_all_reduce(t, op_kind);
  auto op = std::make_shared<Op>();
  const bool dev = on_device(t);
  const int64_t n = t.numel(), k = split_.per_site, m = (n + k - 1) / k;
  Tensor whole = flat(t.data, t.dtype, n);
  if (n % k != 0 || n == 0) {  // padded with zeros to k equal chunks (x + 0 == x)
    const int64_t padded = k * std::max<int64_t>(m, 1);
    char* b1 = scratch(*op, 1, t.dtype, padded, dev, true);
    copy_bytes(dev, b1, t.data, t.dtype, n);
    whole = flat(b1, t.dtype, padded);
    op->finish = [this, dev, b1, t, n] { copy_bytes(dev, t.data, b1, t.dtype, n); };
  }
  const int64_t mm = whole.numel() / k;
  Tensor shard = flat(scratch(*op, 2, t.dtype, mm, dev, false), t.dtype, mm);
  op->phases = {{local_.get(), [this, shard, whole] { return local_->start_reduce_scatter(shard, whole); }},
                {cross_.get(), [this, shard] { return cross_->start_all_reduce(shard, ReduceOp::Sum); }},
                {local_.get(), [this, shard, whole] { return local_->start_all_gather(whole, shard); }}};
  return enqueue(std::move(op));
}

Work SiteComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  const int64_t m = out.numel(), S = split_.sites, k = split_.per_site;
  ADGT_CHECK(in.numel() == m * size() && in.dtype == out.dtype,
             "SiteComm(" << name() << ")::reduce_scatter: in" << in.shape_str() << " must hold "
                         << size() << " x out" << out.shape_str() << " of one dtype");
  auto op = std::make_shared<Op>();
  const bool dev = on_device(in);
  const size_t es = dtype_size(in.dtype), cb = size_t(m) * es;
  // Local chunk i: the chunks of the ranks at place i of every site, by site.
  char* s1 = scratch(*op, 1, in.dtype, m * size(), dev, false);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t s = 0; s < S; ++s)
      copy_bytes(dev, s1 + size_t(i * S + s) * cb, at(in, int64_t(split_.rank_at[size_t(s)][size_t(i)]) * m),
                 in.dtype, m);
  char* s2 = scratch(*op, 2, in.dtype, m * S, dev, false);
  Tensor b1 = flat(s1, in.dtype, m * size()), b2 = flat(s2, in.dtype, m * S);
  Tensor o = flat(out.data, out.dtype, m);
  op->phases = {{local_.get(), [this, b1, b2] { return local_->start_reduce_scatter(b2, b1); }},
                {cross_.get(), [this, b2, o] { return cross_->start_reduce_scatter(o, b2); }}};
  return enqueue(std::move(op));
}

Work SiteComm::start_all_gather(Tensor out, const Tensor& in) {
  const int64_t m = in.numel(), S = split_.sites, k = split_.per_site;
  ADGT_CHECK(out.numel() == m * size() && in.dtype == out.dtype,
             "SiteComm(" << name() << ")::all_gather: out" << out.shape_str() << " must hold "
                         << size() << " x in" << in.shape_str() << " of one dtype");
  auto op = std::make_shared<Op>();
  const bool dev = on_device(in);
  const size_t es = dtype_size(in.dtype), cb = size_t(m) * es;
  char* s1 = scratch(*op, 1, in.dtype, m * size(), dev, false);
  char* s2 = scratch(*op, 2, in.dtype, m * S, dev, false);
  Tensor b1 = flat(s1, in.dtype, m * size()), b2 = flat(s2, in.dtype, m * S);
  Tensor i1 = flat(in.data, in.dtype, m);
  op->phases = {{cross_.get(), [this, b2, i1] { return cross_->start_all_gather(b2, i1); }},
                {local_.get(), [this, b1, b2] { return local_->start_all_gather(b1, b2); }}};
  op->finish = [this, dev, s1, out, m, S, k, cb] {
    for (int64_t i = 0; i < k; ++i)
      for (int64_t s = 0; s < S; ++s)
        copy_bytes(dev, at(out, int64_t(split_.rank_at[size_t(s)][size_t(i)]) * m),
                   s1 + size_t(i * S + s) * cb, out.dtype, m);
  };
  return enqueue(std::move(op));
}

void SiteComm::all_reduce(Tensor t, ReduceOp op) { start_all_reduce(t, op).wait(); }
void SiteComm::reduce_scatter(Tensor out, const Tensor& in) { start_reduce_scatter(out, in).wait(); }
void SiteComm::all_gather(Tensor out, const Tensor& in) { start_all_gather(out, in).wait(); }

const CommStats& SiteComm::stats() const {
  merged_ = {};
  for (const Comm* c : {static_cast<const Comm*>(&full_), static_cast<const Comm*>(local_.get()),
                        static_cast<const Comm*>(cross_.get())}) {
    merged_.bytes += c->stats().bytes;
    merged_.calls += c->stats().calls;
    merged_.seconds += c->stats().seconds;
  }
  return merged_;
}

void SiteComm::reset_stats() {
  full_.reset_stats();
  local_->reset_stats();
  cross_->reset_stats();
}

}  // namespace adgt
