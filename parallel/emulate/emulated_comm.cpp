// The link emulation's Comm decorator (emulated_comm.hpp; docs/emulation.md).
#include "parallel/emulate/emulated_comm.hpp"

#include <algorithm>

#include "kernels/check.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/emulate/clock.hpp"

namespace adgt::emulate {

using cluster::Collective;

// One collective of the group: this member's entry time and bytes, reduced
// with MAX over the group, and the model's end once resolved.
struct EmulatedComm::Timing {
  Collective kind = Collective::AllReduce;
  double buf[2] = {0, 0};  // entry time, bytes; after the reduction their maxima
  double mine = 0;         // this member's entry time
  Work reduce;             // the entry reduction on the control channel
  bool resolved = false;
  double end = 0;
};

class EmulatedComm::Busy {
 public:
  explicit Busy(EmulatedComm& c) : c_(c) {
    c_.rank_->clock.pause();
    t0_ = c_.rank_->clock.now();
    ++c_.rank_->depth;
  }
  ~Busy() {
    const double dt = c_.rank_->clock.now() - t0_;
    c_.seconds_ += dt;
    if (--c_.rank_->depth == 0) c_.rank_->comm_seconds += dt;
    c_.rank_->clock.resume();
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  EmulatedComm& c_;
  double t0_ = 0;
};

// A started collective: complete once the inner Work and the entry reduction
// are and the model's end has passed.
struct EmulatedComm::EmuWork final : Work::Impl {
  EmuWork(EmulatedComm& c, std::shared_ptr<Timing> timing, Work w)
      : comm(c), t(std::move(timing)), inner(std::move(w)) {}
  bool test() override {
    Busy busy(comm);
    const bool inner_done = inner.test();
    if (!comm.resolve(*t, false)) return false;
    return inner_done && comm.rank_->clock.now() >= t->end;
  }
  void wait() override {
    Busy busy(comm);
    {
      CoreYield y(comm.rank_->clock);
      inner.wait();
      comm.resolve(*t, true);
    }
    comm.trace_wait("wait", t->end);
    comm.rank_->clock.wait_until(t->end);
  }
  EmulatedComm& comm;
  std::shared_ptr<Timing> t;
  Work inner;
};

EmulatedComm::EmulatedComm(Comm& inner, std::shared_ptr<EmulatedRank> rank,
                           std::vector<int> members, std::unique_ptr<Comm> control)
    : inner_(inner), rank_(std::move(rank)), members_(std::move(members)),
      control_(std::move(control)) {
  ADGT_CHECK(rank_, "EmulatedComm(" << inner_.name() << "): no emulated rank state");
  ADGT_CHECK(int(members_.size()) == inner_.size(),
             "EmulatedComm(" << inner_.name() << "): " << members_.size()
                             << " member ranks for a group of " << inner_.size());
  ADGT_CHECK(members_[size_t(inner_.rank())] == rank_->world_rank,
             "EmulatedComm(" << inner_.name() << "): group rank " << inner_.rank() << " is world rank "
                             << members_[size_t(inner_.rank())] << ", but this process is world rank "
                             << rank_->world_rank);
  for (int m : members_) {
    ADGT_CHECK(rank_->device_of.empty() || (m >= 0 && m < int(rank_->device_of.size())),
               "EmulatedComm(" << inner_.name() << "): world rank " << m << " has no device ("
                               << rank_->device_of.size() << " ranks placed on cluster "
                               << rank_->cluster.name << ")");
    const int d = rank_->device(m);
    ADGT_CHECK(d >= 0 && d < rank_->cluster.world(),
               "EmulatedComm(" << inner_.name() << "): world rank " << m
                               << (d == m ? "" : " (device " + std::to_string(d) + ")")
                               << " is outside the " << rank_->cluster.world()
                               << " devices of cluster " << rank_->cluster.name);
    devices_.push_back(d);
  }
  if (control_)
    ADGT_CHECK(control_->size() == inner_.size() && control_->rank() == inner_.rank(),
               "EmulatedComm(" << inner_.name() << "): the control channel is not a copy of the group");
  rank_->groups.push_back(this);
}

EmulatedComm::~EmulatedComm() {
  // Only unregisters: the inner transport may be gone already (a layout
  // switch carries the bytes over itself, EmulatedRank::wan_bytes_gone).
  auto& g = rank_->groups;
  g.erase(std::remove(g.begin(), g.end(), this), g.end());
}

double EmulatedComm::wan_bytes_sent() const {
  const auto* m = dynamic_cast<const MpiComm*>(&inner_);
  const cluster::Cluster& cl = rank_->cluster;
  if (!m || cl.sites.size() <= 1) return 0;
  const auto site = [&](int device) { return cl.site_of_node(cl.node_of(device)); };
  const int64_t mine = site(devices_[size_t(inner_.rank())]);
  double b = 0;
  for (size_t q = 0; q < devices_.size(); ++q)
    if (site(devices_[q]) != mine) b += double(m->bytes_sent_to()[q]);
  return b;
}

double EmulatedRank::wan_bytes_sent() const {
  double b = wan_bytes_gone;
  for (const EmulatedComm* c : groups) b += c->wan_bytes_sent();
  return b;
}

std::shared_ptr<EmulatedComm::Timing> EmulatedComm::enter(Collective c, double bytes) {
  auto t = std::make_shared<Timing>();
  t->kind = c;
  const double now = rank_->clock.now();
  t->buf[0] = t->mine = issue_at_ >= 0 ? std::min(now, issue_at_) : now;
  issue_at_ = -1;
  t->buf[1] = bytes;
  t->reduce = control().start_all_reduce(Tensor(t->buf, DType::F64, {2}), ReduceOp::Max);
  queue_.push_back(t);
  return t;
}

bool EmulatedComm::resolve(const Timing& t, bool block) {
  while (!t.resolved) {
    ADGT_CHECK(!queue_.empty(), "EmulatedComm(" << inner_.name() << "): a collective's timing was lost");
    Timing& f = *queue_.front();
    if (block)
      f.reduce.wait();
    else if (!f.reduce.test())
      return false;
    const double begin = std::max(f.buf[0], free_at_);  // the last entry, after the previous one
    f.end = begin + (timer_ ? timer_(rank_->cluster, f.kind, devices_, f.buf[1])
                            : cluster::collective_time(rank_->cluster, f.kind, devices_, f.buf[1]));
    f.resolved = true;
    if (rank_->trace)
      std::fprintf(rank_->trace,
                   "{\"g\": \"%s\", \"op\": \"collective\", \"kind\": %d, \"bytes\": %.0f, "
                   "\"entry\": %.9f, \"last_entry\": %.9f, \"begin\": %.9f, \"end\": %.9f}\n",
                   inner_.name().c_str(), int(f.kind), f.buf[1], f.mine, f.buf[0], begin, f.end);
    free_at_ = f.end;
    queue_.pop_front();
  }
  return true;
}

template <class Op>
void EmulatedComm::blocking(Collective c, double bytes, Op&& op) {
  Busy busy(*this);
  if (size() == 1) return op();
  const auto t = enter(c, bytes);
  {
    CoreYield y(rank_->clock);
    op();
    resolve(*t, true);
  }
  trace_wait("blocking", t->end);
  rank_->clock.wait_until(t->end);
}

template <class Op>
Work EmulatedComm::started(Collective c, double bytes, Op&& op) {
  Busy busy(*this);
  if (size() == 1) return op();
  auto t = enter(c, bytes);
  Work w = op();
  return Work(std::make_shared<EmuWork>(*this, std::move(t), std::move(w)));
}

void EmulatedComm::all_reduce(Tensor t, ReduceOp op) {
  blocking(Collective::AllReduce, double(t.bytes()), [&] { inner_.all_reduce(t, op); });
}

void EmulatedComm::reduce_scatter(Tensor out, const Tensor& in) {
  blocking(Collective::ReduceScatter, double(in.bytes()), [&] { inner_.reduce_scatter(out, in); });
}

void EmulatedComm::all_gather(Tensor out, const Tensor& in) {
  blocking(Collective::AllGather, double(out.bytes()), [&] { inner_.all_gather(out, in); });
}

Work EmulatedComm::start_all_reduce(Tensor t, ReduceOp op) {
  return started(Collective::AllReduce, double(t.bytes()),
                 [&] { return inner_.start_all_reduce(t, op); });
}

Work EmulatedComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  return started(Collective::ReduceScatter, double(in.bytes()),
                 [&] { return inner_.start_reduce_scatter(out, in); });
}

Work EmulatedComm::start_all_gather(Tensor out, const Tensor& in) {
  return started(Collective::AllGather, double(out.bytes()),
                 [&] { return inner_.start_all_gather(out, in); });
}

void EmulatedComm::broadcast(Tensor t, int root) {
  blocking(Collective::Broadcast, double(t.bytes()), [&] { inner_.broadcast(t, root); });
}

void EmulatedComm::all_to_all(Tensor out, const Tensor& in) {
  blocking(Collective::AllToAll, double(in.bytes()), [&] { inner_.all_to_all(out, in); });
}

void EmulatedComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                               const std::vector<int64_t>& recv_displs, const Tensor& in,
                               const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& send_displs) {
  // The member moving the most off-rank bytes (out or in) sets the time;
  // scaled by p/(p-1) because the model's all-to-all moves (p-1)/p of a buffer.
  const int p = size(), me = rank();
  double sent = 0, got = 0;
  for (int j = 0; j < p && j < int(send_counts.size()) && j < int(recv_counts.size()); ++j)
    if (j != me) sent += double(send_counts[size_t(j)]), got += double(recv_counts[size_t(j)]);
  const double bytes = p > 1 ? std::max(sent, got) * double(dtype_size(in.dtype)) * p / (p - 1) : 0;
  blocking(Collective::AllToAll, bytes, [&] {
    inner_.all_to_allv(out, recv_counts, recv_displs, in, send_counts, send_displs);
  });
}

