// Comm over MPI for host tensors (the CPU backend, and the shared-GPU test
// mode with host staging). Semantics in docs/parallel.md:
//   - all_reduce, reduce_scatter, all_gather are ring algorithms over
//     point-to-point messages (parallel/comm/ring.hpp), so results are
//     deterministic and bit-identical on every rank; reductions accumulate in
//     the tensor's dtype (F32 sums in fp32), order: received + own.
//   - Each of them is one RingOp, a state machine over the ring's steps: the
//     blocking call starts one and drives it to the end, start_* returns it
//     as a Work. Every call on the group (blocking ones too) moves every
//     pending op along, so ranks waiting on different ops never deadlock, and
//     progress() does the same from the pipeline's helper thread. Op k of the
//     group uses its own tag (2 + k mod 32000) on the private ring
//     communicator, so pending ops never take each other's messages.
//   - broadcast is a pipelined chain from the root; send/recv, all_to_all(v)
//     and barrier map to MPI calls.
//   - stats().bytes counts the payload bytes this rank sent; stats().seconds
//     the wall time inside the calls.
//   - A group of one copies (where out != in) and sends nothing.
// Every call is collective over the group except send/recv. Only the thread
// that initialised MPI may call (MPI_THREAD_FUNNELED).
// Watchdog (parallel/fault/progress.hpp, docs/reliability.md): each MpiComm
// registers a progress slot; every collective takes the group's next
// sequence number (#1, #2, ... in call order, the same on every member), every
// send/recv the next point-to-point number, and every blocking wait publishes
// (op, number, peer, since) with relaxed atomic stores for the watchdog thread.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include <map>

#include "core/comm.hpp"
#include "parallel/fault/progress.hpp"
#include "parallel/comm/ring.hpp"

namespace adgt {

// How long a rank waiting in an MpiComm call (after a short spin) sleeps
// between polls, process-wide: 50 us by default. The emulation's virtual
// clock (parallel/emulate/, docs/emulation.md) sets it longer: waiting costs
// no time there, and fewer wake-ups leave the computing ranks' cores (and
// caches) alone.
void set_mpi_poll_interval_us(int us);
// How long a wait polls without sleeping (after its 200 polls): 0 (the
// default) sleeps from then on. adgt-train sets 2 ms where each rank has
// cores of its own (local ranks x threads <= the host's cores; the
// environment's ADGT_MPI_SPIN_US overrides): with sleeps between polls the
// fragments of a 1 MiB tensor-parallel all-reduce on 2 ranks moved one per
// wake-up, 1.7-1.9 ms each (0.3 ms spin), against 0.34-0.41 ms with a 3 ms
// spin and 0.55 ms for MPI_Allreduce (docs/simulator.md, "On real CPU ranks").
void set_mpi_spin_us(int us);
// Whether the host has a core beyond its ranks' threads (default true;
// adgt-train sets it at start-up): without one, the pipeline's send helper
// (executor.cpp) polls every 200 us instead of 20, since each poll takes the
// core from its own rank's compute (pp2 on 2 cores: 1.30 s a step at 20 us,
// 1.16 s at 200 us).
void set_host_spare_core(bool spare);
bool host_spare_core();
int mpi_poll_interval_us();

// MPI_Wait(s) that stop spinning: a short spin of MPI_Test, then a test every
// mpi_poll_interval_us(). Every MpiComm call and agree_max wait through these
// (collectives are started non-blocking; communicators are created with
// MPI_Comm_idup, or after a polite barrier for MPI_Comm_split), so a rank that
// waits for busy peers sleeps instead of spinning in Open MPI's progress loop
// (docs/testing.md: with OMPI_MCA_mpi_yield_when_idle=0, 8 ranks on 2 cores
// take 3.3 s beside two busy processes where Open MPI's default, which yields
// in every poll, takes 8.7 s).
void mpi_wait_politely(MPI_Request& req, MPI_Status* st = MPI_STATUS_IGNORE);
void mpi_wait_all_politely(std::vector<MPI_Request>& reqs);

class MpiComm final : public Comm {
 public:
  // Wraps `comm` (freed on destruction when `owned`); makes a private
  // duplicate for the ring traffic so it never meets send/recv messages.
  MpiComm(MPI_Comm comm, std::string name, bool owned);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  // A duplicate of MPI_COMM_WORLD, owned.
  static std::unique_ptr<MpiComm> world(const std::string& name = "world");
  // MPI_Comm_split of this group (collective): ranks with equal color form a
  // group, ordered by key.
  std::unique_ptr<MpiComm> split(int color, int key, const std::string& name) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }
  // The members as MPI_COMM_WORLD ranks, in group-rank order.
  const std::vector<int>& world_ranks() const { return world_of_; }
  // Bytes this rank handed to the transport for each group rank since the
  // communicator was made (every call; reset_stats leaves them): what the
  // emulation counts as crossing the WAN (parallel/emulate/emulated_comm.hpp).
  const std::vector<int64_t>& bytes_sent_to() const { return sent_to_; }

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
  void progress() override;
  bool progress_from_thread() const override;
  void set_wait_hook(std::function<void()> hook) override { wait_hook_ = std::move(hook); }
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override;

