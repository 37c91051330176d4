// The event-driven step simulation (step_sim.hpp).
#include "parallel/sim/step_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "core/layout.hpp"
#include "core/model/stage_map.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/cost/flops.hpp"
#include "parallel/cost/memory.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/sim/work.hpp"
#include "parallel/pipeline/validate.hpp"
#include "parallel/sim/power_slowdown.hpp"

namespace adgt::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Mark: no work, completes at once (a traced instruction without tasks: WaitSends).
enum class TaskKind : uint8_t { Compute, Delay, Send, Recv, StartBuckets, WaitBuckets, Sync, Mark };
enum class Cat : uint8_t { Pipeline, Optimizer, Tp, Ep, Cp, Step, Dp };

struct Task {
  TaskKind kind;
  Cat cat = Cat::Pipeline;
  double amount = 0;       // Compute: seconds at speed 1; Delay: seconds; Sync: seconds
  int64_t msg = -1;        // Send/Recv: message key
  int peer = -1;           // Send: the receiving unit
  double bytes = 0;        // Send
  int chunk = -2;          // StartBuckets: the chunk (-1: every bucket not started)
  int64_t grads_done = -3; // Compute: the layer whose gradients are final at its end
  bool last_mb = false;    // Compute: part of the step's last micro-batch (pp == 1)
  int sync_id = -1;        // Sync: which step collective
  Group sync_group = Group::world;  // Sync: its group (members wait for each other)
  int label = -1;          // its span's name in StepSimulation::labels_ (SimTrace), -1: none
  double joules = 0;       // Compute: the device's dynamic energy (OpCosts::joules)
};

struct Unit {
  int dp = 0, pp = 0;
  std::vector<int> ranks;  // world ranks of its tp group
  double speed = 1;
  int pool = -1;           // shared-core pool, -1: none
  double sync_wait = 0;    // extra wait per synchronisation (SimOptions::sync_wait_s)
  std::vector<Task> tasks;
  size_t pc = 0;
  // The running task.
  bool started = false;
  double remaining = 0, until = 0, since = 0;
  // Statistics.
  double compute = 0, optimizer = 0, tp = 0, ep = 0, cp = 0, pp_wait = 0, dp_wait = 0, step_wait = 0;
  double joules = 0;  // dynamic energy of one of its devices' computes
  double pipeline_end = 0, end = 0;
  std::vector<char> bucket_ready;      // all of the bucket's layers final
  std::vector<char> bucket_requested;  // the executor reached its start
  std::vector<double> bucket_request_t;
  std::vector<int64_t> layers_done;
  double channel_free = 0;
  std::vector<double> ends;  // with a trace: each completed task's end, in order
};

int64_t message_key(int type, int64_t mb, int64_t stage, int64_t dp) {
  return ((dp * 2 + type) * 1000003 + stage) * 1000003 + mb;
}

// One step's simulation: the units (a tp group each: one per pipeline rank
// and data-parallel replica simulated), their task lists built from the
// schedule and the work, and the event loop that runs them.
class StepSimulation {
 public:
  StepSimulation(const RunConfig& cfg, const cluster::Cluster& cl, OpCosts& costs, const SimOptions& opts,
                 SimTrace* trace)
      : cfg_(cfg), cl_(cl), costs_(costs), opts_(opts), lay_(layout_of(cfg)), trace_(trace) {
    world_ = lay_.world();
    if (world_ > cl.world())
      throw std::invalid_argument("simulate: the layout needs " + std::to_string(world_) +
                                  " ranks (tp*cp*pp*dp) but cluster " + cl.name + " has " +
                                  std::to_string(cl.world()) + " devices");
    P_ = int(lay_.pp);
    bytes_ = compute_bytes(cfg);
    // CPU ranks whose threads fill their host's cores (cpu-here) move no
    // message while they compute: the CPU transports progress only inside an
    // MPI call, and no core is free for a helper. The data-parallel buckets
    // then start after the backward, as with parallel.overlap off (measured
    // on 2 cores: dp2 of configs/tiny.yaml steps alike with overlap on and
    // off, docs/simulator.md).
    overlap_ = cfg.parallel.overlap &&
               !(cl.cores_per_node > 0 && opts.host_cores == 0 &&
                 std::min<int64_t>(world_, cl.devices_per_node) * cl.rank_threads() >= cl.cores_per_node);
    m_ = cfg.accum_steps();
    const bool hetero = !cl.node_speed.empty() || !opts.slow_ranks.empty() ||
                        !opts.slow_links.empty() || !cl.link_overrides.empty() || cl.sites.size() > 1 ||
                        opts.host_cores > 0 || cl.cores_per_node > 0 || opts.all_replicas ||
                        !opts.device_of.empty();
    // A replica: a stage's tp group at one dp and cp coordinate (cp fastest);
    // the cp ranks of a replica do equal work (the ring's load balance).
    replicas_ = hetero ? int(lay_.dp * lay_.cp) : 1;
    // Per pipeline rank: its work and bucket durations (costed per replica below).
    for (int p = 0; p < P_; ++p) work_.push_back(rank_work(cfg, p, opts.work));
    // A power limiter under a cap (power.hpp): each pipeline rank's compute
    // runs at the speed the limiter leaves its step, its FLOPs' energy as
    // the limiter's walk found (the ops themselves are costed unthrottled).
    limiter_speed_.assign(size_t(P_), 1.0);
    limiter_energy_.assign(size_t(P_), 1.0);
    if (const auto& ed = opts.emulated_power_device; ed && ed->power.on() && ed->power.cap_w > 0) {
      for (int p = 0; p < P_; ++p)
        limiter_speed_[size_t(p)] = 1.0 / power_cap_slowdown(cfg, *ed, ed->power.cap_w, p);
    } else if (cl.device.power.on() && cl.device.power.cap_w > 0 && cl.device.power.limiter())
      for (int p = 0; p < P_; ++p) {
        const cluster::LimiterStep ls = limiter_step(cfg, cl.device, p, opts.work);
        limiter_speed_[size_t(p)] = 1.0 / std::max(1.0, ls.slowdown());
        limiter_braked_ = std::max(limiter_braked_, ls.braked_share);
        limiter_slowdown_ = std::max(limiter_slowdown_, std::max(1.0, ls.slowdown()));
        if (ls.free_dyn_j > 0) limiter_energy_[size_t(p)] = ls.capped_dyn_j / ls.free_dyn_j;
      }
  }

