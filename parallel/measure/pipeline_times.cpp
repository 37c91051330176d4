#include "parallel/measure/pipeline_times.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "kernels/check.hpp"
#include "kernels/clock.hpp"
#include "parallel/emulate/emulation.hpp"

namespace adgt {

int64_t pipeline_message_elems(const RunConfig& cfg) {
  return cfg.train.micro_batch * cfg.model.seq_len * cfg.model.d_model;
}

bool pipeline_has_wrap_link(Engine& e) {
  // The looped placement with two or more chunks sends from rank pp-1 back to
  // rank 0 (the wrap link); vee (zb-v) turns on rank pp-1 itself.
  const PipelineExecutor* pipe = e.pipeline();
  return e.layout().virtual_stages > 1 && (!pipe || pipe->schedule().placement == StagePlacement::looped);
}

std::vector<double> probe_pipeline_links(Engine& e) {
  // A message of the activations' dtype and size, on the wall clock.
  Tensor msg = e.scratch_tensor(pipeline_message_elems(e.config()), e.model().dtype());
  return probe_link_times(*e.groups().pp, msg, pipeline_has_wrap_link(e), 3, [] { return wall_seconds(); });
}

pp::StageCosts measured_stage_costs(Engine& e, Comm& world) {
  // Mean F, B and W seconds per stage from the last step's timeline; a fused
  // Backward counts half as B and half as W. The maximum over the world
  // (every tp and dp replica of a stage) is the same on every rank.
  PipelineExecutor& pipe = *e.pipeline();
  const int r = e.groups().pp->rank();
  const int S = pipe.schedule().num_stages();
  std::vector<double> sum(size_t(3 * S), 0.0), n(size_t(3 * S), 0.0);
  for (const ExecutedInstr& x : pipe.timeline()) {
    if (x.instr.chunk < 0) continue;
    const size_t s = size_t(pipe.schedule().stage(r, x.instr.chunk));
    const double d = x.own_seconds();  // compute's own time where measured
    switch (x.instr.op) {
      case pp::Op::Forward: sum[s] += d; n[s] += 1; break;
      case pp::Op::BackwardInput: sum[size_t(S) + s] += d; n[size_t(S) + s] += 1; break;
      case pp::Op::BackwardWeight: sum[size_t(2 * S) + s] += d; n[size_t(2 * S) + s] += 1; break;
      case pp::Op::Backward:
        sum[size_t(S) + s] += d / 2; n[size_t(S) + s] += 1;
        sum[size_t(2 * S) + s] += d / 2; n[size_t(2 * S) + s] += 1;
        break;
      default: break;
    }
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = n[i] > 0 ? sum[i] / n[i] : 0.0;
  world.all_reduce(Tensor(sum.data(), DType::F64, {int64_t(sum.size())}), ReduceOp::Max);
  pp::StageCosts c;
  c.f.assign(sum.begin(), sum.begin() + S);
  c.b.assign(sum.begin() + S, sum.begin() + 2 * S);
  c.w.assign(sum.begin() + 2 * S, sum.end());
  c.jitter = measured_jitter(pipe.timeline(), world);
  return c;
}

std::vector<double> measured_jitter(const std::vector<ExecutedInstr>& timeline, Comm& world) {
  // Per (chunk, op) of this rank's step, each instruction's time over the
  // median of its kind's; their kJitterQuantiles quantiles, averaged over
  // the world (a sum all-reduce: the same on every rank).
  std::map<std::pair<int, int>, std::vector<double>> kinds;
  for (const ExecutedInstr& x : timeline) {
    if (x.instr.chunk < 0 || !pp::is_compute(x.instr.op)) continue;
    const double d = x.own_seconds();
    if (d > 0) kinds[{x.instr.chunk, int(x.instr.op)}].push_back(d);
  }
  std::vector<double> ratios;
  for (auto& [k, v] : kinds) {
    if (v.size() < 2) continue;
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    for (double d : v) ratios.push_back(d / med);
  }
  std::vector<double> q(size_t(kJitterQuantiles) + 1, 0.0);  // + 1: this rank measured
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    for (int i = 0; i < kJitterQuantiles; ++i) {
      const double at = (i + 0.5) / kJitterQuantiles * double(ratios.size());
      q[size_t(i)] = ratios[std::min(ratios.size() - 1, size_t(at))];
    }
    q.back() = 1;
  }
  world.all_reduce(Tensor(q.data(), DType::F64, {int64_t(q.size())}), ReduceOp::Sum);
  if (!(q.back() > 0)) return {};
  for (int i = 0; i < kJitterQuantiles; ++i) q[size_t(i)] /= q.back();
  q.pop_back();
  return q;
}

std::vector<double> measured_link_times(Engine& e, Comm& world) {
  const ParallelContext& g = e.groups();
  const int pp = g.pp ? g.pp->size() : 1;
  std::vector<double> t(size_t(std::max(pp, 1)), 0.0);
  if (pp <= 1) return t;
  const std::string& mode = e.config().parallel.link_times;
  PipelineExecutor* pipe = e.pipeline();
  const bool host_messages = pipe && pipe->last_wait_seconds() >= 0;  // receives block the host
  const bool wrap = pipeline_has_wrap_link(e);
  if (mode == "messages" && host_messages) {
    std::vector<double> m =
        link_times_from_messages(*g.pp, pipe->message_times(), wrap);
    for (size_t k = 0; k < m.size() && k < t.size(); ++k) t[k] = m[k];
    world.all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}), ReduceOp::Max);
    return t;
  }
  if (!g.emulation || mode == "probe" || mode == "messages") {  // a probe per link
    const std::vector<double> probed = probe_pipeline_links(e);
    for (size_t k = 0; k < probed.size() && k < t.size(); ++k) t[k] = probed[k];
    world.all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}), ReduceOp::Max);
    return t;
  }
  const int r = g.pp->rank();
  for (const auto& [peer, lt] : g.emulation->take_link_times(g.pp->name())) {
    if (lt.messages <= 0) continue;
    const int k = peer == r + 1 ? r : peer == r - 1 ? r - 1 : pp - 1;  // else the wrap link
    t[size_t(k)] = std::max(t[size_t(k)], lt.seconds / double(lt.messages));
  }
  world.all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}), ReduceOp::Max);
  return t;
}