  // Set-up helpers, not counted in stats(): every rank's string, in group-rank
  // order; gather_strings returns them on `root` only (empty elsewhere).
  std::vector<std::string> all_gather_strings(const std::string& mine) const;
  std::vector<std::string> gather_strings(const std::string& mine, int root) const;

 private:
  struct RingOp;    // one ring collective in flight (mpi_comm.cpp)
  struct RingWork;  // its Work
  // A ring op over `n` elements of `dt`: with `in`, a reduce-scatter of in
  // whose reduced chunk rank() goes to `rs_out` (which may alias in's chunk
  // rank()); with `ag_base`, then an all-gather in place in ag_base (chunk
  // rank() filled, the others get filled). Registered as pending.
  std::shared_ptr<RingOp> start_ring(const char* in, char* rs_out, char* ag_base, int64_t n,
                                     DType dt, ReduceOp op);
  bool advance(RingOp& op);     // posts, tests and reduces; true once op is complete
  void advance_pending();       // every pending op, in start order; drops completed ones
  void run_until(const RingOp& op);  // drives every pending op until `op` completes
  void post_step(RingOp& op);
  // MPI_Wait that stops spinning after a while (send/recv of pipeline stages).
  // Runs the wait hook between tests.
  void wait_politely(MPI_Request& req, MPI_Status* st);

  int64_t next_seq() const {  // the group's next collective number (one writer: the calling thread)
    const int64_t s = slot_->seq.load(std::memory_order_relaxed) + 1;
    if (s == stall_at_) stall_forever();
    slot_->seq.store(s, std::memory_order_relaxed);
    return s;
  }
  // Fault injection for the watchdog's test (tests/fault/): with
  // ADGT_TEST_STALL=<MPI_COMM_WORLD rank>:<group name>:<seq>, that rank's
  // calling thread stops for good before collective #seq of that group, as
  // on a stuck device: alive (its watchdog heartbeats) but not progressing.
  [[noreturn]] void stall_forever() const;
  int64_t next_p2p() const {
    const int64_t s = slot_->p2p.load(std::memory_order_relaxed) + 1;
    slot_->p2p.store(s, std::memory_order_relaxed);
    return s;
  }

  std::shared_ptr<fault::GroupSlot> slot_;  // the watchdog's view of this group
  std::vector<int> world_of_;                // group rank -> MPI_COMM_WORLD rank
  int64_t stall_at_ = -1;                    // ADGT_TEST_STALL's seq for this rank and group
  MPI_Comm comm_ = MPI_COMM_NULL;  // send/recv, MPI collectives
  MPI_Comm ring_ = MPI_COMM_NULL;  // ring traffic (a private duplicate)
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<std::shared_ptr<RingOp>> pending_ops_;  // started, not complete, in start order
  std::vector<std::vector<char>> scratch_pool_;       // scratch of completed ops, for reuse
  int64_t ops_started_ = 0;
  std::function<void()> wait_hook_;
  std::map<int64_t, std::vector<MPI_Request>> pending_;  // isend id -> its requests
  int64_t next_send_id_ = 1;
  std::vector<int64_t> sent_to_;  // (size) bytes_sent_to()
};

}  // namespace adgt