  SimResult run() {
    if (P_ > 1) sched_ = plan_schedule();
    make_units();
    for (Unit& u : units_) add_tasks(u);
    plan_bucket_durations();
    for (int p = 0; p < P_; ++p) bucket_end_.push_back(std::vector<double>(work_[size_t(p)].buckets.size(), -1));
    next_bucket_.assign(size_t(P_), 0);
    while (true) {
      run_instantaneous();
      bool all_done = true;
      const double next = next_event(all_done);
      if (all_done) break;
      if (!(next < kInf))
        throw std::logic_error("simulate: no unit can proceed (a schedule that cannot complete)");
      advance(next);
      now_ = next;
      for (Unit& u : units_)
        if (u.pc >= u.tasks.size() && u.end == 0) u.end = now_;
    }
    for (Unit& u : units_)
      if (u.end == 0) u.end = now_;
    if (trace_) fill_trace();
    return result();
  }

 private:
  // Op costs, memoised per op.
  double op_time(const Op& op) {
    auto key = std::make_tuple(int(op.kind), op.a, op.b, op.c, op.d, op.e, op.fp8, op.causal);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const double t = costs_.seconds(op, bytes_);
    memo_.emplace(key, t);
    return t;
  }
  double ops_time(const std::vector<Op>& ops) {
    double t = 0;
    for (const Op& op : ops) t += op_time(op);
    return t;
  }
  // Dynamic energy of ops (memoised); an op the costs cannot price marks the
  // step's energy unknown.
  double ops_joules(const std::vector<Op>& ops) {
    double j = 0;
    for (const Op& op : ops) {
      auto key = std::make_tuple(int(op.kind), op.a, op.b, op.c, op.d, op.e, op.fp8, op.causal);
      auto it = joule_memo_.find(key);
      if (it == joule_memo_.end()) it = joule_memo_.emplace(key, costs_.joules(op, bytes_)).first;
      if (it->second < 0) energy_known_ = false;
      j += std::max(0.0, it->second);
    }
    return j;
  }
  int unit_index(int d, int p) const { return p * replicas_ + d; }

  // The schedule. The cost-driven generators (greedy, zb-v) plan on this
  // simulation's stage times (each pipeline rank's compute at its speed) and
  // link times, as the run's re-plan does from its measured ones after its
  // first steps (parallel/control/schedule_controller.cpp, the adapter's warm-up re-plan); the others are fixed orders.
  pp::Schedule plan_schedule() {
    if (cfg_.parallel.schedule != "greedy" && cfg_.parallel.schedule != "zb-v") return engine_schedule(cfg_);
    const int P = P_;
    const int V = int(lay_.virtual_stages);
    const StagePlacement place = placement_of_schedule(cfg_.parallel.schedule);
    auto pass_s = [&](const PassWork& w) {
      double t = 0;
      for (const Piece& pc : w.pieces) t += ops_time(pc.ops);
      return t;
    };
    auto lead_rank = [&](int p) { return rank_of(lay_, RankCoords{0, 0, p, 0, 0}); };
    pp::StageCosts sc;
    sc.f.assign(size_t(P * V), 0);
    sc.b.assign(size_t(P * V), 0);
    sc.w.assign(size_t(P * V), 0);
    for (int p = 0; p < P; ++p) {
      double speed = cl_.speed_of_node(cl_.node_of(dev(lead_rank(p)))) * limiter_speed_[size_t(p)];
      if (auto it = opts_.slow_ranks.find(lead_rank(p)); it != opts_.slow_ranks.end()) speed /= it->second;
      for (int c = 0; c < V; ++c) {
        const StageWork& st = work_[size_t(p)].chunks[size_t(c)];
        const size_t s = size_t(stage_of(place, P, p, c));
        sc.f[s] = pass_s(st.forward) / speed;
        sc.b[s] = pass_s(st.input_grad) / speed;
        sc.w[s] = pass_s(st.weight_grad) / speed;
      }
    }
    const double bytes_msg = work_[0].chunks[0].activation_bytes;
    const bool wrap = V > 1 && place == StagePlacement::looped;
    for (int k = 0; k < (wrap ? P : P - 1); ++k)
      sc.link.push_back(cluster::message_time(cl_, dev(lead_rank(k)), dev(lead_rank((k + 1) % P)), bytes_msg,
                                              stage_ranks()));
    bool usable = true;  // f and b > 0 (a stage without layers or ops would not plan)
    for (size_t s = 0; s < sc.f.size(); ++s) usable = usable && sc.f[s] > 0 && sc.b[s] > 0;
    return usable ? engine_schedule(cfg_, &sc) : engine_schedule(cfg_);
  }

  // Units: one per pipeline rank and simulated replica, at the speed of its
  // slowest rank, in a shared-core pool where the host's cores are modelled.
  void make_units() {
    for (int p = 0; p < P_; ++p)
      for (int d = 0; d < replicas_; ++d) {
        Unit u;
        u.dp = d;
        u.pp = p;
        const int cp = int(lay_.cp);
        for (int t = 0; t < int(lay_.tp); ++t)
          u.ranks.push_back(rank_of(lay_, RankCoords{t, d / cp, p, 0, 0, d % cp}));
        u.speed = kInf;
        for (int r : u.ranks) {
          double s = cl_.speed_of_node(cl_.node_of(dev(r)));
          if (auto it = opts_.slow_ranks.find(r); it != opts_.slow_ranks.end()) s /= it->second;
          u.speed = std::min(u.speed, s);
        }
        u.speed *= limiter_speed_[size_t(p)];
        if (opts_.host_cores > 0) u.pool = 0;
        else if (cl_.cores_per_node > 0) u.pool = int(cl_.node_of(dev(u.ranks[0])));
        u.sync_wait = u.pool >= 0 ? opts_.sync_wait_s : 0;
        units_.push_back(std::move(u));
      }
  }

