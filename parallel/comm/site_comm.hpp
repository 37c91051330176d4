// The hierarchical reduction of a group whose ranks span sites (datacenters
// joined by a wide-area link; docs/sites.md): a Comm decorator that runs the
// group's all-reduce, reduce-scatter and all-gather in three phases so each
// byte crosses the WAN once —
//   1. reduce-scatter inside each site (the `local` group: this rank's site's
//      members, k of them, in group order),
//   2. the cross-site exchange of each member's 1/k shard (the `cross`
//      group: the members holding the same place i inside their sites, one
//      per site, in site order): an all-reduce of the shard for an
//      all-reduce, a reduce-scatter / all-gather of it for the other two,
//   3. all-gather inside each site.
// Every site must hold the same number of the group's members (k); sites in
// the order of their first member. The reduce-scatter's chunk r and the
// all-gather's chunk r are group rank r's, as in the flat collectives
// (core/comm.hpp): the inputs are permuted so that local member i reduces
// the chunks of the ranks at place i of every site.
//
// Numbers: a sum in a different order than the flat ring's (parallel/comm/
// ring.hpp), so equal to it within rounding (docs/sites.md gives the measured
// bound); deterministic, and every member ends with the same bits. Max
// all-reduces, broadcasts, messages, all-to-alls and barriers go to the full
// group unchanged.
//
// Device tensors (a DeviceComm group, `be` given: CUDA with NCCL sub-groups,
// or the emulated device staging through MPI): the scratch is the backend's
// memory (kept between collectives, reused by size) and the permutations and
// copy-backs are the backend's copies, ordered on its stream before and after
// the phases; host tensors take host scratch as without `be`.
//
// Started collectives (start_*) queue their phases; phases start in one
// fixed order on every rank (op by op, each after its own previous phase has
// completed and the previous op's last phase has started), so the sub-groups
// see the same call order everywhere. test(), wait() and progress() move
// them along.
#pragma once
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/site_split.hpp"
#include "kernels/backend.hpp"

namespace adgt {

class SiteComm final : public Comm {
 public:
  // full: the group itself (not owned). local: this rank's site's members
  // by place; cross: the members at this rank's place, by site (both owned,
  // sub-groups of full made by the caller, e.g. MpiComm::split). keep: what
  // local and cross use and must outlive them (their transports under a
  // decorator), destroyed after them.
  // be: the backend whose device memory the group's tensors may live in
  // (nullptr: host memory only).
  SiteComm(Comm& full, SiteSplit split, std::unique_ptr<Comm> local, std::unique_ptr<Comm> cross,
           std::vector<std::unique_ptr<Comm>> keep = {}, Backend* be = nullptr);
  ~SiteComm() override;

  int rank() const override { return full_.rank(); }
  int size() const override { return full_.size(); }
  std::string name() const override { return full_.name(); }
  const SiteSplit& split() const { return split_; }
  Comm& local() { return *local_; }
  Comm& cross() { return *cross_; }

  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(Tensor out, const Tensor& in) override;
  void all_gather(Tensor out, const Tensor& in) override;
  Work start_all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  Work start_reduce_scatter(Tensor out, const Tensor& in) override;
  Work start_all_gather(Tensor out, const Tensor& in) override;
  void broadcast(Tensor t, int root) override { full_.broadcast(t, root); }
  void send(const Tensor& t, int peer, int tag = 0) override { full_.send(t, peer, tag); }
  void recv(Tensor t, int peer, int tag = 0) override { full_.recv(t, peer, tag); }
  int64_t isend(const Tensor& t, int peer, int tag = 0) override { return full_.isend(t, peer, tag); }
  Work start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                      int from) override {
    return full_.start_exchange(out, to, in, from);
  }
  bool send_done(int64_t id) override { return full_.send_done(id); }
  void wait_sends() override { full_.wait_sends(); }
  void progress() override;
  bool progress_from_thread() const override;
  bool rendezvous_sends() const override { return full_.rendezvous_sends(); }
  void set_wait_hook(std::function<void()> hook) override { full_.set_wait_hook(std::move(hook)); }
  void all_to_all(Tensor out, const Tensor& in) override { full_.all_to_all(out, in); }
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override {
    full_.all_to_allv(out, recv_counts, recv_displs, in, send_counts, send_displs);
  }
  void barrier() override { full_.barrier(); }

  // bytes and calls: the full group's plus both sub-groups'; seconds: the
  // full group's plus the wall time inside the hierarchical calls.
  const CommStats& stats() const override;
  void reset_stats() override;

 private:
  struct Op;
  struct OpWork;
  Work enqueue(std::shared_ptr<Op> op);
  // Starts every phase the order allows and retires completed ops; block:
  // waits for the first op's current phase before trying again, until `until`
  // (null: nothing) is done.
  void advance(const Op* until, bool block);
  // Scratch of `bytes`: host (op's vectors) or, for device tensors, a kept
  // device buffer of at least that size; and copies within the same kind.
  char* scratch(Op& op, int which, DType dt, int64_t n, bool device, bool zeroed);
  void copy_bytes(bool device, void* dst, const void* src, DType dt, int64_t n);
  bool on_device(const Tensor& t) const { return be_ && t.data && be_->is_device_pointer(t.data); }

  Comm& full_;
  SiteSplit split_;
  Backend* be_ = nullptr;
  std::vector<Buffer> pool_;  // device scratch no op holds, reused by size
  std::vector<std::unique_ptr<Comm>> keep_;  // before local_ and cross_: destroyed after them
  std::unique_ptr<Comm> local_, cross_;
  std::deque<std::shared_ptr<Op>> queue_;  // started ops, start order; done ones leave the front
  double seconds_ = 0;
  mutable CommStats merged_;
};

}  // namespace adgt
