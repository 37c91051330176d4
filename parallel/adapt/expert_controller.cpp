// Expert placement at run time (expert_controller.hpp).
#include "parallel/adapt/expert_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/model/moe_placement.hpp"
#include "parallel/adapt/expert_choice.hpp"
#include "parallel/emulate/slowdown.hpp"

namespace adgt::adapt {
namespace {

constexpr double kAlpha = 0.3;     // weight of the newest step in the moving averages
constexpr double kMinGain = 0.05;  // of the slowest rank's expected expert time

class ExpertPlacementController final : public Controller {
 public:
  explicit ExpertPlacementController(const RunConfig& cfg)
      : interval_(cfg.parallel.expert_replace_interval),
        E_(int(cfg.model.n_experts)),
        ep_(int(cfg.parallel.ep)),
        slots_(int(std::max<int64_t>(cfg.parallel.expert_slots, cfg.model.n_experts / cfg.parallel.ep))) {}
  std::string name() const override { return "adapt-experts"; }
  bool due(const StepReport& r) const override { return r.step < r.total_steps; }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    std::vector<double> load(size_t(E_), 0.0);
    double rows = 0, secs = 0;
    for (const MoeLayerStep& l : e.model().moe_stats()) {
      for (size_t i = 0; i < load.size() && i < l.load.size(); ++i) load[i] += double(l.load[i]);
      rows += double(l.expert_rows);
      secs = secs < 0 || l.expert_cpu_s < 0 ? -1 : secs + l.expert_cpu_s;
    }
    if (secs > 0 && e.groups().slowdown) secs *= e.groups().slowdown->factor();
    world.all_reduce(Tensor(load.data(), DType::F64, {int64_t(load.size())}));
    double mine[3] = {double(e.groups().coords.ep), rows, secs};
    const int n = world.size();
    std::vector<double> all(size_t(3 * n));
    world.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(mine, DType::F64, {3}));
    nlohmann::json ep = nlohmann::json::array(), rw = nlohmann::json::array(), sc = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      ep.push_back(int(all[size_t(3 * i)]));
      rw.push_back(all[size_t(3 * i + 1)]);
      sc.push_back(all[size_t(3 * i + 2)]);
    }
    // The placement and replicas in use (the engine's: a switch or an
    // in-place change of replicas updates them).
    std::vector<int64_t> owner = e.config().parallel.expert_placement;
    if (owner.empty()) {
      const auto c = ExpertPlacement::contiguous(E_, ep_);
      owner.assign(c.table().begin(), c.table().end());
    }
    return {{"step", r.step},       {"load", load},  {"ep", ep},
            {"rows", rw},           {"seconds", sc}, {"placement", owner},
            {"replicas", e.config().parallel.expert_replicas}};
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const std::vector<double> load = in["load"].get<std::vector<double>>();
    // This step's throughput per ep index: its slowest holder's rows per second.
    std::vector<double> cap(size_t(ep_), 0.0);
    bool measured = true;
    for (size_t i = 0; i < in["ep"].size(); ++i) {
      const int j = in["ep"][i].get<int>();
      const double rows = in["rows"][i].get<double>(), s = in["seconds"][i].get<double>();
      if (s < 0) measured = false;
      if (j < 0 || j >= ep_ || s <= 0 || rows <= 0) continue;
      const double c = rows / s;
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
    blend(cap_, cap);
    ++seen_;
    const int64_t step = in["step"].get<int64_t>();
    if (interval_ <= 0 || step % interval_ != 0 || seen_ < 3) return {{"quiet", true}};
    if (std::accumulate(load_.begin(), load_.end(), 0.0) <= 0) return {{"quiet", true}};

    const std::vector<int64_t> now = in["placement"].get<std::vector<int64_t>>();
    const std::string rep_now = in["replicas"].get<std::string>();
    const PlacementChoice c = choose_placement(load_, cap_, now, rep_now, slots_);
    const double cur = c.imbalance_now;
    const SlotPlan& p = c.plan;
    const std::vector<int64_t>& next = c.owner;
    const std::string& rep_next = c.replicas;
    // The slowest rank's expected expert time is (1 + imbalance) x the mean.
    const double gain = 1.0 - (1.0 + p.imbalance) / (1.0 + cur);
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
    d["placement_now"] = now;
    d["placement_new"] = next;
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
    std::snprintf(line, sizeof line, "%s: imbalance %.3f -> %.3f (slowest rank's expert time %+.1f%%)",
                  move ? "move" : "keep", cur, p.imbalance, -100.0 * gain);
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
  int64_t seen_ = 0;
};

}  // namespace

std::unique_ptr<Controller> make_expert_placement_controller(const RunConfig& cfg) {
  return std::make_unique<ExpertPlacementController>(cfg);
}

}  // namespace adgt::adapt