  // The ranks of one pipeline stage: those that send across a stage
  // boundary at once (the WAN's share of a message crossing it).
  int64_t stage_ranks() const { return world_ / std::max<int64_t>(1, lay_.pp); }
  int dev(int r) const {
    return opts_.device_of.empty() ? r : opts_.device_of.at(size_t(r));
  }
  std::vector<int> devs(const std::vector<int>& ranks) const {
    std::vector<int> d;
    for (int r : ranks) d.push_back(dev(r));
    return d;
  }
  static bool data_parallel(Group g) {
    return g == Group::dp || g == Group::edp || g == Group::dpcp || g == Group::edpcp;
  }
  // One collective of group g over `ranks` (world ranks) as the run does it:
  // the data-parallel groups by parallel.site_reduce (hierarchical across
  // sites), the others flat.
  double comm_time(Group g, cluster::Collective kind, const std::vector<int>& ranks, double bytes) const {
    return cluster::reduction_time(cl_, kind, devs(ranks), bytes,
                                   data_parallel(g) ? site_reduce_ : cluster::SiteReduce::Flat);
  }
  // The WAN part of it: bytes over every member, seconds of its WAN phases
  // (hierarchical: the cross-site phase; flat: the whole ring waits on its
  // WAN hops), and the whole collective's seconds.
  struct WanCost {
    double bytes = 0, wan_s = 0, all_s = 0;
  };
  WanCost comm_wan(Group g, cluster::Collective kind, const std::vector<int>& ranks, double bytes) const {
    const auto how = data_parallel(g) ? site_reduce_ : cluster::SiteReduce::Flat;
    const std::vector<int> d = devs(ranks);
    WanCost w;
    w.all_s = cluster::reduction_time(cl_, kind, d, bytes, how);
    w.bytes = cluster::wan_bytes(cl_, kind, d, bytes, how);
    if (w.bytes <= 0) return w;
    const auto p = how == cluster::SiteReduce::Hierarchical ? cluster::site_phases(cl_, kind, d, bytes)
                                                            : std::nullopt;
    w.wan_s = p ? p->cross : w.all_s;
    return w;
  }

  // The step's WAN bytes (every group counted once, by its first member) and
  // the WAN seconds of the busiest rank.
  void account_wan(SimResult& r) const {
    if (cl_.sites.size() <= 1) return;
    std::vector<double> secs(size_t(world_), 0);
    // Layers repeat the same collectives: each (group, kind, bytes) of a
    // group is costed once (a 256-rank sweep would otherwise cost them
    // hundreds of thousands of times).
    std::map<std::pair<int, int>, std::vector<int>> groups;  // (group, rank) -> members
    std::map<std::tuple<int, int, int, double>, WanCost> costed;
    // Adds `times` of one collective to the account; returns its cost.
    const auto add = [&](int rank, Group g, cluster::Collective kind, double bytes, double times) {
      auto git = groups.find({int(g), rank});
      if (git == groups.end()) git = groups.emplace(std::make_pair(int(g), rank), group_ranks(lay_, g, rank)).first;
      const std::vector<int>& ranks = git->second;
      if (ranks.size() <= 1) return WanCost{};
      const auto key = std::make_tuple(int(g), int(kind), ranks.front(), bytes);
      auto cit = costed.find(key);
      if (cit == costed.end()) cit = costed.emplace(key, comm_wan(g, kind, ranks, bytes)).first;
      const WanCost& w = cit->second;
      if (ranks.front() == rank) r.wan_bytes += w.bytes * times;
      secs[size_t(rank)] += w.wan_s * times;
      return w;
    };
    const int64_t V = lay_.virtual_stages;
    // The WAN's share of the gradient reduction's time and of the pipeline
    // messages' time, the most of any rank: what scales the exposed dp and pp
    // times into the exposed WAN time (an estimate: the exposure is taken per
    // group, not per link).
    double dp_share = 0, pp_share = 0;
    for (int rank = 0; rank < int(world_); ++rank) {
      const RankCoords rc = coords_of(lay_, rank);
      const RankWork& w = work_[size_t(rc.pp)];
      double dp_wan = 0, dp_all = 0;
      for (const BucketWork& b : w.buckets) {
        const auto kind = b.reduce_scatter ? cluster::Collective::ReduceScatter : cluster::Collective::AllReduce;
        const WanCost c = add(rank, b.group, kind, b.bytes, 1);
        dp_wan += c.wan_s;
        dp_all += c.all_s;
      }
      if (dp_all > 0) dp_share = std::max(dp_share, dp_wan / dp_all);
      for (const CommOp& c : w.step_comms) add(rank, c.group, c.kind, c.bytes, 1);
      for (const StageWork& st : w.chunks) {
        // Per micro-batch: the forward and the backward (fused; the split
        // backward's pieces carry the same collectives).
        for (const PassWork* pw : {&st.forward, &st.backward})
          for (const Piece& pc : pw->pieces)
            for (const CommOp& c : pc.comms)
              if (c.group != Group::world) add(rank, c.group, c.kind, c.bytes, double(m_ * c.repeat));
      }
      // The pipeline's messages to the next stage: activations forward,
      // gradients back, per micro-batch and chunk.
      if (P_ > 1) {
        RankCoords next = rc;
        next.pp = (rc.pp + 1) % P_;
        const int to = rank_of(lay_, next);
        const bool wraps = rc.pp + 1 == P_;
        const double chunks = wraps ? double(V - 1) : double(V);
        if (chunks > 0) {
          const double bytes = w.chunks[0].activation_bytes;
          const double b = cluster::message_wan_bytes(cl_, dev(rank), dev(to), bytes);
          const double out = cluster::message_time(cl_, dev(rank), dev(to), bytes, stage_ranks());
          if (b > 0) {
            r.wan_bytes += 2 * b * double(m_) * chunks;
            secs[size_t(rank)] += out * double(m_) * chunks;
            secs[size_t(to)] += out * double(m_) * chunks;
          }
          // The WAN's share of this rank's two boundaries' message time.
          RankCoords prev = rc;
          prev.pp = (rc.pp + P_ - 1) % P_;
          const int from = rank_of(lay_, prev);
          const double in = rc.pp > 0 || V > 1
                                ? cluster::message_time(cl_, dev(from), dev(rank), bytes, stage_ranks())
                                : 0;
          const double wan_in = cluster::message_wan_bytes(cl_, dev(from), dev(rank), bytes) > 0 ? in : 0;
          if (out + in > 0) pp_share = std::max(pp_share, ((b > 0 ? out : 0) + wan_in) / (out + in));
        }
      }
    }
    for (double t : secs) r.wan_s = std::max(r.wan_s, t);
    r.exposed_wan_s = r.exposed_dp_s * dp_share + r.exposed_pp_s * pp_share;
  }