void EmulatedComm::barrier() {
  blocking(Collective::AllReduce, 0.0, [&] { inner_.barrier(); });
}

void EmulatedComm::trace_wait(const char* what, double until, int peer, double bytes) {
  if (!rank_->trace) return;
  std::fprintf(rank_->trace,
               "{\"g\": \"%s\", \"op\": \"%s\", \"peer\": %d, \"bytes\": %.0f, \"now\": %.9f, "
               "\"until\": %.9f}\n",
               inner_.name().c_str(), what, peer, bytes, rank_->clock.now(), until);
}

double EmulatedComm::arrival_of(int peer, double bytes, double* departure_out) {
  ADGT_CHECK(peer >= 0 && peer < size() && peer != rank(),
             "EmulatedComm(" << inner_.name() << "): peer " << peer << " must be another rank of 0.."
                             << size() - 1 << " (this is rank " << rank() << ")");
  const int to = members_[size_t(peer)];
  double& free = rank_->link_free_at[to];
  const double departure = std::max(rank_->clock.now(), free);
  if (departure_out) *departure_out = departure;
  double t = cluster::message_time(rank_->cluster, rank_->device(rank_->world_rank),
                                   devices_[size_t(peer)], bytes, rank_->wan_senders);
  if (auto it = rank_->link_slowdown.find(to); it != rank_->link_slowdown.end()) t *= it->second;
  free = departure + t;
  return free;
}

