// The collective interface that model math and the training engine use.
// core declares it; parallel/ implements it over MPI (host tensors) and NCCL
// (device tensors). A single-process run uses SelfComm (size 1, no-ops).
//
// Chunked collectives use contiguous chunks in rank order: reduce_scatter's
// input is size()*n elements and rank r keeps the reduced chunk r; all_gather
// puts rank r's n elements at chunk r of the output.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace adgt {

enum class ReduceOp { Sum, Max };

// A started collective (Comm::start_*). test() moves it along and says whether
// it has completed; wait() completes it, rethrowing a transport error. A
// default-constructed Work is complete: a transport without asynchronous
// collectives runs them inside start_* and returns one.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;
    virtual void wait() = 0;
  };
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool test() {
    if (impl_ && impl_->test()) impl_.reset();
    return !impl_;
  }
  void wait() {
    if (impl_) impl_->wait();
    impl_.reset();
  }
  bool pending() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

struct CommStats {
  int64_t bytes = 0;     // bytes this rank sent (payload handed to the transport)
  int64_t calls = 0;
  double seconds = 0;    // wall time inside collectives
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // group name: "world", "tp", "dp", "pp", "ep"

  // In place; F32, F64 or I32. Reductions of floating point tensors are
  // deterministic: the same inputs give bit-identical results on every rank.
  virtual void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  virtual void reduce_scatter(Tensor out, const Tensor& in) = 0;  // in: size()*n, out: n
  virtual void all_gather(Tensor out, const Tensor& in) = 0;      // in: n, out: size()*n
  virtual void broadcast(Tensor t, int root) = 0;
  // Asynchronous forms of the three above. Works on one group must be started
  // in the same order on every rank of it; they may complete in any order, and
  // blocking calls may be made while some are pending (a transport keeps them
  // moving inside its calls and in progress()). The tensors must stay
  // untouched until the Work has completed. Results are bit-identical to the
  // blocking calls. The default runs the blocking call and returns a complete
  // Work (synchronous transports and decorators keep working unchanged).
  virtual Work start_all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) {
    all_reduce(t, op);
    return {};
  }
  virtual Work start_reduce_scatter(Tensor out, const Tensor& in) {
    reduce_scatter(out, in);
    return {};
  }
  virtual Work start_all_gather(Tensor out, const Tensor& in) {
    all_gather(out, in);
    return {};
  }
  virtual void send(const Tensor& t, int peer, int tag = 0) = 0;
  virtual void recv(Tensor t, int peer, int tag = 0) = 0;
  // Non-blocking send (pipeline stages): returns an id at once; t's memory must
  // stay unchanged until send_done(id) is true or wait_sends() has returned.
  // The default sends at once (blocking), for transports without it.
  virtual int64_t isend(const Tensor& t, int peer, int tag = 0) {
    send(t, peer, tag);
    return 0;
  }
  virtual bool send_done(int64_t /*id*/) { return true; }
  virtual void wait_sends() {}  // every isend of this group has completed
  // A step of a ring (context parallelism, parallel/cp/ring_attention.hpp):
  // sends `out` to rank `to` and receives `in` from rank `from`, each list
  // in its order, all started now; the Work completes once every message of
  // `in` has arrived and every isend of this group (these and earlier ones)
  // has completed. Until then nothing in `in` may be read and nothing in
  // `out` written. Messages between two ranks must be sent and received in
  // the same order (NCCL matches by order; the tags are MPI's). The default
  // isends `out` at once and does the receives and wait_sends() in wait():
  // a buffered transport (MPI) moves the sends meanwhile. NCCL overrides it
  // with one group of every send and receive on its communication stream,
  // beside the compute that follows (the transfer overlaps it).
  struct Message {
    Tensor t;
    int tag = 0;
  };
  virtual Work start_exchange(const std::vector<Message>& out, int to,
                              const std::vector<Message>& in, int from);
  // Moves pending isends and started collectives along (a transport that
  // needs its own calls to progress a message); callable from another thread while the calling
  // thread makes no call on any Comm, when progress_from_thread() says so.
  virtual void progress() {}
  virtual bool progress_from_thread() const { return false; }
  // Point-to-point with rendezvous semantics (NCCL): a send completes only
  // together with its receive, operations run in issue order on one stream,
  // and messages between two ranks match by order, not by tag. The pipeline
  // executor then runs pp::for_rendezvous of its schedule
  // (parallel/pipeline/grouped.hpp). False: sends are buffered (MPI).
  virtual bool rendezvous_sends() const { return false; }
  // Called over and over, on the calling thread, while a blocking recv or
  // wait_sends of this group waits for its peer (a pipeline bubble): the
  // pipeline executor moves the data-parallel reduction along in that time.
  // Empty: none. A transport that never waits may ignore it.
  virtual void set_wait_hook(std::function<void()> hook) { (void)hook; }
  // Emulated transports (parallel/emulate/emulated_comm.hpp) keep a modelled
  // clock: its time now, the modelled end of the last collective completed
  // on this group (both < 0: not modelled), and issue_at(t): the next
  // collective started on this group was issued at t (<= now) by a stream
  // that launches a chain of collectives back to back (the hierarchical
  // reduction's phases, parallel/comm/site_comm.hpp), so it enters at t.
  // Other transports ignore them.
  virtual double modelled_now() const { return -1; }
  virtual double modelled_end() const { return -1; }
  virtual void issue_at(double /*t*/) {}
  virtual void all_to_all(Tensor out, const Tensor& in) = 0;      // size()*n each; chunk r -> rank r
  // Element counts and displacements per rank.
  virtual void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, const Tensor& in,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs) = 0;
  virtual void barrier() = 0;

  // Virtual so that a decorator (parallel/comm/device_comm.hpp) reports its transports'.
  virtual const CommStats& stats() const { return stats_; }
  virtual void reset_stats() { stats_ = {}; }

 protected:
  CommStats stats_;
};

// A group of one: every collective is the identity (copies where in != out).
class SelfComm final : public Comm {
 public:
  explicit SelfComm(std::string name = "self") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(Tensor, ReduceOp) override {}
  void reduce_scatter(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor, int) override {}
  void send(const Tensor&, int, int) override;
  void recv(Tensor, int, int) override;
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& rc, const std::vector<int64_t>& rd,
                   const Tensor& in, const std::vector<int64_t>& sc,
                   const std::vector<int64_t>& sd) override;
  void barrier() override {}

 private:
  std::string name_;
};

}  // namespace adgt
