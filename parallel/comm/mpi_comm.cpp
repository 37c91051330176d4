#include "parallel/comm/mpi_comm.hpp"

#include <atomic>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"
#include "parallel/comm/mpi_env.hpp"

namespace adgt {

namespace {

constexpr int64_t kMaxMessage = int64_t(1) << 30;   // bytes per MPI message (counts are int)
constexpr int64_t kBroadcastPiece = int64_t(4) << 20;  // pipelining unit of the broadcast chain
constexpr int kRingTag = 1;
constexpr int kMaxUserTag = 32767;  // MPI guarantees MPI_TAG_UB >= 32767


bool reducible(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::I32 || t == DType::BF16;
}

// bf16 (tensor-parallel partial sums of a mixed-precision model): each hop adds
// in fp32 and rounds once, as NCCL's bf16 reductions do.
void reduce_bf16(void* dst, const void* recv, const void* own, int64_t n, ReduceOp op) {
  auto* d = static_cast<bf16_bits*>(dst);
  const auto* a = static_cast<const bf16_bits*>(recv);
  const auto* b = static_cast<const bf16_bits*>(own);
  for (int64_t i = 0; i < n; ++i) {
    const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    d[i] = op == ReduceOp::Sum ? float_to_bf16(x + y) : ((x > y || x != x) ? a[i] : b[i]);
  }
}

// dst = received (op) own, element by element; dst may alias own. Max propagates NaN.
template <class T>
void reduce_typed(void* dst, const void* recv, const void* own, int64_t n, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* a = static_cast<const T*>(recv);
  const T* b = static_cast<const T*>(own);
  if (op == ReduceOp::Sum) {
    for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i];
  }
}

void reduce(void* dst, const void* recv, const void* own, int64_t n, DType dt, ReduceOp op) {
  switch (dt) {
    case DType::F32: return reduce_typed<float>(dst, recv, own, n, op);
    case DType::F64: return reduce_typed<double>(dst, recv, own, n, op);
    case DType::I32: return reduce_typed<int32_t>(dst, recv, own, n, op);
    case DType::BF16: return reduce_bf16(dst, recv, own, n, op);
    default: ADGT_CHECK(false, "MpiComm: cannot reduce " << dtype_name(dt));
  }
}

int to_int(int64_t v, const char* what) {
  ADGT_CHECK(v >= 0 && v <= INT_MAX,
             "MpiComm: " << what << " = " << v << " bytes does not fit MPI's int count");
  return int(v);
}

bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// MPI_Comm_dup through MPI_Comm_idup: a rank that arrives first does not spin
// while the others are still busy.
void polite_dup(MPI_Comm comm, MPI_Comm* out) {
  MPI_Request req;
  ADGT_MPI(MPI_Comm_idup(comm, out, &req));
  mpi_wait_politely(req);
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, std::string name, bool owned)
    : comm_(comm), owned_(owned), name_(std::move(name)) {
  ADGT_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ADGT_MPI(MPI_Comm_rank(comm_, &rank_));
  ADGT_MPI(MPI_Comm_size(comm_, &size_));
  polite_dup(comm_, &ring_);
  ADGT_MPI(MPI_Comm_set_errhandler(ring_, MPI_ERRORS_RETURN));
  // The members as MPI_COMM_WORLD ranks: the watchdog's heartbeats name them so.
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  ADGT_MPI(MPI_Comm_group(comm_, &mine));
  ADGT_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(size_t(size_), 0);
  world_of_.assign(size_t(size_), 0);
  sent_to_.assign(size_t(size_), 0);
  for (int i = 0; i < size_; ++i) ranks[size_t(i)] = i;
  ADGT_MPI(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_of_.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  slot_ = fault::register_group(name_, world_of_);
  if (const char* v = std::getenv("ADGT_TEST_STALL"); v && *v) {  // rank:group:seq
    const std::string s = v;
    const size_t a = s.find(':'), b = s.rfind(':');
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (a != std::string::npos && b > a && std::atoi(s.c_str()) == me &&
        s.substr(a + 1, b - a - 1) == name_)
      stall_at_ = std::atoll(s.c_str() + b + 1);
  }
}

void MpiComm::stall_forever() const {
  std::fprintf(stderr, "ADGT_TEST_STALL: %s stalls before %s collective #%lld\n",
               rank_host().c_str(), name_.c_str(), (long long)stall_at_);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

MpiComm::~MpiComm() {
  fault::unregister_group(slot_);
  if (!mpi_running()) return;  // MPI already finalized: nothing may be freed any more
  if (ring_ != MPI_COMM_NULL) MPI_Comm_free(&ring_);
  if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiComm> MpiComm::world(const std::string& name) {
  MPI_Comm c = MPI_COMM_NULL;
  polite_dup(MPI_COMM_WORLD, &c);
  return std::make_unique<MpiComm>(c, name, true);
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key, const std::string& name) const {
  MPI_Comm c = MPI_COMM_NULL;
  // MPI_Comm_split has no non-blocking form: the members first meet in a
  // polite barrier, so the blocking split's agreement finds them all there.
  MPI_Request req;
  ADGT_MPI(MPI_Ibarrier(comm_, &req));
  mpi_wait_politely(req);
  ADGT_MPI(MPI_Comm_split(comm_, color, key, &c));
  return std::make_unique<MpiComm>(c, name, true);
}

struct MpiComm::RingOp {
  const char* in = nullptr;  // reduce-scatter input (nullptr: all-gather only)
  char* rs_out = nullptr;    // reduce-scatter result, chunk rank()
  char* ag_base = nullptr;   // all-gather buffer (nullptr: reduce-scatter only)
  RingChunks ch;
  DType dt = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  size_t es = 4;
  int tag = 0;
  int64_t seq = 0;          // the group's collective number
  fault::Op kind = fault::Op::AllReduce;
  int phase = 0;  // 0 reduce-scatter, 1 all-gather, 2 complete
  int step = 0;
  bool posted = false;
  std::vector<MPI_Request> reqs;
  std::vector<char> scratch;  // reduce-scatter: received chunk, then the running sum
  const char* send = nullptr;  // reduce-scatter: what this step sends
  int64_t send_n = 0;
  bool complete() const { return phase == 2; }
};

struct MpiComm::RingWork final : Work::Impl {
  RingWork(MpiComm& c, std::shared_ptr<RingOp> o) : comm(c), op(std::move(o)) {}
  bool test() override {
    comm.advance_pending();
    return op->complete();
  }
  void wait() override {
    Timed timed(comm.stats_);
    --comm.stats_.calls;  // the start counted the call
    fault::WaitScope waiting(comm.slot_.get(), op->kind, op->seq);
    comm.run_until(*op);
  }
  MpiComm& comm;
  std::shared_ptr<RingOp> op;
};

std::shared_ptr<MpiComm::RingOp> MpiComm::start_ring(const char* in, char* rs_out, char* ag_base,
                                                     int64_t n, DType dt, ReduceOp op) {
  auto o = std::make_shared<RingOp>();
  o->in = in;
  o->rs_out = rs_out;
  o->ag_base = ag_base;
  o->ch = ring_chunks(n, size_);
  o->dt = dt;
  o->op = op;
  o->es = dtype_size(dt);
  o->tag = 2 + int(ops_started_++ % 32000);
  o->seq = next_seq();
  o->kind = !in ? fault::Op::AllGather : ag_base ? fault::Op::AllReduce : fault::Op::ReduceScatter;
  o->phase = in ? 0 : 1;
  if (in) {
    // Step 0 sends our own chunk r-1; every later step forwards what the previous one reduced.
    const size_t need = 2 * size_t(o->ch.max_count()) * o->es;
    if (!scratch_pool_.empty()) {
      o->scratch = std::move(scratch_pool_.back());
      scratch_pool_.pop_back();
    }
    if (o->scratch.size() < need) o->scratch.resize(need);
    const int c0 = (rank_ - 1 + size_) % size_;
    o->send = in + o->ch.offset[c0] * o->es;
    o->send_n = o->ch.count[c0];
  }
  pending_ops_.push_back(o);
  advance_pending();  // posts the first step
  return o;
}

void MpiComm::post_step(RingOp& o) {
  const int p = size_, r = rank_, s = o.step;
  const int right = (r + 1) % p, left = (r - 1 + p) % p;
  const char* send;
  char* recv;
  int64_t send_bytes, recv_bytes;
  if (o.phase == 0) {
    const int c = ((r - s - 2) % p + p) % p;  // the chunk received at this step
    send = o.send;
    send_bytes = o.send_n * int64_t(o.es);
    recv = o.scratch.data();
    recv_bytes = o.ch.count[c] * int64_t(o.es);
  } else {
    const int cs = ((r - s) % p + p) % p, cr = ((r - s - 1) % p + p) % p;
    send = o.ag_base + o.ch.offset[cs] * int64_t(o.es);
    send_bytes = o.ch.count[cs] * int64_t(o.es);
    recv = o.ag_base + o.ch.offset[cr] * int64_t(o.es);
    recv_bytes = o.ch.count[cr] * int64_t(o.es);
  }
  // Messages of at most 1 GiB (MPI counts are int).
  for (int64_t off = 0; off < recv_bytes; off += kMaxMessage) {
    o.reqs.emplace_back();
    ADGT_MPI(MPI_Irecv(recv + off, int(std::min(kMaxMessage, recv_bytes - off)), MPI_BYTE, left,
                       o.tag, ring_, &o.reqs.back()));
  }
  for (int64_t off = 0; off < send_bytes; off += kMaxMessage) {
    o.reqs.emplace_back();
    ADGT_MPI(MPI_Isend(send + off, int(std::min(kMaxMessage, send_bytes - off)), MPI_BYTE, right,
                       o.tag, ring_, &o.reqs.back()));
  }
  stats_.bytes += send_bytes;
  sent_to_[size_t(right)] += send_bytes;
  o.posted = true;
}

bool MpiComm::advance(RingOp& o) {
  const int p = size_, r = rank_;
  while (!o.complete()) {
    if (!o.posted) post_step(o);
    int done = 0;
    ADGT_MPI(MPI_Testall(int(o.reqs.size()), o.reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (!done) return false;
    o.reqs.clear();
    o.posted = false;
    if (o.phase == 0) {
      const int c = ((r - o.step - 2) % p + p) % p;
      char* acc = o.scratch.data() + size_t(o.ch.max_count()) * o.es;
      char* dst = o.step == p - 2 ? o.rs_out : acc;  // the last step completes chunk r
      reduce(dst, o.scratch.data(), o.in + o.ch.offset[c] * int64_t(o.es), o.ch.count[c], o.dt,
             o.op);
      o.send = acc;
      o.send_n = o.ch.count[c];
    }
    if (++o.step == p - 1) {
      o.step = 0;
      o.phase = o.phase == 0 && o.ag_base ? 1 : 2;
    }
  }
  return true;
}

void MpiComm::advance_pending() {
  for (size_t i = 0; i < pending_ops_.size();) {
    RingOp& o = *pending_ops_[i];
    if (!advance(o)) {
      ++i;
      continue;
    }
    if (!o.scratch.empty()) scratch_pool_.push_back(std::move(o.scratch));
    pending_ops_.erase(pending_ops_.begin() + std::ptrdiff_t(i));
  }
}

namespace {
std::atomic<int> g_poll_us{50};

std::atomic<int> g_spin_us{0};
std::atomic<bool> g_spare_core{true};

// The one polling loop of every wait: `done()` until it says so, `between()`
// after each miss; a short spin (200 polls, and up to g_spin_us more where
// the ranks have cores of their own), then a sleep of
// mpi_poll_interval_us() before each poll (ranks may share cores).
template <class Done, class Between>
void poll_politely(Done done, Between between) {
  constexpr int kSpins = 200;
  const int spin_us = g_spin_us.load();
  const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int spin = 0; !done(); ++spin) {
    between();
    if (spin >= kSpins && (spin_us == 0 || std::chrono::steady_clock::now() > spin_end))
      std::this_thread::sleep_for(std::chrono::microseconds(g_poll_us.load()));
  }
}
}  // namespace

void set_mpi_poll_interval_us(int us) { g_poll_us.store(std::max(1, us)); }
void set_mpi_spin_us(int us) { g_spin_us.store(std::max(0, us)); }
void set_host_spare_core(bool spare) { g_spare_core.store(spare); }
bool host_spare_core() { return g_spare_core.load(); }
int mpi_poll_interval_us() { return g_poll_us.load(); }

void mpi_wait_politely(MPI_Request& req, MPI_Status* st) {
  poll_politely(
      [&] {
        int done = 0;
        ADGT_MPI(MPI_Test(&req, &done, st));
        return done != 0;
      },
      [] {});
}

void mpi_wait_all_politely(std::vector<MPI_Request>& reqs) {
  poll_politely(
      [&] {
        int done = 0;
        ADGT_MPI(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      [] {});
}

void MpiComm::run_until(const RingOp& op) {
  poll_politely(
      [&] {
        advance_pending();
        return op.complete();
      },
      [] {});
}

void MpiComm::all_reduce(Tensor t, ReduceOp op) {
  // The start counts the call; its time and the wait's add up to the call's.
  start_all_reduce(t, op).wait();
}

Work MpiComm::start_all_reduce(Tensor t, ReduceOp op) {
  ADGT_CHECK(reducible(t.dtype), "MpiComm(" << name_ << ")::all_reduce: dtype "
                                            << dtype_name(t.dtype) << "; use f32, f64, bf16 or i32");
  Timed timed(stats_);
  if (size_ == 1 || t.numel() == 0) return {};
  char* base = static_cast<char*>(t.data);
  const RingChunks ch = ring_chunks(t.numel(), size_);
  auto o = start_ring(base, base + ch.offset[rank_] * int64_t(dtype_size(t.dtype)), base,
                      t.numel(), t.dtype, op);
  return Work(std::make_shared<RingWork>(*this, std::move(o)));
}

void MpiComm::reduce_scatter(Tensor out, const Tensor& in) {
  // The start counts the call; its time and the wait's add up to the call's.
  start_reduce_scatter(out, in).wait();
}

Work MpiComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  ADGT_CHECK(reducible(in.dtype) && out.dtype == in.dtype,
             "MpiComm(" << name_ << ")::reduce_scatter: dtypes out " << dtype_name(out.dtype)
                        << ", in " << dtype_name(in.dtype) << "; both f32, f64, bf16 or i32");
  ADGT_CHECK(in.numel() == int64_t(size_) * out.numel(),
             "MpiComm(" << name_ << ")::reduce_scatter: in" << in.shape_str() << " must hold "
                        << size_ << " x out" << out.shape_str());
  Timed timed(stats_);
  if (size_ == 1) {
    if (out.data != in.data) std::memmove(out.data, in.data, in.bytes());
    return {};
  }
  if (out.numel() == 0) return {};
  auto o = start_ring(static_cast<const char*>(in.data), static_cast<char*>(out.data), nullptr,
                      in.numel(), in.dtype, ReduceOp::Sum);
  return Work(std::make_shared<RingWork>(*this, std::move(o)));
}

void MpiComm::all_gather(Tensor out, const Tensor& in) {
  // The start counts the call; its time and the wait's add up to the call's.
  start_all_gather(out, in).wait();
}

Work MpiComm::start_all_gather(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == int64_t(size_) * in.numel(),
             "MpiComm(" << name_ << ")::all_gather: out" << out.shape_str() << " "
                        << dtype_name(out.dtype) << " must hold " << size_ << " x in"
                        << in.shape_str() << " " << dtype_name(in.dtype));
  Timed timed(stats_);
  char* mine = static_cast<char*>(out.data) + size_t(rank_) * in.bytes();
  if (mine != in.data) std::memmove(mine, in.data, in.bytes());
  if (size_ == 1 || in.numel() == 0) return {};
  auto o = start_ring(nullptr, nullptr, static_cast<char*>(out.data), out.numel(), out.dtype,
                      ReduceOp::Sum);
  return Work(std::make_shared<RingWork>(*this, std::move(o)));
}

void MpiComm::broadcast(Tensor t, int root) {
  ADGT_CHECK(root >= 0 && root < size_,
             "MpiComm(" << name_ << ")::broadcast: root " << root << " outside 0.." << size_ - 1);
  Timed timed(stats_);
  if (size_ == 1) return;
  fault::WaitScope waiting(slot_.get(), fault::Op::Broadcast, next_seq());
  const int p = size_, q = (rank_ - root + p) % p;  // position in the chain from the root
  const int prev = (rank_ - 1 + p) % p, next = (rank_ + 1) % p;
  const int64_t bytes = int64_t(t.bytes());
  char* base = static_cast<char*>(t.data);
  std::vector<MPI_Request> reqs;
  for (int64_t o = 0; o < bytes; o += kBroadcastPiece) {
    const int n = int(std::min(kBroadcastPiece, bytes - o));
    if (q > 0) {
      MPI_Request rr;
      ADGT_MPI(MPI_Irecv(base + o, n, MPI_BYTE, prev, kRingTag, ring_, &rr));
      mpi_wait_politely(rr);
    }
    if (q < p - 1) {
      reqs.emplace_back();
      ADGT_MPI(MPI_Isend(base + o, n, MPI_BYTE, next, kRingTag, ring_, &reqs.back()));
    }
  }
  mpi_wait_all_politely(reqs);
  if (q < p - 1) {
    stats_.bytes += bytes;
    sent_to_[size_t(next)] += bytes;
  }
}

void MpiComm::send(const Tensor& t, int peer, int tag) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "MpiComm(" << name_ << ")::send: peer " << peer << " must be another rank of 0.."
                        << size_ - 1 << " (this is rank " << rank_ << ")");
  ADGT_CHECK(tag >= 0 && tag <= kMaxUserTag,
             "MpiComm(" << name_ << ")::send: tag " << tag << " outside 0.." << kMaxUserTag);
  Timed timed(stats_);
  fault::WaitScope waiting(slot_.get(), fault::Op::Send, next_p2p(), world_of_[size_t(peer)]);
  const int64_t bytes = int64_t(t.bytes());
  const char* base = static_cast<const char*>(t.data);
  for (int64_t o = 0; o < bytes; o += kMaxMessage) {
    MPI_Request req;
    ADGT_MPI(MPI_Isend(base + o, int(std::min(kMaxMessage, bytes - o)), MPI_BYTE, peer, tag, comm_,
                       &req));
    wait_politely(req, MPI_STATUS_IGNORE);
  }
  stats_.bytes += bytes;
  sent_to_[size_t(peer)] += bytes;
}

void MpiComm::wait_politely(MPI_Request& req, MPI_Status* st) {
  // A pipeline stage can wait long for its neighbour (the bubble). Polling
  // without pause would take a core from the ranks that compute when ranks
  // share cores; after a short spin, poll every mpi_poll_interval_us(). The wait hook (the
  // executor's: other groups' started collectives) runs between polls.
  poll_politely(
      [&] {
        int done = 0;
        ADGT_MPI(MPI_Test(&req, &done, st));
        return done != 0;
      },
      [&] {
        if (wait_hook_) wait_hook_();
      });
}

int64_t MpiComm::isend(const Tensor& t, int peer, int tag) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "MpiComm(" << name_ << ")::isend: peer " << peer << " must be another rank of 0.."
                        << size_ - 1 << " (this is rank " << rank_ << ")");
  ADGT_CHECK(tag >= 0 && tag <= kMaxUserTag,
             "MpiComm(" << name_ << ")::isend: tag " << tag << " outside 0.." << kMaxUserTag);
  Timed timed(stats_);
  next_p2p();
  const int64_t bytes = int64_t(t.bytes());
  const char* base = static_cast<const char*>(t.data);
  std::vector<MPI_Request>& reqs = pending_[next_send_id_];
  for (int64_t o = 0; o < bytes; o += kMaxMessage) {
    reqs.emplace_back();
    ADGT_MPI(MPI_Isend(base + o, int(std::min(kMaxMessage, bytes - o)), MPI_BYTE, peer, tag, comm_,
                       &reqs.back()));
  }
  stats_.bytes += bytes;
  sent_to_[size_t(peer)] += bytes;
  return next_send_id_++;
}

bool MpiComm::send_done(int64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return true;
  int done = 0;
  ADGT_MPI(MPI_Testall(int(it->second.size()), it->second.data(), &done, MPI_STATUSES_IGNORE));
  if (done) pending_.erase(it);
  return done != 0;
}

void MpiComm::progress() {
  advance_pending();
  for (auto it = pending_.begin(); it != pending_.end();) {
    int done = 0;
    ADGT_MPI(MPI_Testall(int(it->second.size()), it->second.data(), &done, MPI_STATUSES_IGNORE));
    it = done ? pending_.erase(it) : std::next(it);
  }
}

bool MpiComm::progress_from_thread() const {
  int level = 0;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_SERIALIZED;
}

void MpiComm::wait_sends() {
  Timed timed(stats_);
  fault::WaitScope waiting(pending_.empty() ? nullptr : slot_.get(), fault::Op::WaitSends,
                           slot_->p2p.load(std::memory_order_relaxed));
  for (auto& [id, reqs] : pending_)
    for (MPI_Request& r : reqs) wait_politely(r, MPI_STATUS_IGNORE);
  pending_.clear();
}

void MpiComm::recv(Tensor t, int peer, int tag) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "MpiComm(" << name_ << ")::recv: peer " << peer << " must be another rank of 0.."
                        << size_ - 1 << " (this is rank " << rank_ << ")");
  ADGT_CHECK(tag >= 0 && tag <= kMaxUserTag,
             "MpiComm(" << name_ << ")::recv: tag " << tag << " outside 0.." << kMaxUserTag);
  Timed timed(stats_);
  fault::WaitScope waiting(slot_.get(), fault::Op::Recv, next_p2p(), world_of_[size_t(peer)]);
  const int64_t bytes = int64_t(t.bytes());
  char* base = static_cast<char*>(t.data);
  for (int64_t o = 0; o < bytes; o += kMaxMessage) {
    const int want = int(std::min(kMaxMessage, bytes - o));
    MPI_Status st;
    MPI_Request req;
    ADGT_MPI(MPI_Irecv(base + o, want, MPI_BYTE, peer, tag, comm_, &req));
    wait_politely(req, &st);
    int got = 0;
    ADGT_MPI(MPI_Get_count(&st, MPI_BYTE, &got));
    ADGT_CHECK(got == want, "MpiComm(" << name_ << ")::recv from rank " << peer << " tag " << tag
                                       << ": expected " << want << " bytes, got " << got
                                       << " (send and recv tensors differ in size)");
  }
}