std::vector<double> link_times_from_messages(Comm& pp, const std::vector<MessageTime>& msgs, bool wrap) {
  const int P = pp.size(), me = pp.rank();
  const int links = P > 1 ? (wrap && P > 2 ? P : P - 1) : 0;
  if (links == 0) return {};
  // My send times per peer ([tag, t, tag, t, ...]) and my receive count per peer.
  std::map<int, std::vector<double>> out;
  std::map<int, int64_t> n_in;
  for (const MessageTime& m : msgs) {
    if (m.peer < 0 || m.peer == me) continue;
    if (m.sent) {
      out[m.peer].push_back(double(m.tag));
      out[m.peer].push_back(m.t);
    } else {
      ++n_in[m.peer];
    }
  }
  constexpr int kTag = 0x7e58;
  for (auto& [peer, v] : out) pp.isend(Tensor(v.data(), DType::F64, {int64_t(v.size())}), peer, kTag);
  // Per link: the least arrival − departure in its forward (k -> k+1) and
  // backward direction; -1 where this rank did not receive on it.
  std::vector<double> fwd(size_t(links), -1.0), bwd(size_t(links), -1.0);
  for (const auto& [peer, n] : n_in) {
    std::vector<double> theirs(size_t(2 * n), 0.0);
    pp.recv(Tensor(theirs.data(), DType::F64, {int64_t(theirs.size())}), peer, kTag);
    std::map<int, double> departure;
    for (size_t i = 0; i + 1 < theirs.size(); i += 2) departure[int(theirs[i])] = theirs[i + 1];
    double least = std::numeric_limits<double>::infinity();
    for (const MessageTime& m : msgs)
      if (!m.sent && m.peer == peer)
        if (auto it = departure.find(m.tag); it != departure.end()) least = std::min(least, m.t - it->second);
    if (!std::isfinite(least)) continue;
    const int k = peer == me + 1 ? me : peer == me - 1 ? me - 1 : P - 1;  // else the wrap link
    if (k < 0 || k >= links) continue;
    const bool forward = me == (k + 1) % P && peer == k;  // received from the link's lower end
    (forward ? fwd : bwd)[size_t(k)] = least;
  }
  pp.wait_sends();
  std::vector<double> both(fwd);
  both.insert(both.end(), bwd.begin(), bwd.end());
  pp.all_reduce(Tensor(both.data(), DType::F64, {int64_t(both.size())}), ReduceOp::Max);
  std::vector<double> t(size_t(links), 0.0);
  for (int k = 0; k < links; ++k) {
    const double f = both[size_t(k)], b = both[size_t(links + k)];
    t[size_t(k)] = f >= 0 && b >= 0 ? 0.5 * (f + b) : std::max({f, b, 0.0});
    // Offsets cancel in the mean; what rounding leaves below 0 is 0.
    t[size_t(k)] = std::max(t[size_t(k)], 0.0);
  }
  return t;
}

std::vector<double> probe_link_times(Comm& pp, Tensor msg, bool wrap, int rounds,
                                     const std::function<double()>& now) {
  const int P = pp.size(), me = pp.rank();
  const int links = P > 1 ? (wrap ? P : P - 1) : 0;
  std::vector<double> t(size_t(std::max(links, 1)), 0.0);
  if (links == 0) return {};
  constexpr int kTag = 0x7e57;
  auto probe = [&](int k) {  // link k: ranks k and (k + 1) % P
    const int a = k, b = (k + 1) % P;
    if (me != a && me != b) return;
    double best = -1;
    for (int i = 0; i < std::max(1, rounds); ++i) {
      if (me == a) {
        const double t0 = now();
        pp.send(msg, b, kTag);
        pp.recv(msg, b, kTag);
        const double dt = 0.5 * (now() - t0);
        best = best < 0 ? dt : std::min(best, dt);
      } else {
        pp.recv(msg, a, kTag);
        pp.send(msg, a, kTag);
      }
    }
    if (me == a) t[size_t(k)] = best;
  };
  for (int k = 0; k < P - 1; k += 2) probe(k);
  for (int k = 1; k < P - 1; k += 2) probe(k);
  if (wrap && P > 1) probe(P - 1);
  t.resize(size_t(links));
  pp.all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}), ReduceOp::Max);
  return t;
}

}  // namespace adgt
