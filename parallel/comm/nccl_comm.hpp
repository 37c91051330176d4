// Comm over NCCL for device tensors (built only with CUDA; needs one GPU per
// rank: NCCL refuses two ranks of a communicator on one GPU).
//
// Made collectively over an MPI group: group rank 0 creates the NCCL unique id,
// MPI broadcasts it, every rank selects its device (cudaSetDevice) and joins
// with ncclCommInitRank.
//
// Streams and order. Collectives run on
// the communicator's own stream, ordered against the compute stream (the
// backend's, whose kernels produce and consume the tensors) by events, with
// no host synchronisation per call:
//   - every operation first makes the communication stream wait for an event
//     recorded on the compute stream (its inputs are ready), then enqueues the
//     NCCL call(s), then records a `done` event;
//   - a blocking call (all_reduce, ..., recv) returns once the compute stream
//     waits for `done`: later kernels see the result; the host does not wait;
//   - start_* return a Work: test() asks whether `done` has passed, wait()
//     makes the compute stream wait for it (the data-parallel reducer's
//     overlap: the backward goes on computing while buckets reduce);
//   - isend queues the send; it is issued in one ncclGroupStart/End with the
//     next recv of this group (or at wait_sends, send_done or any other call),
//     so two stages that send to each other before receiving cannot deadlock
//     (grouped point-to-point, as torch's batch_isend_irecv);
//   - every NCCL group is closed by a guard, also when a call throws inside it.
// Errors: every call and every host wait polls ncclCommGetAsyncError; on an
// error, or when a host wait sees no progress for ADGT_NCCL_TIMEOUT_S seconds
// (default 600), the communicator is aborted (ncclCommAbort) and the call
// throws naming the group and the operation.
// Watchdog (parallel/fault/, docs/reliability.md): every enqueue takes the
// group's next sequence number (collectives; point-to-point counted apart) and
// every host wait publishes itself; the watchdog, before it ends the process,
// aborts the communicator (ncclCommAbort from its thread, as NCCL allows) so
// peers' NCCL calls fail instead of waiting. Compiles here; runs only on GPUs.
//
// stats(): bytes from the ring formulas of parallel/comm/ring.hpp (what NCCL's ring
// algorithm sends; payload bytes for the others); seconds = exposed
// communication: for every join, the device time the compute stream waited
// (an event recorded on the compute stream where the wait begins, against
// `done`), resolved when stats() is read.
//
// bf16 reductions: NCCL adds bf16 in fp32 and rounds at each hop of its ring;
// MpiComm's bf16 reduction (the host-staged path) follows the same rule, so
// the two agree within the bf16 contract measured on the CPU
// (scripts/compare_bf16.py bounds; check.sh stage 5 on a GPU).
//
// Determinism: for a fixed NCCL version, group size and algorithm, NCCL's
// reductions give the same bits run to run and on every rank; pin
// NCCL_ALGO=Ring NCCL_PROTO=Simple to keep them when machines differ.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "parallel/fault/progress.hpp"
#include "parallel/comm/mpi_comm.hpp"

namespace adgt {

class NcclComm final : public Comm {
 public:
  // Collective over `group` on `device`; `compute` is the stream whose work
  // produces and consumes the tensors (nullptr: the legacy default stream).
  NcclComm(const MpiComm& group, int device, cudaStream_t compute = nullptr);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return comm_stream_; }  // where the NCCL calls run
  ncclComm_t handle() const { return comm_; }

  // F32, F64, I32, and BF16 (NCCL reduces bf16 natively).
  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor t, int root) override;
  Work start_all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  Work start_reduce_scatter(Tensor out, const Tensor& in) override;
  Work start_all_gather(Tensor out, const Tensor& in) override;
  void send(const Tensor& t, int peer, int tag = 0) override;  // tag ignored: NCCL orders by call
  void recv(Tensor t, int peer, int tag = 0) override;
  int64_t isend(const Tensor& t, int peer, int tag = 0) override;
  bool send_done(int64_t id) override;
  bool rendezvous_sends() const override { return true; }
  void wait_sends() override;
  // One NCCL group on the communication stream (after the queued isends):
  // the sends to `to` and the receives from `from`, running beside the
  // compute stream's later work; wait() makes the compute stream wait for it.
  Work start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                      int from) override;
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override;  // a one-element all-reduce the host waits for

  const CommStats& stats() const override;  // counts the exposed time of past joins first
  void reset_stats() override;

  using Event = std::shared_ptr<CUevent_st>;  // a cudaEvent_t, destroyed with its last owner

 private:
  struct Send {
    Tensor t;
    int peer;
    int64_t id;
  };
  // Enqueues `issue` (NCCL calls; inside one NCCL group when `group`) on the
  // communication stream after the compute stream's work so far, queued
  // isends first; returns the event recorded after it.
  Event enqueue(const char* what, bool group, const std::function<void()>& issue);
  void join(const Event& done);                       // compute waits for done; exposure kept
  void host_wait(const Event& ev, const char* what);  // polls errors; times out
  void check_async(const char* what);                 // aborts and throws on an NCCL error
  [[noreturn]] void abort_and_throw(const char* what, const std::string& why);
  Event make_event();
  Work make_work(Event done, const char* what);
  void resolve_exposures() const;

  ncclComm_t comm_ = nullptr;
  cudaStream_t compute_ = nullptr, comm_stream_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  std::string name_;
  void* barrier_buf_ = nullptr;         // (1) float on the device
  std::vector<Send> unsent_;            // isends not issued yet
  std::map<int64_t, Event> in_flight_;  // issued isends: id -> their group's done event
  int64_t next_send_ = 1;
  double timeout_s_ = 600;
  std::shared_ptr<fault::GroupSlot> slot_;  // the watchdog's view of this group
  int abort_hook_ = 0;                      // fault::add_abort_hook's id
  struct Exposure {
    Event wait_at, done;
  };
  mutable std::vector<Exposure> exposures_;  // joins whose wait is not counted yet
  mutable double exposed_s_ = 0;             // their resolved wait, seconds
  mutable CommStats shown_;                  // stats_ plus exposed_s_
};

}  // namespace adgt

// Every CUDA and NCCL call of the parallel layer goes through these: a failure
// throws naming the call, the error string, the rank, the host, file and line.
#define ADGT_CUDA(call)                                                              \
  do {                                                                               \
    const cudaError_t adgt_cuda_rc_ = (call);                                        \
    if (adgt_cuda_rc_ != cudaSuccess)                                                \
      ::adgt::gpu_call_failed(#call, cudaGetErrorString(adgt_cuda_rc_), __FILE__, __LINE__); \
  } while (0)
#define ADGT_NCCL(call)                                                              \
  do {                                                                               \
    const ncclResult_t adgt_nccl_rc_ = (call);                                       \
    if (adgt_nccl_rc_ != ncclSuccess)                                                \
      ::adgt::gpu_call_failed(#call, ncclGetErrorString(adgt_nccl_rc_), __FILE__, __LINE__); \
  } while (0)

namespace adgt {
[[noreturn]] void gpu_call_failed(const char* call, const char* error, const char* file, int line);
}