void MpiComm::all_to_all(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % size_ == 0,
             "MpiComm(" << name_ << ")::all_to_all: in" << in.shape_str() << " and out"
                        << out.shape_str() << " must be equal, of one dtype, and split into "
                        << size_ << " chunks");
  Timed timed(stats_);
  if (size_ == 1) {
    if (out.data != in.data) std::memmove(out.data, in.data, in.bytes());
    return;
  }
  fault::WaitScope waiting(slot_.get(), fault::Op::AllToAll, next_seq());
  const int chunk = to_int(int64_t(in.bytes()) / size_, "all_to_all chunk");
  const void* src = in.data == out.data ? MPI_IN_PLACE : in.data;
  MPI_Request req;
  ADGT_MPI(MPI_Ialltoall(src, chunk, MPI_BYTE, out.data, chunk, MPI_BYTE, comm_, &req));
  mpi_wait_politely(req);
  stats_.bytes += int64_t(chunk) * (size_ - 1);
  for (int j = 0; j < size_; ++j)
    if (j != rank_) sent_to_[size_t(j)] += chunk;
}

void MpiComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                          const std::vector<int64_t>& recv_displs, const Tensor& in,
                          const std::vector<int64_t>& send_counts,
                          const std::vector<int64_t>& send_displs) {
  const size_t p = size_t(size_);
  ADGT_CHECK(out.dtype == in.dtype, "MpiComm(" << name_ << ")::all_to_allv: dtypes differ");
  ADGT_CHECK(recv_counts.size() == p && recv_displs.size() == p && send_counts.size() == p &&
                 send_displs.size() == p,
             "MpiComm(" << name_ << ")::all_to_allv: counts and displacements need " << p
                        << " entries each");
  for (size_t j = 0; j < p; ++j) {
    ADGT_CHECK(send_counts[j] >= 0 && send_displs[j] >= 0 &&
                   send_displs[j] + send_counts[j] <= in.numel(),
               "MpiComm(" << name_ << ")::all_to_allv: send to rank " << j << " ["
                          << send_displs[j] << ", +" << send_counts[j] << ") outside in"
                          << in.shape_str());
    ADGT_CHECK(recv_counts[j] >= 0 && recv_displs[j] >= 0 &&
                   recv_displs[j] + recv_counts[j] <= out.numel(),
               "MpiComm(" << name_ << ")::all_to_allv: receive from rank " << j << " ["
                          << recv_displs[j] << ", +" << recv_counts[j] << ") outside out"
                          << out.shape_str());
  }
  Timed timed(stats_);
  const int64_t es = int64_t(dtype_size(in.dtype));
  if (size_ == 1) {
    ADGT_CHECK(recv_counts[0] == send_counts[0],
               "MpiComm(" << name_ << ")::all_to_allv: a group of one sends to itself only");
    std::memmove(static_cast<char*>(out.data) + recv_displs[0] * es,
                 static_cast<const char*>(in.data) + send_displs[0] * es, size_t(send_counts[0] * es));
    return;
  }
  ADGT_CHECK(in.data != out.data, "MpiComm(" << name_ << ")::all_to_allv: in and out must differ");
  fault::WaitScope waiting(slot_.get(), fault::Op::AllToAllv, next_seq());
  // What every peer will send us must be what we expect to receive.
  std::vector<int64_t> incoming(p);
  MPI_Request req;
  ADGT_MPI(MPI_Ialltoall(send_counts.data(), 1, MPI_INT64_T, incoming.data(), 1, MPI_INT64_T, comm_,
                         &req));
  mpi_wait_politely(req);
  for (size_t j = 0; j < p; ++j)
    ADGT_CHECK(incoming[j] == recv_counts[j],
               "MpiComm(" << name_ << ")::all_to_allv: rank " << j << " sends " << incoming[j]
                          << " elements to rank " << rank_ << ", which expects "
                          << recv_counts[j]);
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  int64_t sent = 0;
  for (size_t j = 0; j < p; ++j) {
    sc[j] = to_int(send_counts[j] * es, "all_to_allv send count");
    sd[j] = to_int(send_displs[j] * es, "all_to_allv send displacement");
    rc[j] = to_int(recv_counts[j] * es, "all_to_allv receive count");
    rd[j] = to_int(recv_displs[j] * es, "all_to_allv receive displacement");
    if (int(j) != rank_) sent += sc[j];
  }
  ADGT_MPI(MPI_Ialltoallv(in.data, sc.data(), sd.data(), MPI_BYTE, out.data, rc.data(), rd.data(),
                          MPI_BYTE, comm_, &req));
  mpi_wait_politely(req);
  stats_.bytes += sent;
  for (size_t j = 0; j < p; ++j)
    if (int(j) != rank_) sent_to_[j] += sc[j];
}