void EmulatedComm::send(const Tensor& t, int peer, int tag) {
  Busy busy(*this);
  double header[2];
  header[0] = arrival_of(peer, double(t.bytes()), &header[1]);
  {
    CoreYield y(rank_->clock);
    control().send(Tensor(header, DType::F64, {2}), peer, tag);
    inner_.send(t, peer, tag);
  }
  trace_wait("send", header[0], peer, double(t.bytes()));
  rank_->clock.wait_until(header[0], wait_hook_);
}

void EmulatedComm::recv(Tensor t, int peer, int tag) {
  Busy busy(*this);
  double header[2] = {0, 0};
  {
    CoreYield y(rank_->clock);
    control().recv(Tensor(header, DType::F64, {2}), peer, tag);
    inner_.recv(t, peer, tag);
  }
  EmulatedRank::LinkTime& lt = rank_->link_in[{inner_.name(), peer}];
  lt.seconds += header[0] - header[1];
  lt.messages += 1;
  lt.bytes += double(t.bytes());
  trace_wait("recv", header[0], peer, double(t.bytes()));
  rank_->clock.wait_until(header[0], wait_hook_);
}

int64_t EmulatedComm::isend(const Tensor& t, int peer, int tag) {
  Busy busy(*this);
  PendingSend s;
  double departure = 0;
  s.arrival = arrival_of(peer, double(t.bytes()), &departure);
  trace_wait("isend", s.arrival, peer, double(t.bytes()));
  s.header = std::make_unique<double[]>(2);
  s.header[0] = s.arrival;
  s.header[1] = departure;
  s.control_id = control().isend(Tensor(s.header.get(), DType::F64, {2}), peer, tag);
  s.inner_id = inner_.isend(t, peer, tag);
  const int64_t id = next_send_++;
  sends_.emplace(id, std::move(s));
  return id;
}

bool EmulatedComm::send_done(int64_t id) {
  Busy busy(*this);
  auto it = sends_.find(id);
  if (it == sends_.end()) return true;
  PendingSend& s = it->second;
  if (!inner_.send_done(s.inner_id) || !control().send_done(s.control_id) ||
      rank_->clock.now() < s.arrival)
    return false;
  sends_.erase(it);
  return true;
}

void EmulatedComm::wait_sends() {
  Busy busy(*this);
  {
    CoreYield y(rank_->clock);
    inner_.wait_sends();
    if (control_) control_->wait_sends();
  }
  double last = 0;
  for (const auto& [id, s] : sends_) last = std::max(last, s.arrival);
  sends_.clear();
  trace_wait("wait_sends", last);
  rank_->clock.wait_until(last, wait_hook_);
}

void EmulatedComm::progress() {
  inner_.progress();
  if (control_) control_->progress();
}

bool EmulatedComm::progress_from_thread() const {
  return inner_.progress_from_thread() && (!control_ || control_->progress_from_thread());
}

void EmulatedComm::set_wait_hook(std::function<void()> hook) {
  if (control_) control_->set_wait_hook(hook);
  inner_.set_wait_hook(hook);
  wait_hook_ = std::move(hook);
}

const CommStats& EmulatedComm::stats() const {
  merged_ = inner_.stats();
  merged_.seconds = seconds_;
  return merged_;
}

void EmulatedComm::reset_stats() {
  inner_.reset_stats();
  seconds_ = 0;
}

}  // namespace adgt::emulate
