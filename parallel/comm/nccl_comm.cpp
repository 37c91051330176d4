#include "parallel/comm/nccl_comm.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "kernels/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "parallel/comm/device_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/comm/ring.hpp"

namespace adgt {

namespace {


ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::BF16: return ncclBfloat16;
    case DType::E4M3:
    case DType::E5M2: return ncclUint8;  // moved, never reduced
  }
  ADGT_CHECK(false, "NcclComm: unknown dtype");
}

const char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<const char*>(t.data) + elem_offset * int64_t(dtype_size(t.dtype));
}
char* byte_ptr(Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * int64_t(dtype_size(t.dtype));
}

}  // namespace

void gpu_call_failed(const char* call, const char* error, const char* file, int line) {
  std::ostringstream os;
  os << "GPU call failed: " << call << ": " << error << " (" << rank_host() << ", " << file << ":"
     << line << ")";
  throw std::runtime_error(os.str());
}

// Closes an NCCL group on every path: a throw between ncclGroupStart and
// ncclGroupEnd must not leave the group open (every later NCCL call of the
// process would join it).
class GroupGuard {
 public:
  GroupGuard() { ADGT_NCCL(ncclGroupStart()); }
  ~GroupGuard() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    ADGT_NCCL(ncclGroupEnd());
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

 private:
  bool open_ = true;
};

NcclComm::NcclComm(const MpiComm& group, int device, cudaStream_t compute)
    : compute_(compute), rank_(group.rank()), size_(group.size()), device_(device),
      name_(group.name()) {
  if (const char* t = std::getenv("ADGT_NCCL_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    ADGT_CHECK(end && *end == 0 && v > 0,
               "ADGT_NCCL_TIMEOUT_S='" << t << "': a number of seconds > 0 expected");
    timeout_s_ = v;
  }
  ncclUniqueId id{};
  if (rank_ == 0) ADGT_NCCL(ncclGetUniqueId(&id));
  ADGT_MPI(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, group.handle()));
  ADGT_CUDA(cudaSetDevice(device_));
  ADGT_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  ADGT_CUDA(cudaMalloc(&barrier_buf_, sizeof(float)));
  ADGT_CUDA(cudaMemset(barrier_buf_, 0, sizeof(float)));
  ADGT_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
  slot_ = fault::register_group(name_ + "_nccl", group.world_ranks());
  // The watchdog's last act, from its thread: unblock the peers, then the process ends.
  abort_hook_ = fault::add_abort_hook([this] {
    if (ncclComm_t c = comm_) (void)ncclCommAbort(c);  // null: aborted already
  });
}

NcclComm::~NcclComm() {
  // No throwing here: errors at teardown are reported, not raised.
  fault::remove_abort_hook(abort_hook_);
  fault::unregister_group(slot_);
  if (comm_) {
    // Queued isends are dropped: a peer still waiting for them gets the
    // error of its own communicator's teardown, not a hang of this one.
    if (!unsent_.empty())
      std::fprintf(stderr, "warning: NcclComm(%s): %zu queued sends dropped at teardown (%s)\n",
                   name_.c_str(), unsent_.size(), rank_host().c_str());
    (void)cudaStreamSynchronize(comm_stream_);
    const ncclResult_t rc = ncclCommDestroy(comm_);
    if (rc != ncclSuccess)
      std::fprintf(stderr, "warning: ncclCommDestroy: %s (%s)\n", ncclGetErrorString(rc),
                   rank_host().c_str());
  }
  exposures_.clear();
  in_flight_.clear();
  if (barrier_buf_) (void)cudaFree(barrier_buf_);
  if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
}

NcclComm::Event NcclComm::make_event() {
  cudaEvent_t e = nullptr;
  ADGT_CUDA(cudaEventCreate(&e));  // with timing: exposures are measured with these
  return Event(e, [](CUevent_st* p) { (void)cudaEventDestroy(p); });
}

void NcclComm::abort_and_throw(const char* what, const std::string& why) {
  if (comm_) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  std::ostringstream os;
  os << "NcclComm(" << name_ << ")::" << what << ": " << why << "; the communicator is aborted ("
     << rank_host() << ")";
  throw std::runtime_error(os.str());
}