  double group_time(const Unit& u, const CommOp& c) {
    std::vector<int> ranks;
    switch (c.group) {
      case Group::tp: ranks = u.ranks; break;
      default: ranks = group_ranks(lay_, c.group, u.ranks[0]); break;
    }
    if (c.group == Group::world) {
      ranks.resize(size_t(world_));
      for (int i = 0; i < int(world_); ++i) ranks[size_t(i)] = i;
    }
    double t = comm_time(c.group, c.kind, ranks, c.bytes);
    for (const auto& [kind, bytes] : c.with) t += comm_time(c.group, kind, ranks, bytes);
    if (c.hide.empty()) return double(c.repeat) * t;
    // Overlapped with the compute of `hide` (at this unit's speed), each time.
    return double(c.repeat) * std::max(0.0, t - ops_time(c.hide) / u.speed);
  }
  // In a pass: ZeRO-2/3's unit gathers and reduce-scatters are data-parallel time.
  static Cat comm_cat(Group g) {
    return g == Group::ep                          ? Cat::Ep
           : g == Group::cp                        ? Cat::Cp
           : g == Group::dp || g == Group::dpcp || g == Group::edp || g == Group::edpcp ? Cat::Dp
                                                   : Cat::Tp;
  }

  // A pass's tasks, made once per (unit, pass): its pieces in order where the
  // order matters (ranks sharing cores, and the last micro-batch's gradient
  // milestones of an unpipelined step), else one compute task and the
  // tensor- and expert-parallel exchanges as two delays (same totals).
  void add_pass(Unit& u, const PassWork& w, bool last_mb) {
    const bool keep_order = last_mb || u.pool >= 0;
    if (!keep_order) {
      auto key = std::make_pair(static_cast<const Unit*>(&u), &w);
      auto it = pass_cache_.find(key);
      if (it == pass_cache_.end()) {
        Task c{TaskKind::Compute}, tp{TaskKind::Delay}, ep{TaskKind::Delay}, cp{TaskKind::Delay},
            dp{TaskKind::Delay};
        tp.cat = Cat::Tp;
        ep.cat = Cat::Ep;
        cp.cat = Cat::Cp;
        dp.cat = Cat::Dp;
        for (const Piece& pc : w.pieces) {
          c.amount += ops_time(pc.ops);
          c.joules += ops_joules(pc.ops);
          for (const CommOp& cm : pc.comms) {
            const Cat k = comm_cat(cm.group);
            (k == Cat::Ep ? ep : k == Cat::Cp ? cp : k == Cat::Dp ? dp : tp).amount +=
                group_time(u, cm) + u.sync_wait;
          }
        }
        std::vector<Task> ts{c};
        if (tp.amount > 0) ts.push_back(tp);
        if (ep.amount > 0) ts.push_back(ep);
        if (cp.amount > 0) ts.push_back(cp);
        if (dp.amount > 0) ts.push_back(dp);
        it = pass_cache_.emplace(key, std::move(ts)).first;
      }
      u.tasks.insert(u.tasks.end(), it->second.begin(), it->second.end());
      return;
    }
    for (const Piece& pc : w.pieces) {
      Task t{TaskKind::Compute};
      t.amount = ops_time(pc.ops);
      t.joules = ops_joules(pc.ops);
      t.grads_done = pc.grads_done_layer;
      t.last_mb = last_mb;
      u.tasks.push_back(t);
      for (const CommOp& c : pc.comms) {
        Task dl{TaskKind::Delay};
        dl.cat = comm_cat(c.group);
        dl.amount = group_time(u, c);
        if (dl.amount > 0) dl.amount += u.sync_wait;
        if (dl.amount > 0) u.tasks.push_back(dl);
      }
    }
  }

  // The trace's name for tasks [from, end) of u: a label (with its category).
  void label_tasks(Unit& u, size_t from, const std::string& name, const char* cat) {
    if (!trace_) return;
    auto it = label_of_.find(name);
    if (it == label_of_.end()) {
      it = label_of_.emplace(name, int(labels_.size())).first;
      labels_.push_back({name, cat});
    }
    for (size_t k = from; k < u.tasks.size(); ++k) u.tasks[k].label = it->second;
  }
  // A task completed now (with a trace: its end noted).
  void complete(Unit& u, double at) {
    if (trace_) u.ends.push_back(at);
    u.started = false;
    ++u.pc;
    ++events_;
  }
  // Each unit's completed tasks as spans: consecutive tasks of one label are
  // one span, from the end of the task before the first to the last's end.
  void fill_trace() {
    for (const Unit& u : units_) {
      SimTrace::UnitTimeline tl;
      tl.world_rank = u.ranks[0];
      tl.pp = u.pp;
      tl.dp = u.dp;
      tl.ranks = u.ranks;
      double prev = 0;
      for (size_t k = 0; k < u.ends.size(); ++k) {
        const int l = u.tasks[k].label;
        if (l >= 0) {
          const bool extend = !tl.spans.empty() && k > 0 && u.tasks[k - 1].label == l;
          if (extend)
            tl.spans.back().end = u.ends[k];
          else
            tl.spans.push_back({labels_[size_t(l)].first, labels_[size_t(l)].second, prev, u.ends[k]});
        }
        prev = u.ends[k];
      }
      trace_->units.push_back(std::move(tl));
    }
  }

