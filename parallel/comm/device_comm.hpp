// Collectives of a group whose tensors may live in device memory (the CUDA
// and the emulated backend). Host tensors (flags, counts, the MoE bias table)
// go to the group's MPI communicator as they are; device tensors
//   - go to NCCL over the same group when there is one (one GPU per rank), or
//   - are staged through host memory: copied out with the backend's to_host,
//     handed to the MPI communicator, copied back with to_device ("mpi
//     (host-staged)": ranks sharing one GPU, where NCCL refuses to run, and
//     the emulated device).
// Results are those of the underlying transport, bit for bit (staging copies
// bytes). Asynchronous collectives stay asynchronous: start_* copies out and
// starts the MPI op on the host copy; the copy back happens when the Work
// completes (test() or wait(), on the calling thread). progress() moves host
// buffers only, so the pipeline's helper thread never touches device memory.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "kernels/backend.hpp"

namespace adgt {

class DeviceComm final : public Comm {
 public:
  // host: the MPI group; device: a device transport over the same group
  // (NcclComm) or nullptr to stage device tensors through host memory.
  DeviceComm(Comm& host, Backend& be, std::unique_ptr<Comm> device = nullptr);
  ~DeviceComm() override;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  // "nccl" or "mpi (host-staged)", for the rank table.
  std::string transport() const { return device_ ? "nccl" : "mpi (host-staged)"; }
  Comm& host() { return host_; }      // the group's MPI transport (or its emulation)
  bool has_device_transport() const { return device_ != nullptr; }
  // The host transport's modelled clock (an emulated group's; parallel/comm/site_comm.hpp
  // chains its phases on it).
  double modelled_now() const override { return host_.modelled_now(); }
  double modelled_end() const override { return host_.modelled_end(); }
  void issue_at(double t) override { host_.issue_at(t); }

  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  Work start_all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  Work start_reduce_scatter(Tensor out, const Tensor& in) override;
  Work start_all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor t, int root) override;
  void send(const Tensor& t, int peer, int tag = 0) override;
  void recv(Tensor t, int peer, int tag = 0) override;
  int64_t isend(const Tensor& t, int peer, int tag = 0) override;
  bool send_done(int64_t id) override;
  void wait_sends() override;
  // Device tensors on NCCL: its exchange; otherwise the staged isend / recv.
  Work start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                      int from) override;
  void progress() override { host_.progress(); }
  bool progress_from_thread() const override { return host_.progress_from_thread(); }
  bool rendezvous_sends() const override { return device_ && device_->rendezvous_sends(); }
  void set_wait_hook(std::function<void()> hook) override;
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override { host_.barrier(); }

  // The transports' counters together, plus the staging copies' time.
  const CommStats& stats() const override;
  void reset_stats() override;

 private:
  // Where a call's tensors are: all on the host, or all on the device (a mix
  // is an error naming the call).
  bool on_device(std::initializer_list<const Tensor*> ts, const char* op) const;
  // A host tensor of t's dtype and shape backed by buf, filled from t when copy.
  Tensor stage(const Tensor& t, std::vector<char>& buf, bool copy);
  void unstage(const Tensor& dev, const Tensor& host);
  Work start_staged(Tensor out, const Tensor* in,
                    const std::function<Work(Tensor, const Tensor&)>& start);
  // A group of one: out = in on the device (none when they alias); true if alone.
  bool alone_copy(Tensor out, const Tensor& in);

  Comm& host_;
  Backend& be_;
  std::unique_ptr<Comm> device_;
  mutable CommStats merged_;
  double staging_seconds_ = 0;
  // isend ids of this comm: which transport, its id there, the host copy.
  struct PendingSend {
    bool on_device_transport = false;
    int64_t inner_id = 0;
    std::vector<char> buf;
  };
  std::map<int64_t, PendingSend> sends_;
  int64_t next_send_ = 1;
};

// An NcclComm over `group` (an MpiComm) on the CUDA backend's device and
// stream (so it is ordered after the compute that made its tensors, and the
// compute after it); blocking. nullptr when the build has no NCCL.
std::unique_ptr<Comm> make_nccl_comm(Comm& group, Backend& be);

}  // namespace adgt