void NcclComm::check_async(const char* what) {
  if (!comm_) {
    std::ostringstream os;
    os << "NcclComm(" << name_ << ")::" << what << ": the communicator was aborted after an "
       << "earlier error (" << rank_host() << ")";
    throw std::runtime_error(os.str());
  }
  ncclResult_t st = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
  if (rc != ncclSuccess) abort_and_throw(what, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(rc));
  if (st != ncclSuccess && st != ncclInProgress)
    abort_and_throw(what, std::string("asynchronous NCCL error: ") + ncclGetErrorString(st));
}

void NcclComm::host_wait(const Event& ev, const char* what) {
  fault::WaitScope waiting(slot_.get(), fault::op_from_name(what),
                           slot_->seq.load(std::memory_order_relaxed));
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(ev.get());
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      abort_and_throw(what, std::string("waiting for the stream: ") + cudaGetErrorString(q));
    }
    check_async(what);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > timeout_s_)
      abort_and_throw(what, "no progress in " + std::to_string(int(waited)) +
                                " s (ADGT_NCCL_TIMEOUT_S); a peer has probably failed or "
                                "is stuck");
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

NcclComm::Event NcclComm::enqueue(const char* what, bool group,
                                  const std::function<void()>& issue) {
  check_async(what);
  std::atomic<int64_t>& counter = group ? slot_->p2p : slot_->seq;  // point-to-point apart
  counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  ADGT_CUDA(cudaSetDevice(device_));
  Event ready = make_event(), done = make_event();
  ADGT_CUDA(cudaEventRecord(ready.get(), compute_));
  ADGT_CUDA(cudaStreamWaitEvent(comm_stream_, ready.get(), 0));
  std::vector<Send> sends;
  sends.swap(unsent_);
  {
    // Queued isends go first, in one group with this operation's calls when
    // it is itself grouped point-to-point (recv): see the header.
    const bool grouped = group || !sends.empty();
    std::unique_ptr<GroupGuard> g;
    if (grouped) g = std::make_unique<GroupGuard>();
    for (const Send& s : sends)
      ADGT_NCCL(ncclSend(s.t.data, size_t(s.t.numel()), nccl_type(s.t.dtype), s.peer, comm_,
                         comm_stream_));
    if (!group && g) g->end();  // the sends' group, then the collective on its own
    if (issue) issue();
    if (group && g) g->end();
  }
  ADGT_CUDA(cudaEventRecord(done.get(), comm_stream_));
  for (const Send& s : sends) in_flight_[s.id] = done;
  ++stats_.calls;
  return done;
}

void NcclComm::join(const Event& done) {
  Event wait_at = make_event();
  ADGT_CUDA(cudaEventRecord(wait_at.get(), compute_));
  ADGT_CUDA(cudaStreamWaitEvent(compute_, done.get(), 0));
  exposures_.push_back({std::move(wait_at), done});
  if (exposures_.size() > 4096) resolve_exposures();  // stats() not read for a long time
}

void NcclComm::resolve_exposures() const {
  for (const Exposure& e : exposures_) {
    if (cudaEventSynchronize(e.done.get()) != cudaSuccess ||
        cudaEventSynchronize(e.wait_at.get()) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;  // the error surfaces at the next call; the time is not counted
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, e.wait_at.get(), e.done.get()) == cudaSuccess && ms > 0)
      exposed_s_ += ms * 1e-3;
    else
      (void)cudaGetLastError();
  }
  exposures_.clear();
}

const CommStats& NcclComm::stats() const {
  resolve_exposures();
  shown_ = stats_;
  shown_.seconds += exposed_s_;
  return shown_;
}

void NcclComm::reset_stats() {
  resolve_exposures();
  stats_ = {};
  exposed_s_ = 0;
}

Work NcclComm::make_work(Event done, const char* what) {
  struct Impl : Work::Impl {
    NcclComm* c;
    Event done;
    const char* what;
    Impl(NcclComm* c_, Event d, const char* w) : c(c_), done(std::move(d)), what(w) {}
    bool test() override {
      const cudaError_t q = cudaEventQuery(done.get());
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        c->abort_and_throw(what, std::string("collective failed: ") + cudaGetErrorString(q));
      }
      c->check_async(what);
      return false;
    }
    void wait() override { c->join(done); }
  };
  return Work(std::make_shared<Impl>(this, std::move(done), what));
}

void NcclComm::all_reduce(Tensor t, ReduceOp op) { start_all_reduce(t, op).wait(); }
void NcclComm::reduce_scatter(Tensor out, const Tensor& in) { start_reduce_scatter(out, in).wait(); }
void NcclComm::all_gather(Tensor out, const Tensor& in) { start_all_gather(out, in).wait(); }