  // One pipeline instruction of unit u's rank as tasks, named for the trace.
  void add_instruction(Unit& u, const RankWork& rw, const pp::Instr& in) {
    const size_t from = u.tasks.size();
    add_instruction_tasks(u, rw, in);
    label_tasks(u, from, pp::to_string(in),
                pp::is_compute(in.op)                              ? "compute"
                : pp::is_recv(in.op) || in.op == pp::Op::WaitSends ? "wait"
                                                                   : "pipeline");
  }
  void add_instruction_tasks(Unit& u, const RankWork& rw, const pp::Instr& in) {
    const int s = in.chunk >= 0 ? sched_.stage(u.pp, in.chunk) : -1;
    const StageWork* st = in.chunk >= 0 ? &rw.chunks[size_t(in.chunk)] : nullptr;
    switch (in.op) {
      case pp::Op::Forward: add_pass(u, st->forward, false); break;
      case pp::Op::BackwardInput: add_pass(u, st->input_grad, false); break;
      case pp::Op::BackwardWeight: add_pass(u, st->weight_grad, false); break;
      case pp::Op::Backward: add_pass(u, st->backward, false); break;
      case pp::Op::SendAct:
      case pp::Op::SendGrad: {
        Task t{TaskKind::Send};
        const bool act = in.op == pp::Op::SendAct;
        const int to_stage = act ? s + 1 : s - 1;
        t.msg = message_key(act ? 0 : 1, in.microbatch, to_stage, u.dp);
        t.peer = unit_index(u.dp, in.peer);
        t.bytes = st->activation_bytes;
        u.tasks.push_back(t);
        break;
      }
      case pp::Op::RecvAct:
      case pp::Op::RecvGrad: {
        Task t{TaskKind::Recv};
        t.msg = message_key(in.op == pp::Op::RecvAct ? 0 : 1, in.microbatch, s, u.dp);
        u.tasks.push_back(t);
        break;
      }
      case pp::Op::ReduceGrads: {
        Task t{TaskKind::StartBuckets};
        t.chunk = overlap_ ? in.chunk : -1;
        if (overlap_) u.tasks.push_back(t);
        break;
      }
      case pp::Op::WaitSends:  // the sends' time is the receivers'; on the trace as an instant span
        if (trace_) u.tasks.push_back(Task{TaskKind::Mark});
        break;
    }
  }

  void add_step_comms(Unit& u, const RankWork& rw, CommOp::When when) {
    for (size_t i = 0; i < rw.step_comms.size(); ++i) {
      const CommOp& c = rw.step_comms[i];
      if (c.when != when) continue;
      Task t{TaskKind::Sync};
      t.cat = Cat::Step;
      t.amount = group_time(u, c);
      t.sync_id = int(i);
      t.sync_group = c.group;
      u.tasks.push_back(t);
      label_tasks(u, u.tasks.size() - 1,
                  std::string(cluster::collective_name(c.kind)) + " " + group_name(c.group), "comm");
    }
  }

  // Unit u's task list: the step's start collectives, the micro-batches
  // (the schedule's instructions with pp > 1), the buckets, the update and
  // the collectives around it.
  void add_tasks(Unit& u) {
    const RankWork& rw = work_[size_t(u.pp)];
    if (P_ == 1) {  // named as the trainer's trace names an unpipelined step's micro-batches
      for (int64_t mb = 0; mb < m_; ++mb) {
        size_t from = u.tasks.size();
        add_pass(u, rw.chunks[0].forward, false);
        label_tasks(u, from, pp::to_string(pp::Instr{pp::Op::Forward, int(mb), 0}), "compute");
        from = u.tasks.size();
        add_pass(u, rw.chunks[0].backward, mb == m_ - 1 && overlap_);
        label_tasks(u, from, pp::to_string(pp::Instr{pp::Op::Backward, int(mb), 0}), "compute");
      }
    } else {
      for (const pp::Instr& in : sched_.ranks[size_t(u.pp)]) add_instruction(u, rw, in);
    }
    u.pipeline_end = 0;
    Task sb{TaskKind::StartBuckets};
    sb.chunk = -1;
    u.tasks.push_back(sb);
    u.tasks.push_back(Task{TaskKind::WaitBuckets});
    label_tasks(u, u.tasks.size() - 1, "dp wait", "wait");
    add_step_comms(u, rw, CommOp::BeforeUpdate);
    Task opt{TaskKind::Compute};
    opt.cat = Cat::Optimizer;
    opt.amount = ops_time(rw.optimizer);
    opt.joules = ops_joules(rw.optimizer);
    u.tasks.push_back(opt);
    label_tasks(u, u.tasks.size() - 1, "optimizer", "optimizer");
    add_step_comms(u, rw, CommOp::AfterUpdate);
    {
      std::vector<Task> start;
      std::swap(start, u.tasks);
      add_step_comms(u, rw, CommOp::Start);
      u.tasks.insert(u.tasks.end(), start.begin(), start.end());
    }
    const size_t nb = rw.buckets.size();
    u.bucket_ready.assign(nb, 0);
    u.bucket_requested.assign(nb, 0);
    u.bucket_request_t.assign(nb, 0);
  }

