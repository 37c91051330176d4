// Expert placement at run time (expert_controller.hpp).
#include "parallel/adapt/expert_controller.hpp"

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

constexpr double kAlpha = 0.3;     // weight of the newest step in the loads' moving average
// Steps measured before each decision; the capacities and costs are their
// medians, so a decision reads the placement in use only (a longer window
// would mix in the steps before the last move).
constexpr int64_t kObserve = 10;
constexpr double kMinGain = 0.05;  // of the slowest rank's expected expert time

class ExpertPlacementController final : public Controller {
 public:
  explicit ExpertPlacementController(const RunConfig& cfg)
      : interval_(cfg.parallel.expert_replace_interval),
        E_(int(cfg.model.n_experts)),
        ep_(int(cfg.parallel.ep)),
        slots_(int(std::max<int64_t>(cfg.parallel.expert_slots, cfg.model.n_experts / cfg.parallel.ep))) {}
  std::string name() const override { return "adapt-experts"; }
  // Measured over the kObserve steps that end at each decision step (every
  // `interval`): the measurements are two world collectives a step, which
  // cost an 8-rank run of a small model on 2 cores 12% of its step time when
  // made every step.
  bool due(const StepReport& r) const override {
    if (interval_ <= 0 || r.step >= r.total_steps) return false;
    const int64_t to_next = (interval_ - r.step % interval_) % interval_;
    return to_next < std::min<int64_t>(interval_, kObserve);
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    std::vector<double> load(size_t(E_), 0.0);
    double rows = 0, secs = 0, a2a_s = 0, a2a_b = 0;
    for (const MoeLayerStep& l : e.model().moe_stats()) {
      for (size_t i = 0; i < load.size() && i < l.load.size(); ++i) load[i] += double(l.load[i]);
      rows += double(l.expert_rows);
      secs = secs < 0 || l.expert_cpu_s < 0 ? -1 : secs + l.expert_cpu_s;
      a2a_s += l.a2a_seconds;
      a2a_b += double(l.a2a_bytes);
    }
    // What one replica moves per step in this stage's MoE layers: its weights
    // to it after the update, its gradient back once a step (in the last
    // backward of the step, or of the chunk in a pipeline:
    // Model::defer_replica_grads).
    const RunConfig& cfg = e.config();
    const DType wd = e.model().dtype(), gd = wd == DType::BF16 ? DType::F32 : wd;
    const double replica_bytes =
        double(e.model().moe_stats().size()) * 3.0 * double(cfg.model.expert_ffn() / cfg.parallel.tp) *
        double(cfg.model.d_model) *
        (double(dtype_size(wd)) + double(dtype_size(gd)));
    if (secs > 0 && e.groups().slowdown) secs *= e.groups().slowdown->factor();
    world.all_reduce(Tensor(load.data(), DType::F64, {int64_t(load.size())}));
    // The step's compute on this rank (its time outside blocking
    // communication, as parallel.auto's re-plan reads it): the dense part,
    // the same work on every rank of a pipeline stage, measures the rank's
    // speed without the experts' GEMM sizes in it.
    const double busy = e.pipelined() ? e.pipeline()->last_busy_seconds()
                                      : r.seconds - r.tp_seconds - r.pp_seconds - r.ep_seconds -
                                            e.last_times().dp_wait_s;
    constexpr int K = 7;
    double mine[K] = {double(e.groups().coords.ep), rows, secs, busy, double(e.groups().coords.pp),
                      a2a_s, a2a_b};
    const int n = world.size();
    std::vector<double> all(size_t(K * n));
    world.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(mine, DType::F64, {K}));
    nlohmann::json ep = nlohmann::json::array(), rw = nlohmann::json::array(), sc = nlohmann::json::array(),
                   bz = nlohmann::json::array(), st = nlohmann::json::array(),
                   as = nlohmann::json::array(), ab = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      ep.push_back(int(all[size_t(K * i)]));
      rw.push_back(all[size_t(K * i + 1)]);
      sc.push_back(all[size_t(K * i + 2)]);
      bz.push_back(all[size_t(K * i + 3)]);
      st.push_back(int(all[size_t(K * i + 4)]));
      as.push_back(all[size_t(K * i + 5)]);
      ab.push_back(all[size_t(K * i + 6)]);
    }
    // The placement and replicas in use (the engine's: a switch or an
    // in-place change of replicas updates them).
    std::vector<int64_t> owner = e.config().parallel.expert_placement;
    if (owner.empty()) {
      const auto c = ExpertPlacement::contiguous(E_, ep_);
      owner.assign(c.table().begin(), c.table().end());
    }
    return {{"step", r.step},   {"load", load},    {"ep", ep},           {"rows", rw},
            {"seconds", sc},    {"busy", bz},      {"stage", st},        {"placement", owner},
            {"a2a_s", as},      {"a2a_bytes", ab}, {"replica_bytes", replica_bytes},
            {"replicas", e.config().parallel.expert_replicas}};
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const std::vector<double> load = in["load"].get<std::vector<double>>();
    // This step's speed per ep index, its slowest holder's. From the dense
    // compute (busy minus expert time) against the median of the ranks of
    // the same pipeline stage, which do the same dense work; where that is
    // not measured, from the experts' own rows per second (which small
    // expert GEMMs bias: fewer rows per expert, fewer rows per second).
    const size_t n = in["ep"].size();
    std::vector<double> dense(n, -1);
    std::map<int, std::vector<double>> by_stage;
    for (size_t i = 0; i < n; ++i) {
      const double s = in["seconds"][i].get<double>(), b = in["busy"][i].get<double>();
      if (s >= 0 && b - s > 0) dense[i] = b - s;
      if (dense[i] > 0) by_stage[in["stage"][i].get<int>()].push_back(dense[i]);
    }
    std::map<int, double> ref;
    for (auto& [k, v] : by_stage) ref[k] = upper_median(std::move(v));
    const bool from_dense = std::all_of(dense.begin(), dense.end(), [](double d) { return d > 0; });
    std::vector<double> cap(size_t(ep_), 0.0);
    bool measured = true;
    for (size_t i = 0; i < n; ++i) {
      const int j = in["ep"][i].get<int>();
      const double rows = in["rows"][i].get<double>(), s = in["seconds"][i].get<double>();
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
    const auto blend = [](std::vector<double>& avg, const std::vector<double>& x) {
      if (avg.empty()) avg = x;
      else
        for (size_t i = 0; i < avg.size(); ++i) avg[i] = (1 - kAlpha) * avg[i] + kAlpha * x[i];
    };
    blend(load_, load);
    // Capacities: each ep index's median over the last kObserve steps (one
    // step's compute times on ranks sharing cores scatter by tens of percent).
    cap_hist_.push_back(cap);
    while (int64_t(cap_hist_.size()) > kObserve) cap_hist_.pop_front();
    // The costs of replicas, measured: the slowest rank's expert seconds and
    // the ep group's seconds per byte (its all-to-alls), then medians over
    // the steps like the capacities'.
    double slowest = 0, per_byte = -1;
    std::vector<double> pb;
    for (size_t i = 0; i < n; ++i) {
      slowest = std::max(slowest, in["seconds"][i].get<double>());
      const double b = in["a2a_bytes"][i].get<double>();
      if (b > 0) pb.push_back(in["a2a_s"][i].get<double>() / b);
    }
    // The fastest rank's rate: the others' all-to-alls include waiting for
    // the slowest (a straggler), which is not what a replica's bytes cost.
    if (!pb.empty()) per_byte = *std::min_element(pb.begin(), pb.end());
    cost_hist_.push_back({measured ? slowest : -1, per_byte});
    while (int64_t(cost_hist_.size()) > kObserve) cost_hist_.pop_front();
    // What each ep index computed in the window (logged with the decision):
    // its busiest holder's rows and slowest holder's expert seconds. With
    // ep = dp (one rank per ep index and stage) these are the rank's own;
    // with pp or edp replicas it is the busiest of them, not their sum.
    std::vector<double> rows_ep(size_t(ep_), 0.0), secs_ep(size_t(ep_), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const int j = in["ep"][i].get<int>();
      if (j < 0 || j >= ep_) continue;
      rows_ep[size_t(j)] = std::max(rows_ep[size_t(j)], in["rows"][i].get<double>());
      secs_ep[size_t(j)] = std::max(secs_ep[size_t(j)], in["seconds"][i].get<double>());
    }
    work_hist_.push_back({rows_ep, secs_ep});
    while (int64_t(work_hist_.size()) > kObserve) work_hist_.pop_front();
    cap_.assign(size_t(ep_), 1.0);
    for (int j = 0; j < ep_; ++j) {
      std::vector<double> v;
      for (const auto& c : cap_hist_) v.push_back(c[size_t(j)]);
      cap_[size_t(j)] = upper_median(std::move(v));
    }
    ++seen_;
    const int64_t step = in["step"].get<int64_t>();
    if (interval_ <= 0 || step % interval_ != 0 || seen_ < 3) return {{"quiet", true}};
    if (std::accumulate(load_.begin(), load_.end(), 0.0) <= 0) return {{"quiet", true}};

    const std::vector<int64_t> now = in["placement"].get<std::vector<int64_t>>();
    const std::string rep_now = in["replicas"].get<std::string>();
    ReplicaCosts costs;
    {
      std::vector<double> xs, ps;
      for (const auto& [x, p] : cost_hist_) {
        if (x > 0) xs.push_back(x);
        if (p > 0) ps.push_back(p);
      }
      if (!xs.empty() && !ps.empty()) {
        costs.expert_s = upper_median(std::move(xs));
        costs.per_replica_s = upper_median(std::move(ps)) * in["replica_bytes"].get<double>();
      }
    }
    const PlacementChoice c = choose_placement(load_, cap_, now, rep_now, slots_, costs);
    const double cur = c.imbalance_now;
    const SlotPlan& p = c.plan;
    const std::vector<int64_t>& next = c.owner;
    const std::string& rep_next = c.replicas;
    // The slowest rank's expected expert time is (1 + imbalance) x the mean;
    // with measured costs, plus the replicas' traffic.
    const double gain = c.predicted_now_s > 0 ? 1.0 - c.predicted_s / c.predicted_now_s
                                              : 1.0 - (1.0 + p.imbalance) / (1.0 + cur);
    const bool changes = next != now || rep_next != rep_now;
    const bool move = changes && gain >= kMinGain;
    std::string table = "[";
    for (size_t i = 0; i < next.size(); ++i) table += (i ? "," : "") + std::to_string(next[i]);
    table += "]";
    nlohmann::json d;
    const auto round3 = [](std::vector<double> v) {
      for (double& x : v) x = std::round(x * 1000) / 1000;
      return v;
    };
    const double sum = std::accumulate(load_.begin(), load_.end(), 0.0);
    std::vector<double> share = load_;
    for (double& x : share) x /= sum;
    d["load_share"] = round3(share);
    d["capacity"] = round3(cap_);
    d["capacity_measured"] = measured;
    d["capacity_from"] = !measured ? "none" : from_dense ? "dense compute" : "expert rows";
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
      std::vector<double> rows(size_t(ep_), 0.0), secs(size_t(ep_), 0.0);
      for (int j = 0; j < ep_; ++j) {
        std::vector<double> v;
        for (const auto& [r, s] : work_hist_) rows[size_t(j)] += r[size_t(j)], v.push_back(s[size_t(j)]);
        secs[size_t(j)] = upper_median(std::move(v));
      }
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
    d["layout_request"] = move ? req : nlohmann::json();
    if (!changes) d["quiet"] = true;  // nothing to log: the placement is already the plan
    char line[200];
    std::snprintf(line, sizeof line, "%s: imbalance %.3f -> %.3f (slowest rank's expert time%s %+.1f%%)",
                  move ? "move" : "keep", cur, p.imbalance,
                  c.predicted_now_s > 0 ? " and replica traffic" : "", -100.0 * gain);
    d["reason"] = line;
    if (move) {
      std::printf("adapt-experts: %s; placement %s%s%s\n", line, table.c_str(),
                  rep_next.empty() ? "" : "; replicas ", rep_next.c_str());
      std::fflush(stdout);
    }
    return d;
  }

  // The move itself is the decision's "layout_request" (the trainer's).
  void apply(Engine&, const nlohmann::json&) override {}

 private:
  int64_t interval_;
  int E_, ep_, slots_;
  std::vector<double> load_, cap_;
  std::deque<std::vector<double>> cap_hist_;
  // per step of the window: each ep index's expert rows and seconds
  std::deque<std::pair<std::vector<double>, std::vector<double>>> work_hist_;
  std::deque<std::pair<double, double>> cost_hist_;  // (slowest expert s, ep s per byte) per step
  int64_t seen_ = 0;
};

}  // namespace

std::unique_ptr<Controller> make_expert_placement_controller(const RunConfig& cfg) {
  return std::make_unique<ExpertPlacementController>(cfg);
}

}  // namespace adgt::adapt
