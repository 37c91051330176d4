#include "parallel/comm/traced_comm.hpp"

#include <string>

#include "core/trace.hpp"

namespace adgt {

namespace {

// Runs `call` inside a span "<what> <group>" on the collectives track, with
// its bytes (and peer) as arguments; just runs it while the recorder is off.
// Groups of one are left out (their calls do nothing). The span's name and
// arguments are made after its end, so the trace's own work is not in the gaps
// between spans.
template <class Call>
void traced(const Comm& c, const char* what, size_t bytes, int peer, Call&& call) {
  trace::Recorder& r = trace::recorder();
  Backend* ranges = r.ranges();
  if ((!r.on() && !ranges) || c.size() == 1) return call();
  if (!r.on()) {  // a profiler's range only (NVTX)
    ranges->range_push((std::string(what) + " " + c.name()).c_str());
    call();
    return ranges->range_pop();
  }
  if (ranges) ranges->range_push((std::string(what) + " " + c.name()).c_str());
  const double t0 = r.now();
  call();
  const double t1 = r.now();
  if (ranges) ranges->range_pop();
  std::string args = "{\"bytes\": " + std::to_string(bytes) + ", \"group_size\": " + std::to_string(c.size());
  if (peer >= 0) args += ", \"peer\": " + std::to_string(peer);
  r.span(std::string(what) + " " + c.name(), "comm", t0, t1, trace::kCommTrack, args + "}");
}

void note(const Comm& c, const char* what, size_t bytes, int peer = -1) {
  trace::Recorder& r = trace::recorder();
  if (!r.on() || c.size() == 1) return;
  std::string args = "{\"bytes\": " + std::to_string(bytes);
  if (peer >= 0) args += ", \"peer\": " + std::to_string(peer);
  r.instant(std::string(what) + " " + c.name(), "comm", args + "}", trace::kCommTrack);
}

}  // namespace

void TracedComm::all_reduce(Tensor t, ReduceOp op) {
  traced(*this, "all_reduce", t.bytes(), -1, [&] { inner_.all_reduce(t, op); });
}
void TracedComm::reduce_scatter(Tensor out, const Tensor& in) {
  traced(*this, "reduce_scatter", in.bytes(), -1, [&] { inner_.reduce_scatter(out, in); });
}
void TracedComm::all_gather(Tensor out, const Tensor& in) {
  traced(*this, "all_gather", out.bytes(), -1, [&] { inner_.all_gather(out, in); });
}
Work TracedComm::start_all_reduce(Tensor t, ReduceOp op) {
  note(*this, "start all_reduce", t.bytes());
  return inner_.start_all_reduce(t, op);
}
Work TracedComm::start_reduce_scatter(Tensor out, const Tensor& in) {
  note(*this, "start reduce_scatter", in.bytes());
  return inner_.start_reduce_scatter(out, in);
}
Work TracedComm::start_all_gather(Tensor out, const Tensor& in) {
  note(*this, "start all_gather", out.bytes());
  return inner_.start_all_gather(out, in);
}
void TracedComm::broadcast(Tensor t, int root) {
  traced(*this, "broadcast", t.bytes(), root, [&] { inner_.broadcast(t, root); });
}
void TracedComm::send(const Tensor& t, int peer, int tag) {
  traced(*this, "send", t.bytes(), peer, [&] { inner_.send(t, peer, tag); });
}
void TracedComm::recv(Tensor t, int peer, int tag) {
  traced(*this, "recv", t.bytes(), peer, [&] { inner_.recv(t, peer, tag); });
}
int64_t TracedComm::isend(const Tensor& t, int peer, int tag) {
  note(*this, "isend", t.bytes(), peer);
  return inner_.isend(t, peer, tag);
}
Work TracedComm::start_exchange(const std::vector<Message>& out, int to,
                               const std::vector<Message>& in, int from) {
  int64_t bytes = 0;
  for (const Message& m : out) bytes += int64_t(m.t.bytes());
  note(*this, "start exchange", bytes, to);
  return inner_.start_exchange(out, to, in, from);
}
void TracedComm::wait_sends() {
  traced(*this, "wait_sends", 0, -1, [&] { inner_.wait_sends(); });
}
void TracedComm::all_to_all(Tensor out, const Tensor& in) {
  traced(*this, "all_to_all", in.bytes(), -1, [&] { inner_.all_to_all(out, in); });
}
void TracedComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs, const Tensor& in,
                             const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs) {
  traced(*this, "all_to_allv", in.bytes(), -1,
         [&] { inner_.all_to_allv(out, recv_counts, recv_displs, in, send_counts, send_displs); });
}
void TracedComm::barrier() {
  traced(*this, "barrier", 0, -1, [&] { inner_.barrier(); });
}

}  // namespace adgt