  // Bucket durations per pp rank (the groups of replica 0's ranks; every
  // replica's group spans the same nodes in the same pattern).
  void plan_bucket_durations() {
    bucket_dur_.resize(size_t(P_));
    for (int p = 0; p < P_; ++p)
      for (const BucketWork& b : work_[size_t(p)].buckets) {
        const Unit& u = units_[size_t(unit_index(0, p))];
        CommOp c{b.reduce_scatter ? cluster::Collective::ReduceScatter : cluster::Collective::AllReduce,
                 b.group, b.bytes};
        bucket_dur_[size_t(p)].push_back(group_time(u, c));
      }
  }

  // A step collective instance: (sync id, which group of that kind).
  int sync_instance(const Unit& u, Group g) const {
    switch (g) {
      case Group::pp: return u.dp;              // the stages of one replica
      case Group::dp: case Group::edp: case Group::dpcp: case Group::edpcp:
        return u.pp;  // the replicas of one stage
      case Group::tp: return int(&u - units_.data()) + 1000000;  // inside the unit
      default: return 0;
    }
  }
  int sync_members(Group g) const {
    switch (g) {
      case Group::pp: return P_;
      case Group::dp: case Group::edp: case Group::dpcp: case Group::edpcp: return replicas_;
      case Group::tp: return 1;
      default: return int(units_.size());
    }
  }

  bool bucket_is_ready(const Unit& u, size_t b) const {
    const BucketWork& bw = work_[size_t(u.pp)].buckets[b];
    for (int64_t l : bw.layers)
      if (std::find(u.layers_done.begin(), u.layers_done.end(), l) == u.layers_done.end())
        return false;
    return true;
  }
  // Schedules the next buckets of pp rank p whose every replica has requested them.
  void schedule_buckets(int p) {
    auto& ends = bucket_end_[size_t(p)];
    while (next_bucket_[size_t(p)] < ends.size()) {
      const size_t b = next_bucket_[size_t(p)];
      double start = 0;
      for (int d = 0; d < replicas_; ++d) {
        const Unit& u = units_[size_t(unit_index(d, p))];
        if (!u.bucket_requested[b]) return;
        start = std::max({start, u.bucket_request_t[b], u.channel_free});
      }
      const double end = start + bucket_dur_[size_t(p)][b];
      for (int d = 0; d < replicas_; ++d) units_[size_t(unit_index(d, p))].channel_free = end;
      ends[b] = end;
      ++next_bucket_[size_t(p)];
    }
  }
  void request(Unit& u, int chunk) {
    const auto& bs = work_[size_t(u.pp)].buckets;
    for (size_t b = 0; b < bs.size(); ++b) {
      if (u.bucket_requested[b]) continue;
      const bool match = chunk == -1 || bs[b].chunk == chunk ||
                         (chunk == -4 && u.bucket_ready[b]);  // -4: the ready ones (pp == 1)
      if (!match) continue;
      // In order: a bucket starts only after every earlier one was started.
      bool earlier = true;
      for (size_t e = 0; e < b; ++e) earlier = earlier && u.bucket_requested[e];
      if (!earlier) break;
      u.bucket_requested[b] = 1;
      u.bucket_request_t[b] = now_;
    }
    schedule_buckets(u.pp);
  }

  // Whether unit u's task t (not a compute or delay) completes now; starts
  // a compute or delay.
  bool step_task(Unit& u, Task& t) {
    switch (t.kind) {
      case TaskKind::Mark: return true;
      case TaskKind::Compute:
      case TaskKind::Delay:
        if (!u.started) {
          u.started = true;
          u.since = now_;
          u.remaining = t.amount;
          u.until = now_ + t.amount;
        }
        return false;
      case TaskKind::Send: {
        const Unit& to = units_[size_t(t.peer)];
        const double depart = std::max(now_, link_free_[{int(&u - units_.data()), t.peer}]);
        double dt = cluster::message_time(cl_, dev(u.ranks[0]), dev(to.ranks[0]), t.bytes, stage_ranks());
        if (!opts_.slow_links.empty()) {  // the slowest member's link
          double f = 1;
          for (size_t i = 0; i < u.ranks.size() && i < to.ranks.size(); ++i) {
            const auto it = opts_.slow_links.find(std::pair<int, int>(
                std::min(u.ranks[i], to.ranks[i]), std::max(u.ranks[i], to.ranks[i])));
            if (it != opts_.slow_links.end()) f = std::max(f, it->second);
          }
          dt *= f;
        }
        arrival_[t.msg] = depart + dt;
        link_free_[{int(&u - units_.data()), t.peer}] = depart + dt;
        return true;
      }
      case TaskKind::Recv: {
        auto it = arrival_.find(t.msg);
        if (!u.started) u.started = true, u.since = now_;
        if (it != arrival_.end() && it->second + u.sync_wait <= now_) {
          u.pp_wait += now_ - u.since;
          return true;
        }
        return false;
      }
      case TaskKind::StartBuckets:
        request(u, t.chunk);
        return true;
      case TaskKind::WaitBuckets: {
        if (!u.started) u.started = true, u.since = now_, u.pipeline_end = now_;
        const auto& ends = bucket_end_[size_t(u.pp)];
        bool all = true;
        for (double e : ends) all = all && e >= 0 && e <= now_;
        if (all) {
          u.dp_wait += now_ - u.since;
          return true;
        }
        return false;
      }
      case TaskKind::Sync: {
        const auto key = std::make_pair(t.sync_id, sync_instance(u, t.sync_group));
        if (!u.started) {
          u.started = true;
          u.since = now_;
          auto& [count, latest] = sync_arrived_[key];
          ++count;
          latest = std::max(latest, now_);
          if (count == sync_members(t.sync_group))
            sync_release_[key] = latest + t.amount + (sync_members(t.sync_group) > 1 ? u.sync_wait : 0);
        }
        auto it = sync_release_.find(key);
        if (it != sync_release_.end() && it->second <= now_) {
          u.step_wait += now_ - u.since;
          return true;
        }
        return false;
      }
    }
    return false;
  }