Work NcclComm::start_all_reduce(Tensor t, ReduceOp op) {
  Event done = enqueue("all_reduce", false, [&] {
    ADGT_NCCL(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype),
                            op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, comm_stream_));
  });
  stats_.bytes += ring_all_reduce_sent(t.numel(), size_, rank_) * int64_t(dtype_size(t.dtype));
  return make_work(std::move(done), "all_reduce");
}

Work NcclComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && in.numel() == int64_t(size_) * out.numel(),
             "NcclComm(" << name_ << ")::reduce_scatter: in" << in.shape_str() << " must hold "
                         << size_ << " x out" << out.shape_str() << " of one dtype");
  Event done = enqueue("reduce_scatter", false, [&] {
    ADGT_NCCL(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype),
                                ncclSum, comm_, comm_stream_));
  });
  stats_.bytes += ring_reduce_scatter_sent(in.numel(), size_, rank_) * int64_t(dtype_size(in.dtype));
  return make_work(std::move(done), "reduce_scatter");
}

Work NcclComm::start_all_gather(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == int64_t(size_) * in.numel(),
             "NcclComm(" << name_ << ")::all_gather: out" << out.shape_str() << " must hold "
                         << size_ << " x in" << in.shape_str() << " of one dtype");
  Event done = enqueue("all_gather", false, [&] {
    ADGT_NCCL(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_,
                            comm_stream_));
  });
  stats_.bytes += ring_all_gather_sent(out.numel(), size_, rank_) * int64_t(dtype_size(in.dtype));
  return make_work(std::move(done), "all_gather");
}

void NcclComm::broadcast(Tensor t, int root) {
  ADGT_CHECK(root >= 0 && root < size_,
             "NcclComm(" << name_ << ")::broadcast: root " << root << " outside 0.." << size_ - 1);
  join(enqueue("broadcast", false, [&] {
    ADGT_NCCL(ncclBroadcast(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), root, comm_,
                            comm_stream_));
  }));
  stats_.bytes += chain_broadcast_sent(t.numel(), size_, rank_, root) * int64_t(dtype_size(t.dtype));
}

int64_t NcclComm::isend(const Tensor& t, int peer, int) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "NcclComm(" << name_ << ")::isend: peer " << peer << " must be another rank of 0.."
                         << size_ - 1);
  const int64_t id = next_send_++;
  unsent_.push_back({t, peer, id});
  stats_.bytes += int64_t(t.bytes());
  return id;
}

bool NcclComm::send_done(int64_t id) {
  if (!unsent_.empty()) enqueue("isend", true, nullptr);  // issue them now
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return true;
  const cudaError_t q = cudaEventQuery(it->second.get());
  if (q == cudaErrorNotReady) {
    check_async("isend");
    return false;
  }
  if (q != cudaSuccess) {
    (void)cudaGetLastError();
    abort_and_throw("isend", std::string("send failed: ") + cudaGetErrorString(q));
  }
  in_flight_.erase(it);
  return true;
}

void NcclComm::wait_sends() {
  if (!unsent_.empty()) enqueue("isend", true, nullptr);
  for (auto& kv : in_flight_) host_wait(kv.second, "wait_sends");
  in_flight_.clear();
}

Work NcclComm::start_exchange(const std::vector<Message>& out, int to,
                               const std::vector<Message>& in, int from) {
  ADGT_CHECK((out.empty() || (to >= 0 && to < size_ && to != rank_)) &&
                 (in.empty() || (from >= 0 && from < size_ && from != rank_)),
             "NcclComm(" << name_ << ")::start_exchange: peers " << to << " and " << from
                         << " must be other ranks of 0.." << size_ - 1);
  if (out.empty() && in.empty() && unsent_.empty()) return {};
  for (const Message& m : out) stats_.bytes += int64_t(m.t.bytes());
  Event done = enqueue("exchange", true, [&] {
    for (const Message& m : out)
      ADGT_NCCL(ncclSend(m.t.data, size_t(m.t.numel()), nccl_type(m.t.dtype), to, comm_,
                         comm_stream_));
    for (const Message& m : in)
      ADGT_NCCL(ncclRecv(m.t.data, size_t(m.t.numel()), nccl_type(m.t.dtype), from, comm_,
                         comm_stream_));
  });
  return make_work(std::move(done), "exchange");
}

