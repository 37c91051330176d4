// Comm over NCCL for device tensors (built only with CUDA; needs one GPU per
// rank: NCCL refuses two ranks of a communicator on one GPU).
//
// Made collectively over an MPI group: group rank 0 creates the NCCL unique id,
// MPI broadcasts it, every rank selects its device (cudaSetDevice) and joins
// with ncclCommInitRank. Every operation is enqueued on the communicator's
// stream; when `blocking` (the default) it then waits for the stream, so the
// call returns with the result in place like MpiComm and stats().seconds is
// the real time. stats().bytes uses the ring formulas of parallel/ring.hpp
// (what NCCL's ring algorithm sends), and payload bytes for the others.
//
// Determinism: for a fixed NCCL version, group size and algorithm, NCCL's
// reductions give the same bits run to run and on every rank; pin
// NCCL_ALGO=Ring NCCL_PROTO=Simple to keep them when machines differ.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "core/comm.hpp"
#include "parallel/mpi_comm.hpp"

namespace adgt {

class NcclComm final : public Comm {
 public:
  // Collective over `group`. The stream must belong to `device`; nullptr
  // makes (and later destroys) a non-blocking stream of its own.
  NcclComm(const MpiComm& group, int device, cudaStream_t stream = nullptr, bool blocking = true);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t handle() const { return comm_; }

  // F32, F64, I32, and BF16 (NCCL reduces bf16 natively).
  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor t, int root) override;
  void send(const Tensor& t, int peer, int tag = 0) override;  // tag ignored: NCCL orders by call
  void recv(Tensor t, int peer, int tag = 0) override;
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override;  // a one-element all-reduce, then a stream wait

 private:
  void finish();  // waits for the stream when blocking

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false, blocking_ = true;
  int rank_ = 0, size_ = 1, device_ = 0;
  std::string name_;
  void* barrier_buf_ = nullptr;  // (1) float on the device
};

// cuda_device_uuid(device): kernels/backend.hpp.

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
