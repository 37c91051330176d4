// Expert placement at run time (expert_controller.hpp).
#include "parallel/control/expert_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <numeric>

#include "core/model/moe_placement.hpp"
#include "parallel/adapt/change_detector.hpp"
#include "parallel/adapt/expert_choice.hpp"
#include "parallel/emulate/slowdown.hpp"

namespace adgt::adapt {
namespace {

// The least gain that moves, of the slowest rank's expected expert time: a
// placement moves optimizer state (tens of ms); a change of replicas alone
// is applied in place (about 1 ms here).
constexpr double kMinGain = 0.05, kMinGainReplicas = 0.02;
// Between placements: how much faster than the best replicas-only plan a new
// placement must be to move owners early (see decide).
constexpr double kEarlyGain = 0.15;
// Steps of capacities a decision pools (from dense compute: see decide).
constexpr int64_t kCapacitySteps = 50;
// Steps of the window a decision reads (at most; fewer when the last
// decision is closer): the loads are their sum, the capacities and costs
// their medians. It starts after the last decision, so it reads the
// placement in use only.
constexpr int64_t kObserve = 10;
// Per recorded step and rank: expert rows, expert seconds, busy seconds,
// dense CPU seconds, all-to-all seconds and bytes.
constexpr int kFields = 6;

class ExpertPlacementController final : public Controller {
 public:
  explicit ExpertPlacementController(const RunConfig& cfg)
      : interval_(cfg.parallel.expert_replace_interval),
        E_(int(cfg.model.n_experts)),
        ep_(int(cfg.parallel.ep)),
        slots_(int(std::max<int64_t>(cfg.parallel.expert_slots, cfg.model.n_experts / cfg.parallel.ep))),
        dry_run_(cfg.parallel.expert_replace_dry_run) {
    // With spare slots, the replicas alone are re-planned every kObserve
    // steps between placements (in place: no optimizer state moves).
    period_ = interval_ <= 0 ? 0 : slots_ > E_ / ep_ ? std::min(interval_, kObserve) : interval_;
  }
  std::string name() const override { return "adapt-experts"; }

  // Every step, this rank's own figures, kept for the window (no
  // communication: the window is gathered once, at the decision).
  void record(Engine& e, const StepReport& r) override {
    if (period_ <= 0) return;
    Sample smp;
    smp.step = r.step;
    smp.load.assign(size_t(E_), 0.0);
    double rows = 0, secs = 0, dense = 0, a2a_s = 0, a2a_b = 0;
    for (const MoeLayerStep& l : e.model().moe_stats()) {
      for (size_t i = 0; i < smp.load.size() && i < l.load.size(); ++i) smp.load[i] += double(l.load[i]);
      rows += double(l.expert_rows);
      a2a_s += l.a2a_seconds;
      a2a_b += double(l.a2a_bytes);
    }
    for (const MoeLayerTimes& l : e.model().moe_times()) {
      secs = secs < 0 || l.expert_s < 0 ? -1 : secs + l.expert_s;
      dense = dense < 0 || l.dense_s < 0 ? -1 : dense + l.dense_s;
    }
    if (e.groups().slowdown) {
      if (secs > 0) secs *= e.groups().slowdown->factor();
      if (dense > 0) dense *= e.groups().slowdown->factor();
    }
    // The step's compute on this rank (as parallel.auto's re-plan reads
    // it), the fallback where the layers' CPU time is not measured.
    const double busy = rank_compute_seconds(e, r);
    smp.f = {rows, secs, busy, dense, a2a_s, a2a_b};
    hist_.push_back(std::move(smp));
    while (int64_t(hist_.size()) > kObserve) hist_.pop_front();
  }