  // Every task that can complete at now_ does (instantaneous steps), until
  // none moves.
  void run_instantaneous() {
    bool moved = true;
    while (moved) {
      moved = false;
      for (Unit& u : units_) {
        while (u.pc < u.tasks.size()) {
          if (!step_task(u, u.tasks[u.pc])) break;
          complete(u, now_);
          moved = true;
        }
      }
    }
  }

  // Rates of the computing units: a shared-core pool's cores divided over
  // the ranks computing in it.
  void update_demand() {
    demand_.clear();
    for (const Unit& u : units_)
      if (u.pc < u.tasks.size() && u.tasks[u.pc].kind == TaskKind::Compute && u.pool >= 0)
        // A slowed rank (emulate.slow_ranks) sleeps part of its compute: it
        // holds its cores for speed of the time. A rank of a cluster's node
        // wants its threads' cores (cluster.hpp threads_per_rank), and its
        // ops were profiled at that many threads.
        demand_[u.pool] += double(u.ranks.size()) * threads_per_rank() * std::min(1.0, u.speed);
    cores_of_pool_ = opts_.host_cores > 0 ? double(opts_.host_cores) : double(cl_.cores_per_node);
  }
  double threads_per_rank() const {
    return opts_.host_cores > 0 ? 1.0 : double(cl_.rank_threads());
  }
  double rate(const Unit& u) {
    double r = u.speed;
    if (u.pool >= 0) r *= std::min(1.0, cores_of_pool_ / demand_[u.pool]);
    return r;
  }

  // The time of the next event (kInf: none can happen); all_done: every
  // unit has finished its tasks.
  double next_event(bool& all_done) {
    update_demand();
    double next = kInf;
    all_done = true;
    for (const Unit& u : units_) {
      if (u.pc >= u.tasks.size()) continue;
      all_done = false;
      const Task& t = u.tasks[u.pc];
      switch (t.kind) {
        case TaskKind::Compute: next = std::min(next, now_ + u.remaining / rate(u)); break;
        case TaskKind::Delay: next = std::min(next, u.until); break;
        case TaskKind::Recv:
          if (auto it = arrival_.find(t.msg); it != arrival_.end())
            next = std::min(next, it->second + u.sync_wait);
          break;
        case TaskKind::WaitBuckets: {
          double last = 0;
          bool known = true;
          for (double e : bucket_end_[size_t(u.pp)]) known = known && e >= 0, last = std::max(last, e);
          if (known) next = std::min(next, last);
          break;
        }
        case TaskKind::Sync:
          if (auto it = sync_release_.find(std::make_pair(t.sync_id, sync_instance(u, t.sync_group)));
              it != sync_release_.end())
            next = std::min(next, it->second);
          break;
        default: break;
      }
    }
    return next;
  }

  // The computes and delays run until `next`; those that end there complete.
  void advance(double next) {
    const double dt = std::max(0.0, next - now_);
    for (Unit& u : units_) {
      if (u.pc >= u.tasks.size()) continue;
      Task& t = u.tasks[u.pc];
      if (t.kind == TaskKind::Compute) {
        // The compute whose end was taken as the next event ends there, what
        // the subtraction leaves notwithstanding. Past t ~ 1.6e4 s (llama-34b's
        // 2.3e4 s step on one GPU) half an ulp of now exceeds the 1e-12 s
        // tolerance below: now + remaining rounds by more than that, and a
        // residual between the two could not move now (next == now): the loop
        // spun forever.
        const bool ends_next = now_ + u.remaining / rate(u) <= next;  // as `next` was formed
        u.remaining -= rate(u) * dt;
        if (ends_next || u.remaining <= 1e-15 * std::max(1.0, t.amount) ||
            now_ + dt >= next && u.remaining <= 1e-12) {
          const double took = next - u.since;
          (t.cat == Cat::Optimizer ? u.optimizer : u.compute) += took;
          u.joules += t.joules;
          if (t.grads_done > -3) {
            u.layers_done.push_back(t.grads_done);
            if (t.last_mb) {
              for (size_t b = 0; b < u.bucket_ready.size(); ++b)
                if (!u.bucket_ready[b] && bucket_is_ready(u, b)) u.bucket_ready[b] = 1;
            }
          }
          complete(u, next);
          if (t.last_mb && P_ == 1) {
            now_ = next;
            request(u, -4);
          }
        }
      } else if (t.kind == TaskKind::Delay && u.until <= next) {
        (t.cat == Cat::Ep ? u.ep : t.cat == Cat::Cp ? u.cp : t.cat == Cat::Dp ? u.dp_wait : u.tp) += t.amount;
        complete(u, next);
      }
    }
  }

