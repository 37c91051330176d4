// Link emulation (docs/emulation.md): a Comm decorator that makes every call
// of a group take at least the time the cluster model (parallel/cluster/
// collectives.hpp) gives it on an emulated cluster, with the numbers of the
// inner transport unchanged, bit for bit. World rank r (the layout rank,
// parallel/cluster/placement.hpp) is device EmulatedRank::device(r) of the cluster,
// on node device / devices_per_node: by default device r; the run's
// Emulation (emulation.hpp) maps each layout rank to the device its launcher
// rank got under emulate.rank_order. Times are CLOCK_MONOTONIC (clock.hpp),
// so every rank must run on one host.
//
// Delay rules (each a pure function of the cluster, the group and the bytes):
//  - send/isend to group rank q (world rank w): departure = max(now,
//    free[w]), arrival = departure + message_time(me, w, bytes) (times
//    emulate.slow_links' factor of the link to w), and free[w]
//    = arrival: consecutive messages to one peer go one after another, as
//    on one NCCL stream (and as parallel/sim/ step_sim.cpp sends them).
//    free[] is per process, shared by every group of the rank. The arrival
//    and departure times travel ahead of the payload in a 16-byte header on
//    the same tag (control channel, below); the receiver adds arrival −
//    departure to its link times (EmulatedRank::link_in). recv returns at max(real
//    arrival, arrival); a send (blocking, or an isend in send_done and
//    wait_sends) completes at max(real completion, arrival).
//  - collectives: each member's entry time (and its byte count) are reduced
//    with MAX over the control channel, started before the operation itself.
//    The group runs its collectives one after another, as an NCCL stream
//    does: begin_k = max(last entry_k, end_{k-1}), end_k = begin_k +
//    collective_time(kind, members, bytes_k). A blocking call returns at
//    max(real end, end_k); a started one's Work is complete once the inner
//    Work and the entry reduction are and now >= end_k (test() never blocks,
//    so start_* stays asynchronous). Every member computes the same end_k.
//    Bytes: all-reduce and broadcast the tensor, reduce-scatter its input,
//    all-gather its output, all-to-all the send buffer; all_to_allv the
//    largest member's max(bytes sent to others, bytes received from others)
//    x p/(p-1) (for an even all_to_allv exactly its all_to_all's bytes);
//    barrier an all-reduce of 0 bytes.
// The control channel (arrival headers, entry reductions) is a private
// duplicate of the group when given, so the inner's tags and stats() are
// those of a run without emulation; without one the inner carries it too.
#pragma once
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/emulate/clock.hpp"

namespace adgt::emulate {

// What the emulated groups of one process share: the cluster, this rank's
// world rank, each world rank's device of the cluster, when each outgoing
// link is free again, and the time spent inside emulated calls on the calling
// thread (ComputeSlowdown subtracts it).
struct EmulatedRank {
  EmulatedRank(cluster::Cluster c, int rank, std::vector<int> devices = {},
               ClockKind clock_kind = ClockKind::Wall, double model_flops = 0)
      : cluster(std::move(c)), world_rank(rank), device_of(std::move(devices)),
        clock(clock_kind, model_flops) {}
  cluster::Cluster cluster;
  int world_rank = 0;
  // Per world rank: its device of the cluster (node = device /
  // devices_per_node); empty: world rank r is device r.
  std::vector<int> device_of;
  int device(int rank) const {
    return device_of.empty() || rank < 0 || rank >= int(device_of.size()) ? rank
                                                                          : device_of[size_t(rank)];
  }
  // The rank's clock (clock.hpp): every time below is on it. Constructed on
  // the training thread.
  Clock clock;
  std::map<int, double> link_free_at;      // destination world rank -> clock time when free
  // The ranks that send pipeline messages at once (world / pp): a message
  // across the WAN shares it with them (cluster::message_time); 0: a node's.
  int64_t wan_senders = 0;
  // emulate.slow_links in force: peer world rank -> factor on the time of
  // every message to it (Emulation::at_step sets it; absent: 1).
  std::map<int, double> link_slowdown;
  // What this rank's received messages took on their links (arrival −
  // departure, the sender's link time, queueing excluded), per group name and
  // group rank of the sender, since the start (never cleared: each reader
  // takes differences, Emulation::take_link_times, so none takes another's
  // samples).
  struct LinkTime {
    double seconds = 0;
    int64_t messages = 0;
    double bytes = 0;
  };
  std::map<std::pair<std::string, int>, LinkTime> link_in;
  double comm_seconds = 0;                 // inside emulated calls (outermost only), clock seconds
  // Bytes this rank's transports sent to ranks of another site (docs/sites.md):
  // the live groups' (EmulatedComm::wan_bytes_sent) plus those of groups
  // already gone (a layout switch reads the total before it tears the groups
  // down and hands it to the next emulation here).
  std::vector<const class EmulatedComm*> groups;
  double wan_bytes_gone = 0;
  double wan_bytes_sent() const;
  int depth = 0;                           // emulated calls in progress on this thread
  // ADGT_EMULATE_TRACE=DIR: each collective, message and wait of this rank
  // as a JSON line, clock times (DIR/emulate_rank_<world rank>.jsonl; the
  // emulation's setup opens it). nullptr: no trace.
  std::FILE* trace = nullptr;
  ~EmulatedRank() {
    if (trace) std::fclose(trace);
  }
};

class EmulatedComm final : public Comm {
 public:
  // inner: the group's transport (not owned). members: the group's world
  // ranks in group-rank order (group_ranks() of core/layout.hpp), each one
  // mapped by rank->device() to a device of rank->cluster. control: the
  // emulation's own messages (owned; nullptr: inner carries them).
  EmulatedComm(Comm& inner, std::shared_ptr<EmulatedRank> rank, std::vector<int> members,
               std::unique_ptr<Comm> control = nullptr);
  ~EmulatedComm() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  const std::vector<int>& members() const { return members_; }
  Comm& inner() { return inner_; }  // the transport it delays
  // The time of this group's collectives when not collective_time over its
  // members' devices: (the cluster now, kind, the members' devices, bytes)
  // -> seconds. The cross-site group of a SiteComm (parallel/comm/
  // site_comm.hpp) is delayed by cluster::cross_site_time, which knows the
  // other places' cross groups share the WAN with it.
  using Timer = std::function<double(const cluster::Cluster&, cluster::Collective,
                                     const std::vector<int>&, double)>;
  void set_timer(Timer t) { timer_ = std::move(t); }

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
  void set_wait_hook(std::function<void()> hook) override;
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override;