void NcclComm::send(const Tensor& t, int peer, int tag) {
  isend(t, peer, tag);
  // The caller may overwrite t once send returns: later compute waits for it.
  join(enqueue("send", true, nullptr));
}

void NcclComm::recv(Tensor t, int peer, int) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "NcclComm(" << name_ << ")::recv: peer " << peer << " must be another rank of 0.."
                         << size_ - 1);
  join(enqueue("recv", true, [&] {
    ADGT_NCCL(ncclRecv(t.data, size_t(t.numel()), nccl_type(t.dtype), peer, comm_, comm_stream_));
  }));
}

void NcclComm::all_to_all(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % size_ == 0 &&
                 out.data != in.data,
             "NcclComm(" << name_ << ")::all_to_all: in" << in.shape_str() << " and out"
                         << out.shape_str() << " must be distinct, equal, of one dtype, and split into "
                         << size_ << " chunks");
  const int64_t n = in.numel() / size_;
  std::vector<int64_t> counts(size_, n), displs(size_);
  for (int j = 0; j < size_; ++j) displs[j] = j * n;
  all_to_allv(out, counts, displs, in, counts, displs);
}

void NcclComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, const Tensor& in,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs) {
  const size_t p = size_t(size_);
  ADGT_CHECK(out.dtype == in.dtype && out.data != in.data && recv_counts.size() == p &&
                 recv_displs.size() == p && send_counts.size() == p && send_displs.size() == p,
             "NcclComm(" << name_ << ")::all_to_allv: distinct in/out of one dtype and " << p
                         << " counts and displacements each");
  for (size_t j = 0; j < p; ++j)
    ADGT_CHECK(send_counts[j] >= 0 && send_displs[j] >= 0 && send_displs[j] + send_counts[j] <= in.numel() &&
                   recv_counts[j] >= 0 && recv_displs[j] >= 0 &&
                   recv_displs[j] + recv_counts[j] <= out.numel(),
               "NcclComm(" << name_ << ")::all_to_allv: the ranges of rank " << j
                           << " fall outside in" << in.shape_str() << " or out" << out.shape_str());
  ADGT_CHECK(recv_counts[rank_] == send_counts[rank_],
             "NcclComm(" << name_ << ")::all_to_allv: rank " << rank_ << " sends itself "
                         << send_counts[rank_] << " elements but expects " << recv_counts[rank_]);
  const ncclDataType_t ty = nccl_type(in.dtype);
  const size_t es = dtype_size(in.dtype);
  int64_t sent = 0;
  // The own chunk is a device copy on the communication stream, before the
  // group (a copy inside ncclGroupStart/End is not part of the group).
  Event done = enqueue("all_to_allv", false, [&] {
    ADGT_CUDA(cudaMemcpyAsync(byte_ptr(out, recv_displs[rank_]), byte_ptr(in, send_displs[rank_]),
                              size_t(send_counts[rank_]) * es, cudaMemcpyDeviceToDevice,
                              comm_stream_));
    GroupGuard g;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      if (send_counts[j] > 0)
        ADGT_NCCL(ncclSend(byte_ptr(in, send_displs[j]), size_t(send_counts[j]), ty, j, comm_,
                           comm_stream_));
      if (recv_counts[j] > 0)
        ADGT_NCCL(ncclRecv(byte_ptr(out, recv_displs[j]), size_t(recv_counts[j]), ty, j, comm_,
                           comm_stream_));
      sent += send_counts[j] * int64_t(es);
    }
    g.end();
  });
  join(done);
  stats_.bytes += sent;
}

void NcclComm::barrier() {
  Event done = enqueue("barrier", false, [&] {
    ADGT_NCCL(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_,
                            comm_stream_));
  });
  join(done);
  host_wait(done, "barrier");
}

}  // namespace adgt

namespace adgt {

std::unique_ptr<Comm> make_nccl_comm(Comm& group, Backend& be) {
  auto* mpi = dynamic_cast<MpiComm*>(&group);
  ADGT_CHECK(mpi, "make_nccl_comm: group '" << group.name() << "' is not an MpiComm");
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  ADGT_CHECK(cuda, "make_nccl_comm: the backend is " << be.name() << ", not CUDA");
  return std::make_unique<NcclComm>(*mpi, cuda->device(),
                                    reinterpret_cast<cudaStream_t>(cuda->stream()));
}

}  // namespace adgt