  SimResult result() const {
    const int n_units = int(units_.size());
    SimResult r;
    r.world = world_;
    r.microbatches = m_;
    r.units_simulated = n_units;
    r.events = events_;
    for (const Unit& u : units_) {
      r.step_time_s = std::max(r.step_time_s, u.end);
      r.exposed_tp_s = std::max(r.exposed_tp_s, u.tp);
      r.exposed_ep_s = std::max(r.exposed_ep_s, u.ep);
      r.exposed_cp_s = std::max(r.exposed_cp_s, u.cp);
      r.exposed_pp_s = std::max(r.exposed_pp_s, u.pp_wait);
      r.exposed_dp_s = std::max(r.exposed_dp_s, u.dp_wait);
      r.exposed_step_s = std::max(r.exposed_step_s, u.step_wait);
      r.compute_s = std::max(r.compute_s, u.compute);
      r.optimizer_s = std::max(r.optimizer_s, u.optimizer);
    }
    if (P_ > 1) {
      double span = 0, busy = 0;
      for (const Unit& u : units_) span = std::max(span, u.pipeline_end);
      for (const Unit& u : units_) busy += u.compute + u.tp + u.ep + u.cp;
      r.bubble = span > 0 ? std::max(0.0, 1.0 - busy / (span * n_units)) : 0;
    }
    const double tokens = double(cfg_.train.global_batch) * double(cfg_.model.seq_len);
    r.tokens_per_s = tokens / r.step_time_s;
    // Energy (device.power): each device's idle power over the step plus the
    // dynamic energy of its computes; a unit stands for its tp group's
    // devices, and for the replicas not simulated. Links and hosts not counted.
    if (energy_known_ && cl_.device.power.on()) {
      double dyn = 0;
      for (const Unit& u : units_) dyn += u.joules * double(u.ranks.size()) * limiter_energy_[size_t(u.pp)];
      dyn *= double(lay_.dp * lay_.cp) / double(replicas_);
      r.energy_j = dyn + cl_.device.power.idle_w * r.step_time_s * double(world_);
      r.energy_per_token_j = r.energy_j / tokens;
      r.mean_power_w = r.energy_j / (r.step_time_s * double(world_));
    }
    r.limiter_braked = limiter_braked_, r.limiter_slowdown = limiter_slowdown_;
    r.tflops_per_gpu = mfu_flops_per_token(cfg_.model) * r.tokens_per_s / double(world_) / 1e12;
    const double peak = bytes_ <= 2 ? cl_.device.peak_bf16_flops : cl_.device.peak_fp32_flops;
    r.mfu = peak > 0 ? r.tflops_per_gpu * 1e12 / peak : 0;
    std::vector<std::vector<int64_t>> held;
    if (P_ > 1) held = pp::held_activations(sched_);
    const MemoryEstimate me = estimate_memory(cfg_, bytes_, held);
    r.memory_bytes_max = double(me.bytes_total);
    r.memory_state_bytes = double(me.bytes_params + me.bytes_grads + me.bytes_optimizer);
    r.memory_zero_working_bytes = double(me.bytes_zero_working);
    account_wan(r);
    return r;
  }

  const RunConfig& cfg_;
  const cluster::Cluster& cl_;
  OpCosts& costs_;
  const SimOptions& opts_;
  const Layout lay_;
  const cluster::SiteReduce site_reduce_ = cfg_.parallel.site_reduce == "flat"
                                               ? cluster::SiteReduce::Flat
                                               : cluster::SiteReduce::Hierarchical;
  int64_t world_ = 0;
  int P_ = 1, bytes_ = 4, replicas_ = 1;
  int64_t m_ = 1;
  std::vector<RankWork> work_;
  pp::Schedule sched_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, double> memo_;  // by every field of Op
  std::vector<Unit> units_;
  std::map<std::pair<const Unit*, const PassWork*>, std::vector<Task>> pass_cache_;
  std::vector<std::vector<double>> bucket_dur_;  // [pp][bucket] seconds
  // Simulation state.
  std::map<int64_t, double> arrival_;                // message -> arrival time
  std::map<std::pair<int, int>, double> link_free_;  // (from unit, to unit) -> free at
  std::vector<std::vector<double>> bucket_end_;      // [pp][bucket] end (replica-wide), -1
  std::vector<size_t> next_bucket_;                  // buckets are scheduled in id order
  std::map<std::pair<int, int>, std::pair<int, double>> sync_arrived_;  // -> (count, latest arrival)
  std::map<std::pair<int, int>, double> sync_release_;
  std::map<int, double> demand_;  // per shared-core pool: cores the computing ranks want
  double cores_of_pool_ = 0;
  double now_ = 0;
  int64_t events_ = 0;
  SimTrace* trace_ = nullptr;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, double> joule_memo_;
  bool energy_known_ = true;
  bool overlap_ = true;  // the buckets reduce during the backward (parallel.overlap, a core to move them)
  std::vector<double> limiter_speed_, limiter_energy_;  // per pipeline rank (1: no limiter)
  double limiter_braked_ = -1, limiter_slowdown_ = -1;   // the most of any pipeline rank (-1: none)
  std::vector<std::pair<std::string, const char*>> labels_;  // a task label's name and category
  std::map<std::string, int> label_of_;
};

}  // namespace

SimResult simulate_step(const RunConfig& cfg, const cluster::Cluster& cl, OpCosts& costs,
                        const SimOptions& opts, SimTrace* trace) {
  return StepSimulation(cfg, cl, costs, opts, trace).run();
}

std::string to_json(const SimResult& r) {
  nlohmann::json j;
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["bubble"] = r.bubble;
  j["exposed_comm_s"] = r.exposed_comm_s();
  j["exposed_s"] = {{"tp", r.exposed_tp_s}, {"pp", r.exposed_pp_s}, {"dp", r.exposed_dp_s},
                    {"ep", r.exposed_ep_s}, {"cp", r.exposed_cp_s}, {"step", r.exposed_step_s}};
  j["compute_s"] = r.compute_s;
  j["optimizer_s"] = r.optimizer_s;
  j["memory_gib_max"] = r.memory_bytes_max / 1073741824.0;
  j["memory_state_bytes"] = r.memory_state_bytes;
  j["memory_zero_working_bytes"] = r.memory_zero_working_bytes;
  j["world"] = r.world;
  j["microbatches"] = r.microbatches;
  j["units_simulated"] = r.units_simulated;
  j["events"] = r.events;
  if (r.wan_bytes > 0) {
    j["wan_bytes"] = r.wan_bytes;
    j["wan_s"] = r.wan_s;
    j["exposed_wan_s"] = r.exposed_wan_s;
  }
  if (r.energy_j > 0) {
    j["energy_j"] = r.energy_j;
    j["energy_per_token_j"] = r.energy_per_token_j;
    j["mean_power_w"] = r.mean_power_w;
  }
  if (r.limiter_braked >= 0) {
    j["limiter_braked_share"] = r.limiter_braked;
    j["limiter_slowdown"] = r.limiter_slowdown;
  }
  return j.dump();
}

}  // namespace adgt::sim