  bool due(const StepReport& r) const override {
    if (period_ <= 0 || r.step >= r.total_steps) return false;
    return r.step % period_ == 0 || r.step % interval_ == 0;
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    if (hist_.empty() || hist_.back().step != r.step) record(e, r);  // run_controllers records first
    // The window: the steps after the last decision, at most kObserve.
    const auto prev_due = [&](int64_t s) {
      return std::max((s - 1) / period_ * period_, (s - 1) / interval_ * interval_);
    };
    const int64_t first = std::max(r.step - kObserve + 1, prev_due(r.step) + 1);
    std::vector<double> load(size_t(E_), 0.0);
    constexpr int64_t W = kObserve;
    const int64_t K = 2 + W * kFields;
    std::vector<double> mine(size_t(K), -1.0);
    mine[0] = double(e.groups().coords.ep);
    mine[1] = double(e.groups().coords.pp);
    for (const Sample& smp : hist_) {
      if (smp.step < first || smp.step > r.step) continue;
      for (size_t i = 0; i < load.size(); ++i) load[i] += smp.load[i];
      const int64_t w = smp.step - (r.step - W + 1);  // slot of the window
      std::copy(smp.f.begin(), smp.f.end(), mine.begin() + 2 + w * kFields);
    }
    world.all_reduce(Tensor(load.data(), DType::F64, {int64_t(load.size())}));
    const int n = world.size();
    std::vector<double> all(size_t(K * n));
    world.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}),
                     Tensor(mine.data(), DType::F64, {K}));
    // What one replica moves per step in this stage's MoE layers: its weights
    // to it after the update, its gradient back once a step (in the last
    // backward of the step, or of the chunk in a pipeline:
    // Model::defer_replica_grads).
    const DType wd = e.model().dtype(), gd = wd == DType::BF16 ? DType::F32 : wd;
    const double replica_bytes = double(e.model().moe_stats().size()) * double(e.model().expert_block()) *
                                 (double(dtype_size(wd)) + double(dtype_size(gd)));
    nlohmann::json ep = nlohmann::json::array(), st = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      ep.push_back(int(all[size_t(K * i)]));
      st.push_back(int(all[size_t(K * i + 1)]));
    }
    // Per step of the window (a step some rank did not record is left out):
    // each field, one value per rank.
    const char* names[kFields] = {"rows", "seconds", "busy", "dense", "a2a_s", "a2a_bytes"};
    nlohmann::json steps = nlohmann::json::array();
    std::vector<nlohmann::json> fields(kFields, nlohmann::json::array());
    for (int64_t w = 0; w < W; ++w) {
      const int64_t step = r.step - W + 1 + w;
      if (step < first) continue;
      bool all_ranks = true;
      for (int i = 0; i < n; ++i) all_ranks = all_ranks && all[size_t(K * i + 2 + w * kFields)] >= 0;
      if (!all_ranks) continue;
      steps.push_back(step);
      for (int f = 0; f < kFields; ++f) {
        nlohmann::json v = nlohmann::json::array();
        for (int i = 0; i < n; ++i) v.push_back(all[size_t(K * i + 2 + w * kFields + f)]);
        fields[size_t(f)].push_back(std::move(v));
      }
    }
    // The placement and replicas in use (the engine's: a switch or an
    // in-place change of replicas updates them).
    std::vector<int64_t> owner = e.config().parallel.expert_placement;
    if (owner.empty()) {
      const auto c = ExpertPlacement::contiguous(E_, ep_);
      owner.assign(c.table().begin(), c.table().end());
    }
    nlohmann::json in = {{"step", r.step},
                         {"full", r.step % interval_ == 0},
                         {"load", load},
                         {"ep", ep},
                         {"stage", st},
                         {"steps", steps},
                         {"placement", owner},
                         {"replica_bytes", replica_bytes},
                         {"replicas", e.config().parallel.expert_replicas}};
    for (int f = 0; f < kFields; ++f) in[names[f]] = fields[size_t(f)];
    return in;
  }

  // This step's speed per ep index, its slowest holder's (relative: the
  // fastest is 1), or all 1 when not measured. From the dense compute
  // against the median of the ranks of the same pipeline stage, which do
  // the same dense work; where that is not measured, from the experts' own
  // rows per second (which small expert GEMMs bias: fewer rows per expert,
  // fewer rows per second).
  std::vector<double> capacities(const nlohmann::json& in, size_t t, bool& measured, bool& from_dense,
                                 bool& span_timed) const {
    const size_t n = in["ep"].size();
    const auto at = [&](const char* f, size_t i) { return in[f][t][i].get<double>(); };
    std::vector<double> dense(n, -1);
    std::map<int, std::vector<double>> by_stage;
    // The MoE layers' dense time (MoeLayerTimes::dense_s, the backend's own
    // time: the CPU thread's, CUDA events; times the emulated slowdown) where
    // every rank measured it. Else the step's compute less the experts' (busy, a
    // virtual or wall clock, which also counts what the rank does outside
    // the layers and scatters by tens of percent when 8 ranks share 2 cores).
    span_timed = true;
    for (size_t i = 0; i < n; ++i) span_timed = span_timed && at("dense", i) > 0;
    for (size_t i = 0; i < n; ++i) {
      const double s = at("seconds", i), b = at("busy", i);
      if (span_timed) dense[i] = at("dense", i);
      else if (s >= 0 && b - s > 0) dense[i] = b - s;
      if (dense[i] > 0) by_stage[in["stage"][i].get<int>()].push_back(dense[i]);
    }
    std::map<int, double> ref;
    for (auto& [k, v] : by_stage) ref[k] = upper_median(std::move(v));
    from_dense = std::all_of(dense.begin(), dense.end(), [](double d) { return d > 0; });
    std::vector<double> cap(size_t(ep_), 0.0);
    measured = true;
    for (size_t i = 0; i < n; ++i) {
      const int j = in["ep"][i].get<int>();
      const double rows = at("rows", i), s = at("seconds", i);
      if (s < 0) measured = false;
      if (j < 0 || j >= ep_) continue;
      double c = 0;
      if (from_dense)
        c = ref[in["stage"][i].get<int>()] / dense[i];
      else if (s > 0 && rows > 0)
        c = rows / s;
      if (c <= 0) continue;
      cap[size_t(j)] = cap[size_t(j)] > 0 ? std::min(cap[size_t(j)], c) : c;
    }
    if (!measured || std::any_of(cap.begin(), cap.end(), [](double c) { return c <= 0; }))
      std::fill(cap.begin(), cap.end(), 1.0);
    const double top = *std::max_element(cap.begin(), cap.end());
    for (double& c : cap) c /= top;
    return cap;
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const std::vector<double> load = in["load"].get<std::vector<double>>();
    const size_t T = in["steps"].size();
    WindowFigures w = window_figures(in);
    // Three steps at least, and some load.
    if (T < 3 || std::accumulate(load.begin(), load.end(), 0.0) <= 0) return {{"quiet", true}};
    std::vector<double> cap, secs;
    pool_capacities(w, cap, secs);
    const bool full = in.value("full", true);
    const std::vector<int64_t> now = in["placement"].get<std::vector<int64_t>>();
    const std::string rep_now = in["replicas"].get<std::string>();
    ReplicaCosts costs;
    if (!w.xs.empty() && !w.ps.empty()) {
      costs.expert_s = upper_median(std::move(w.xs));
      costs.per_replica_s = upper_median(std::move(w.ps)) * in["replica_bytes"].get<double>();
    }
    const Choice ch = choose(load, cap, now, rep_now, costs, full);
    return decision(ch, w, load, cap, secs, now, rep_now, costs, T);
  }

  // The move itself is the decision's "layout_request" (the trainer's).
  void apply(Engine&, const nlohmann::json&) override {}

 private:
  // What decide reads of the window, per step t of in["steps"]: capacities
  // (capacities()), the replicas' costs (the slowest rank's expert seconds
  // and the ep group's seconds per byte: the fastest rank's rate, since the
  // others' all-to-alls include waiting for the slowest, which is not what a
  // replica's bytes cost) and what each ep index computed (its busiest
  // holder's rows and slowest holder's expert seconds: with ep = dp these
  // are the rank's own; with pp or edp replicas the busiest of them, not
  // their sum). decide takes medians over the steps (one step's compute
  // times on ranks sharing cores scatter by tens of percent).
  struct WindowFigures {
    std::vector<std::vector<double>> caps;       // per step, per ep index
    std::vector<double> xs, ps;                  // per step: slowest expert seconds, seconds per byte
    std::vector<double> rows;                    // per ep index, summed over the steps
    std::vector<std::vector<double>> secs_hist;  // per ep index, per step
    bool measured = true, from_dense = true, span_timed = true;  // every step's capacities
  };

  WindowFigures window_figures(const nlohmann::json& in) const {
    const size_t n = in["ep"].size(), T = in["steps"].size();
    WindowFigures w;
    w.rows.assign(size_t(ep_), 0.0);
    w.secs_hist.resize(static_cast<size_t>(ep_));
    for (size_t t = 0; t < T; ++t) {
      bool m = false, fd = false, ct = false;
      w.caps.push_back(capacities(in, t, m, fd, ct));
      w.measured = w.measured && m, w.from_dense = w.from_dense && fd, w.span_timed = w.span_timed && ct;
      double slowest = 0;
      std::vector<double> pb;
      std::vector<double> r_ep(size_t(ep_), 0.0), s_ep(size_t(ep_), 0.0);
      for (size_t i = 0; i < n; ++i) {
        const double s = in["seconds"][t][i].get<double>(), b = in["a2a_bytes"][t][i].get<double>();
        slowest = std::max(slowest, s);
        if (b > 0) pb.push_back(in["a2a_s"][t][i].get<double>() / b);
        const int j = in["ep"][i].get<int>();
        if (j < 0 || j >= ep_) continue;
        r_ep[size_t(j)] = std::max(r_ep[size_t(j)], in["rows"][t][i].get<double>());
        s_ep[size_t(j)] = std::max(s_ep[size_t(j)], s);
      }
      if (m && slowest > 0) w.xs.push_back(slowest);
      if (!pb.empty()) w.ps.push_back(*std::min_element(pb.begin(), pb.end()));
      for (int j = 0; j < ep_; ++j)
        w.rows[size_t(j)] += r_ep[size_t(j)], w.secs_hist[size_t(j)].push_back(s_ep[size_t(j)]);
    }
    return w;
  }

  // The capacities a decision uses (cap) and each ep index's median expert
  // seconds per step (secs). Capacities from the dense compute do not depend
  // on where the experts are, so they pool over the last kCapacitySteps
  // steps, across moves (a rank's speed holds; the window's median alone read
  // full-speed ranks at 0.78-1.0 on 2 shared cores). From the expert rows
  // they would not: then the window's alone.
  void pool_capacities(const WindowFigures& w, std::vector<double>& cap, std::vector<double>& secs) {
    if (w.from_dense && w.measured) {
      cap_pool_.insert(cap_pool_.end(), w.caps.begin(), w.caps.end());
      while (int64_t(cap_pool_.size()) > kCapacitySteps) cap_pool_.pop_front();
    } else {
      cap_pool_.assign(w.caps.begin(), w.caps.end());
    }
    cap.assign(size_t(ep_), 1.0);
    secs.assign(size_t(ep_), 0.0);
    for (int j = 0; j < ep_; ++j) {
      std::vector<double> v;
      for (const auto& c : cap_pool_) v.push_back(c[size_t(j)]);
      cap[size_t(j)] = upper_median(std::move(v));
      secs[size_t(j)] = upper_median(w.secs_hist[size_t(j)]);
    }
  }

  // The plan chosen, whether it is a full placement or replicas only, and
  // whether it moves owners early.
  struct Choice {
    PlacementChoice c;
    bool full = true, early = false;
  };

  // The plan for the window's loads and capacities: a placement at a full
  // decision, else replicas only. Between placements, owners move early when
  // the replicas alone leave the slowest rank kEarlyGain slower than a new
  // placement would: the loads moved too far for the spare slots (an expert
  // the router turned to, sitting on a half-speed rank). Rare, and a move
  // costs tens of ms.
  Choice choose(const std::vector<double>& load, const std::vector<double>& cap, const std::vector<int64_t>& now,
                const std::string& rep_now, const ReplicaCosts& costs, bool full) const {
    Choice ch{choose_placement(load, cap, now, rep_now, slots_, costs, !full), full, false};
    if (!full) {
      PlacementChoice f = choose_placement(load, cap, now, rep_now, slots_, costs, false);
      const double over = ch.c.predicted_s > 0 ? 1.0 - f.predicted_s / ch.c.predicted_s
                                               : 1.0 - (1.0 + f.plan.imbalance) / (1.0 + ch.c.plan.imbalance);
      if (over >= kEarlyGain) ch.c = std::move(f), ch.full = ch.early = true;
    }
    return ch;
  }

  // The decision's record (logged) and, when it moves, its layout request
  // and console line.
  nlohmann::json decision(const Choice& ch, const WindowFigures& w, const std::vector<double>& load,
                          const std::vector<double>& cap, const std::vector<double>& secs,
                          const std::vector<int64_t>& now, const std::string& rep_now, const ReplicaCosts& costs,
                          size_t T) const {
    const PlacementChoice& c = ch.c;
    const bool full = ch.full;
    const double cur = c.imbalance_now;
    const SlotPlan& p = c.plan;
    const std::vector<int64_t>& next = c.owner;
    const std::string& rep_next = c.replicas;
    // The slowest rank's expected expert time is (1 + imbalance) x the mean;
    // with measured costs, plus the replicas' traffic.
    const double gain = c.predicted_now_s > 0 ? 1.0 - c.predicted_s / c.predicted_now_s
                                              : 1.0 - (1.0 + p.imbalance) / (1.0 + cur);
    const bool changes = next != now || rep_next != rep_now;
    const bool move = changes && gain >= (full ? kMinGain : kMinGainReplicas);
    std::string table = "[";
    for (size_t i = 0; i < next.size(); ++i) table += (i ? "," : "") + std::to_string(next[i]);
    table += "]";
    nlohmann::json d;
    const auto round3 = [](std::vector<double> v) {
      for (double& x : v) x = std::round(x * 1000) / 1000;
      return v;
    };
    const double sum = std::accumulate(load.begin(), load.end(), 0.0);
    std::vector<double> share = load;
    for (double& x : share) x /= sum;
    d["load_share"] = round3(share);
    d["scope"] = ch.early ? "placement (early)" : full ? "placement" : "replicas";
    d["window_steps"] = T;
    d["capacity"] = round3(cap);
    d["capacity_measured"] = w.measured;
    d["capacity_from"] = !w.measured     ? "none"
                         : !w.from_dense ? "expert rows"
                         : w.span_timed  ? "dense compute (backend time)"
                                         : "dense compute (step clock)";
    if (c.predicted_now_s > 0) {
      d["expert_s"] = costs.expert_s;
      d["replica_s"] = costs.per_replica_s;
      d["predicted_now_s"] = c.predicted_now_s;
      d["predicted_new_s"] = c.predicted_s;
    }
    d["placement_now"] = now;
    d["placement_new"] = next;
    // Measured in the window, per ep index: its share of the expert rows
    // (summed over the window's steps) and its expert seconds per step
    // (median); the placement in use then is placement_now.
    {
      std::vector<double> rows = w.rows;
      const double total = std::accumulate(rows.begin(), rows.end(), 0.0);
      if (total > 0)
        for (double& x : rows) x /= total;
      d["measured_rows_share"] = round3(rows);
      d["measured_expert_s"] = secs;
    }
    d["imbalance_now"] = cur;
    d["imbalance_new"] = p.imbalance;
    d["replicas_now"] = rep_now;
    d["replicas_new"] = rep_next;
    nlohmann::json req = nlohmann::json::array();
    if (move && next != now) req.push_back("parallel.expert_placement=" + table);
    if (move && rep_next != rep_now) req.push_back("parallel.expert_replicas=\"" + rep_next + "\"");
    d["layout_request"] = move && !dry_run_ ? req : nlohmann::json();
    if (dry_run_) d["dry_run"] = true;  // logged, not applied (parallel.expert_replace_dry_run)
    if (!changes && !dry_run_) d["quiet"] = true;  // nothing to log: the placement is already the plan
    char line[200];
    std::snprintf(line, sizeof line, "%s: imbalance %.3f -> %.3f (slowest rank's expert time%s %+.1f%%)",
                  move ? "move" : "keep", cur, p.imbalance,
                  c.predicted_now_s > 0 ? " and replica traffic" : "", -100.0 * gain);
    d["reason"] = line;
    if (move && !dry_run_) {
      std::printf("adapt-experts (%s): %s; placement %s%s%s\n", full ? "placement" : "replicas", line,
                  table.c_str(),
                  rep_next.empty() ? "" : "; replicas ", rep_next.c_str());
      std::fflush(stdout);
    }
    return d;
  }

  struct Sample {
    int64_t step = 0;
    std::vector<double> load;  // per expert, this rank's MoE layers
    std::vector<double> f;     // kFields values
  };
  int64_t interval_, period_ = 0;
  int E_, ep_, slots_;
  bool dry_run_;
  std::deque<Sample> hist_;  // this rank's last kObserve steps
  std::deque<std::vector<double>> cap_pool_;  // rank 0: per step, the capacities (decide)
};

}  // namespace

std::unique_ptr<Controller> make_expert_placement_controller(const RunConfig& cfg) {
  return std::make_unique<ExpertPlacementController>(cfg);
}

}  // namespace adgt::adapt
