// A Comm decorator that puts every blocking call of a group on the rank's
// timeline (core/trace.hpp, track "collectives"): all-reduces, gathers,
// all-to-alls, broadcasts, barriers, sends and receives, each a span named
// "<call> <group>" with its bytes. Started (asynchronous) collectives and
// isends are instants; their waits are the callers' spans (the data-parallel
// wait, WaitSends). Only wrapped around the groups of a run with log.trace,
// outermost (it sees the calls the engine makes); while the recorder is off
// every call goes straight through. Results are the inner transport's.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"

namespace adgt {

class TracedComm final : public Comm {
 public:
  explicit TracedComm(Comm& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }

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
  bool send_done(int64_t id) override { return inner_.send_done(id); }
  void wait_sends() override;
  // An instant (its wait is the caller's), the inner transport's exchange.
  Work start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                      int from) override;
  void progress() override { inner_.progress(); }
  bool progress_from_thread() const override { return inner_.progress_from_thread(); }
  bool rendezvous_sends() const override { return inner_.rendezvous_sends(); }
  void set_wait_hook(std::function<void()> hook) override { inner_.set_wait_hook(std::move(hook)); }
  void all_to_all(Tensor out, const Tensor& in) override;
  void all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, const Tensor& in,
                   const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs) override;
  void barrier() override;
  const CommStats& stats() const override { return inner_.stats(); }
  void reset_stats() override { inner_.reset_stats(); }

 private:
  Comm& inner_;
};

}  // namespace adgt
