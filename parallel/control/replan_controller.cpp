// parallel.auto at run time (replan_controller.hpp; docs/planner.md "Re-planning").
#include "parallel/control/replan_controller.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/layout.hpp"
#include "parallel/adapt/change_detector.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/measure/pipeline_times.hpp"
#include "parallel/pipeline/executor.hpp"
#include "parallel/plan/launch_plan.hpp"

namespace adgt::plan {

namespace {
// The median of the faster (smaller) half of v (at least one value): the
// reference a sample is slow against, so that one slow sample does not set
// it and one fast outlier does not either.
double faster_half_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t half = (v.size() + 1) / 2;
  return half % 2 ? v[half / 2] : 0.5 * (v[half / 2 - 1] + v[half / 2]);
}

std::string link_name(const LinkKey& k) { return std::to_string(k.first) + "-" + std::to_string(k.second); }
double rounded(double f) { return std::round(f * 1000) / 1000; }
}  // namespace

adapt::DetectorOptions ReplanDecider::detector_options() const {
  adapt::DetectorOptions d;
  d.threshold = o_.threshold;
  d.window = o_.window;
  d.confirm = o_.confirm;  // (confirmed here, over every series together)
  d.warmup = o_.window;
  d.drift = 0;  // the reference is the planned slowdown until the next re-plan
  return d;
}

adapt::ChangeDetector ReplanDecider::detector(double planned) const {
  adapt::ChangeDetector d(detector_options());
  d.rebase(planned);
  return d;
}

double ReplanDecider::floored(double f) const { return f < o_.min_slowdown ? 1.0 : f; }

std::map<int, double> ReplanDecider::estimate() const {
  // The median of each rank's window; below min_slowdown it is measurement
  // noise (ranks sharing cores, caches) and counts as full speed (the
  // samples are floored: the median of floored samples is the floored median).
  std::map<int, double> out;
  for (const auto& [r, d] : ranks_)
    if (d.count() > 0) out[r] = d.level();
  return out;
}

std::map<LinkKey, double> ReplanDecider::link_estimate() const {
  std::map<LinkKey, double> out;
  for (const auto& [k, d] : links_)
    if (d.full()) out[k] = d.level();
  return out;
}

nlohmann::json ReplanDecider::add(const std::vector<ReplanSample>& step, const PlanFn& plan,
                                  const std::vector<ReplanLink>& links) {
  // Slowdown: the time over that of the ranks doing the same work (the same
  // pipeline rank): the median of the faster half of them.
  std::map<int, std::vector<double>> by_stage;
  for (const ReplanSample& s : step)
    if (s.seconds > 0) by_stage[s.stage].push_back(s.seconds);
  std::map<int, double> ref;
  for (auto& [st, v] : by_stage) ref[st] = faster_half_median(v);
  for (const ReplanSample& s : step) {
    auto it = ref.find(s.stage);
    if (it == ref.end() || s.seconds <= 0 || it->second <= 0) continue;
    auto d = ranks_.find(s.launcher);
    if (d == ranks_.end()) {
      const auto p = s_->planned.find(s.launcher);
      d = ranks_.emplace(s.launcher, detector(p == s_->planned.end() ? 1.0 : p->second)).first;
    }
    d->second.record(floored(s.seconds / it->second));
  }
  // A link's slowdown: its measured time over the model's, against the
  // faster half of all links' ratios this step.
  std::vector<double> ratios;
  for (const ReplanLink& l : links)
    if (l.seconds > 0 && l.model > 0 && l.a != l.b) ratios.push_back(l.seconds / l.model);
  if (!ratios.empty()) {
    const double lref = faster_half_median(ratios);
    for (const ReplanLink& l : links) {
      if (!(l.seconds > 0 && l.model > 0 && l.a != l.b && lref > 0)) continue;
      const LinkKey k(std::min(l.a, l.b), std::max(l.a, l.b));
      auto d = links_.find(k);
      if (d == links_.end()) {
        const auto p = s_->planned_links.find(k);
        d = links_.emplace(k, detector(p == s_->planned_links.end() ? 1.0 : p->second)).first;
      }
      d->second.record(floored(l.seconds / l.model / lref));
    }
  }
  if (ranks_.empty()) return {};
  for (const auto& [r, d] : ranks_)
    if (!d.full()) return {};
  bool changed = false;
  for (const auto& [r, d] : ranks_) changed = changed || d.out_of_band();
  for (const auto& [k, d] : links_) changed = changed || d.out_of_band();
  // A change must hold for `confirm` steps in a row: on ranks sharing cores
  // one rank's CPU time can read 2x its peer's for a few steps (a clean
  // 4-rank run re-planned twice without it).
  pending_ = changed ? pending_ + 1 : 0;
  if (pending_ < o_.confirm) return {};
  pending_ = 0;
  const std::map<int, double> est = estimate();
  const std::map<LinkKey, double> lest = link_estimate();
  // The planner gets the slow ranks (the others are at full speed) and the
  // slow links: the measured ones, and those planned for before that this
  // layout does not use (nothing says they recovered).
  std::map<int, double> slow;
  for (const auto& [r, f] : est)
    if (f > 1.0) slow[r] = f;
  std::map<LinkKey, double> slow_links = s_->planned_links;
  for (const auto& [k, f] : lest) {
    if (f > 1.0)
      slow_links[k] = f;
    else
      slow_links.erase(k);
  }
  nlohmann::json d = plan(slow, slow_links);
  nlohmann::json measured = nlohmann::json::object(), was = nlohmann::json::object();
  for (const auto& [r, f] : est) measured[std::to_string(r)] = rounded(f);
  for (const auto& [r, f] : s_->planned) was[std::to_string(r)] = rounded(f);
  d["measured_slowdown"] = measured;
  d["planned_for"] = was;
  if (!lest.empty() || !s_->planned_links.empty()) {
    nlohmann::json lm = nlohmann::json::object(), lw = nlohmann::json::object();
    for (const auto& [k, f] : lest) lm[link_name(k)] = rounded(f);
    for (const auto& [k, f] : s_->planned_links) lw[link_name(k)] = rounded(f);
    d["measured_link_slowdown"] = lm;
    d["planned_for_links"] = lw;
  }
  s_->planned = est;
  s_->planned_links = slow_links;
  ++s_->replans;
  if (d.contains("layout_request") && d["layout_request"].is_array() && !d["layout_request"].empty())
    ++s_->switches;
  // The next windows start empty, against what was just planned for.
  ranks_.clear();
  links_.clear();
  return d;
}