void MpiComm::barrier() {
  Timed timed(stats_);
  if (size_ == 1) return;
  fault::WaitScope waiting(slot_.get(), fault::Op::Barrier, next_seq());
  MPI_Request req;
  ADGT_MPI(MPI_Ibarrier(comm_, &req));
  mpi_wait_politely(req);
}

std::vector<std::string> MpiComm::all_gather_strings(const std::string& mine) const {
  const int len = to_int(int64_t(mine.size()), "string");
  std::vector<int> lens(size_), displs(size_);
  fault::WaitScope waiting(size_ > 1 ? slot_.get() : nullptr, fault::Op::Gather, next_seq());
  MPI_Request req;
  ADGT_MPI(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &req));
  mpi_wait_politely(req);
  int total = 0;
  for (int i = 0; i < size_; ++i) displs[i] = total, total += lens[i];
  std::vector<char> all(size_t(total) + 1);
  ADGT_MPI(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                           MPI_CHAR, comm_, &req));
  mpi_wait_politely(req);
  std::vector<std::string> out(size_);
  for (int i = 0; i < size_; ++i) out[i].assign(all.data() + displs[i], size_t(lens[i]));
  return out;
}

std::vector<std::string> MpiComm::gather_strings(const std::string& mine, int root) const {
  const int len = to_int(int64_t(mine.size()), "string");
  std::vector<int> lens(size_), displs(size_);
  fault::WaitScope waiting(size_ > 1 ? slot_.get() : nullptr, fault::Op::Gather, next_seq());
  MPI_Request req;
  ADGT_MPI(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm_, &req));
  mpi_wait_politely(req);
  int total = 0;
  for (int i = 0; i < size_; ++i) displs[i] = total, total += lens[i];
  std::vector<char> all(size_t(total) + 1);
  ADGT_MPI(MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                        MPI_CHAR, root, comm_, &req));
  mpi_wait_politely(req);
  std::vector<std::string> out;
  if (rank_ != root) return out;
  out.resize(size_);
  for (int i = 0; i < size_; ++i) out[i].assign(all.data() + displs[i], size_t(lens[i]));
  return out;
}

}  // namespace adgt