  // The inner's bytes and calls; seconds: wall time inside this group's calls
  // (the emulated delays included).
  const CommStats& stats() const override;
  void reset_stats() override;

  // Bytes the inner MPI transport sent to members on another site than this
  // rank's (its per-peer counts, MpiComm::bytes_sent_to; 0 for another
  // transport or one site).
  double wan_bytes_sent() const;

  double modelled_now() const override { return rank_->clock.now(); }
  double modelled_end() const override { return free_at_ > 0 ? free_at_ : -1; }
  void issue_at(double t) override { issue_at_ = t; }

  // The model's end time of the last collective resolved on this group
  // (the rank's clock; 0 before any): what the tests compare against.
  double last_collective_end() const { return free_at_; }

 private:
  struct Timing;  // one collective's entry reduction and emulated end
  struct EmuWork;
  class Busy;     // times a call (stats, EmulatedRank::comm_seconds)

  Comm& control() { return control_ ? *control_ : inner_; }
  // Records this member's entry and starts the entry reduction.
  std::shared_ptr<Timing> enter(cluster::Collective c, double bytes);
  // Resolves queued timings in order up to `t`; block: waits for their entry
  // reductions, else stops at the first that is not complete. True once t is resolved.
  bool resolve(const Timing& t, bool block);
  template <class Op> void blocking(cluster::Collective c, double bytes, Op&& op);
  template <class Op> Work started(cluster::Collective c, double bytes, Op&& op);
  // Departure rule; updates the link. departure_out: the message's departure time.
  double arrival_of(int peer, double bytes, double* departure_out = nullptr);
  // ADGT_EMULATE_TRACE: a wait (or an isend's arrival) of this rank.
  void trace_wait(const char* what, double until, int peer = -1, double bytes = 0);

  Comm& inner_;
  std::shared_ptr<EmulatedRank> rank_;
  std::vector<int> members_;
  std::vector<int> devices_;  // the members' devices of the cluster (EmulatedRank::device)
  std::unique_ptr<Comm> control_;
  std::deque<std::shared_ptr<Timing>> queue_;  // entered, end not yet known, start order
  double free_at_ = 0;                         // end of the last resolved collective
  double issue_at_ = -1;                       // issue_at(): the next collective's entry
  std::function<void()> wait_hook_;
  Timer timer_;
  struct PendingSend {
    int64_t inner_id = 0, control_id = 0;
    double arrival = 0;
    std::unique_ptr<double[]> header;  // arrival, departure
  };
  std::map<int64_t, PendingSend> sends_;
  int64_t next_send_ = 1;
  double seconds_ = 0;
  mutable CommStats merged_;
};

}  // namespace adgt::emulate