namespace {

using EmulatedLinkTotal = emulate::EmulatedRank::LinkTime;

class ReplanController final : public Controller {
 public:
  ReplanController(const RunConfig& cfg, std::shared_ptr<ReplanState> s, ReplanOptions o)
      : cfg_(cfg), o_(o), s_(s), decider_(o, s) {}
  std::string name() const override { return "replan"; }
  bool due(const StepReport& r) const override {
    if (first_ < 0) first_ = r.step;  // the same step on every rank
    return r.step - first_ >= o_.warmup && r.step < r.total_steps;
  }
  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    const double secs = std::max(0.0, rank_compute_seconds(e, r));
    double pred = -1, link_s = 0;
    link_seconds(e, r, pred, link_s);
    double mine[5] = {double(world_rank_or(world.rank())), double(e.groups().coords.pp), secs, pred,
                      link_s};
    const int n = world.size();
    std::vector<double> all(size_t(5 * n));
    world.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(mine, DType::F64, {5}));
    nlohmann::json launcher = nlohmann::json::array(), stage = nlohmann::json::array(),
                   seconds = nlohmann::json::array(), preds = nlohmann::json::array(),
                   links = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      launcher.push_back(int(all[size_t(5 * i)]));
      stage.push_back(int(all[size_t(5 * i + 1)]));
      seconds.push_back(all[size_t(5 * i + 2)]);
      preds.push_back(int(all[size_t(5 * i + 3)]));
      links.push_back(all[size_t(5 * i + 4)]);
    }
    const RunConfig& c = e.config();
    const double bytes = double(pipeline_message_elems(c)) *
                         double(dtype_size(e.model().dtype()));
    return {{"launcher", launcher}, {"stage", stage}, {"seconds", seconds},
            {"pred", preds},        {"link_s", links}, {"message_bytes", bytes}};
  }
  nlohmann::json decide(const nlohmann::json& in) override {
    std::vector<ReplanSample> step;
    for (size_t i = 0; i < in["seconds"].size(); ++i)
      step.push_back({in["launcher"][i].get<int>(), in["stage"][i].get<int>(), in["seconds"][i].get<double>()});
    const std::vector<ReplanLink> links = link_samples(in);
    nlohmann::json d = decider_.add(step, [&](const std::map<int, double>& slow,
                                              const std::map<LinkKey, double>& slow_links) {
      nlohmann::json rec;
      try {
        const Replan p = replan(cfg_, s_->fixed, s_->hosts, slow, slow_links);
        const double now = p.current.step_time_s, next = p.planned.step_time_s;
        rec["layout_now"] = p.layout_now;
        rec["layout_new"] = p.layout_new;
        rec["predicted_now_s"] = now;
        rec["predicted_new_s"] = next;
        const bool better = p.layout_new != p.layout_now && next < now * (1.0 - o_.min_gain);
        rec["layout_request"] = better ? nlohmann::json(p.overrides) : nlohmann::json();
        char why[200];
        std::snprintf(why, sizeof why, "%s: predicted %.4g s against %.4g s now (%+.1f%%)",
                      better ? "switch" : "keep", next, now, 100.0 * (next / now - 1.0));
        rec["reason"] = why;
        std::printf("replan: measured slowdowns changed%s; %s; %s -> %s\n",
                    slow_links.empty() ? "" : " (slow links too)", why, p.layout_now.c_str(),
                    p.layout_new.c_str());
        std::fflush(stdout);
      } catch (const std::exception& e) {  // no plan: keep the layout, say why
        rec["layout_request"] = nullptr;
        rec["reason"] = std::string("keep: the re-plan failed: ") + e.what();
        std::fprintf(stderr, "replan: %s\n", rec["reason"].get<std::string>().c_str());
      }
      return rec;
    }, links);
    if (d.is_null() || d.empty()) return {{"quiet", true}};
    return d;
  }
  // The switch itself is the decision's "layout_request" (the trainer's).
  void apply(Engine&, const nlohmann::json&) override {}

 private:
  // This rank's pipeline predecessor (layout world rank; -1: none) and the
  // seconds per message received from it since the last call: the link
  // emulation's own timing, or on real transports a probe every
  // probe_every steps (0 between probes: no sample).
  void link_seconds(Engine& e, const StepReport& r, double& pred, double& secs) {
    const ParallelContext& g = e.groups();
    if (!e.pipelined() || !g.pp || g.pp->size() <= 1 || !g.layout) return;
    const int k = g.pp->rank();
    if (k > 0) {
      RankCoords c = g.coords;
      c.pp = k - 1;
      pred = rank_of(*g.layout, c);
    }
    if (g.emulation) {
      if (k == 0) return;
      const auto totals = g.emulation->link_totals(g.pp->name());
      const auto it = totals.find(k - 1);
      if (it == totals.end()) return;
      const double ds = it->second.seconds - last_total_.seconds;
      const int64_t dm = it->second.messages - last_total_.messages;
      last_total_ = it->second;
      if (dm > 0) secs = ds / double(dm);
      return;
    }
    if (o_.probe_every <= 0 || r.step % o_.probe_every != 0) return;
    const std::vector<double> t = probe_pipeline_links(e);
    if (k > 0 && size_t(k - 1) < t.size()) secs = t[size_t(k - 1)];
  }

  // The decision's link samples: each rank's link from its predecessor, with
  // the cluster model's time for the message (cached per link).
  std::vector<ReplanLink> link_samples(const nlohmann::json& in) {
    std::vector<ReplanLink> out;
    if (!in.contains("pred")) return out;
    const auto& launcher = in["launcher"];
    std::vector<std::pair<int, int>> missing;
    for (size_t i = 0; i < in["pred"].size(); ++i) {
      const int p = in["pred"][i].get<int>();
      const double secs = in["link_s"][i].get<double>();
      if (p < 0 || size_t(p) >= launcher.size() || secs <= 0) continue;
      const int a = launcher[size_t(p)].get<int>(), b = launcher[i].get<int>();
      out.push_back({a, b, secs, 0});
      if (!model_.count({a, b})) missing.push_back({a, b});
    }
    if (!missing.empty()) {
      try {
        for (const auto& [k, t] :
             link_model_times(cfg_, s_->hosts, missing, in["message_bytes"].get<double>()))
          model_[k] = t;
      } catch (const std::exception& e) {  // no model: the links go unmeasured
        std::fprintf(stderr, "replan: no link model (%s); links are not compared\n", e.what());
        for (const auto& k : missing) model_[k] = 0;
      }
    }
    for (ReplanLink& l : out) l.model = model_[{l.a, l.b}];
    return out;
  }

  EmulatedLinkTotal last_total_;
  std::map<std::pair<int, int>, double> model_;
  RunConfig cfg_;
  ReplanOptions o_;
  std::shared_ptr<ReplanState> s_;
  ReplanDecider decider_;
  mutable int64_t first_ = -1;
};

}  // namespace

std::unique_ptr<Controller> make_replan_controller(const RunConfig& cfg,
                                                   std::shared_ptr<ReplanState> state,
                                                   ReplanOptions opts) {
  opts.threshold = cfg.parallel.adapt_threshold;  // one threshold for the adaptive layer
  return std::make_unique<ReplanController>(cfg, std::move(state), opts);
}

}  // namespace adgt::plan
