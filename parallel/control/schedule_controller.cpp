// The dynamic pipeline schedule controller (schedule_controller.hpp).
#include "parallel/control/schedule_controller.hpp"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <vector>

#include "kernels/check.hpp"
#include "parallel/adapt/change_detector.hpp"
#include "parallel/adapt/layer_balance.hpp"
#include "parallel/adapt/schedule_choice.hpp"
#include "parallel/cost/stages.hpp"
#include "parallel/measure/pipeline_times.hpp"
#include "parallel/pipeline/executor.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/pipeline/schedule_json.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt::adapt {
namespace {

// A link change below this share of a stage's compute cannot move a plan.
constexpr double kLinkFloor = 0.05;

// Per stage, the median of each of F, B and W over `v` (same stage counts).
pp::StageCosts median_costs(const std::deque<pp::StageCosts>& v) {
  pp::StageCosts c = v.back();
  const auto med = [&](auto field, size_t s) {
    std::vector<double> x;
    for (const pp::StageCosts& k : v) x.push_back((k.*field)[s]);
    std::sort(x.begin(), x.end());
    const size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  };
  for (size_t s = 0; s < c.f.size(); ++s) {
    c.f[s] = med(&pp::StageCosts::f, s);
    c.b[s] = med(&pp::StageCosts::b, s);
    c.w[s] = med(&pp::StageCosts::w, s);
  }
  // The single instructions' spread: every step's measured quantiles pooled.
  c.jitter.clear();
  for (const pp::StageCosts& k : v) c.jitter.insert(c.jitter.end(), k.jitter.begin(), k.jitter.end());
  return c;
}

bool has_op(const pp::Schedule& s, pp::Op op) {
  for (const auto& list : s.ranks)
    for (const pp::Instr& x : list)
      if (x.op == op) return true;
  return false;
}

class ScheduleAdapter final : public Controller {
 public:
  ScheduleAdapter(const RunConfig& cfg, DetectorOptions o)
      : opts_(o), model_(cfg.model), layers_(cfg.parallel.adapt == "schedule+layers"),
        jitter_samples_(int(cfg.parallel.adapt_jitter_samples)), run_cfg_(cfg),
        adapt_(cfg.parallel.adapt != "off"),
        list_warmup_(cfg.parallel.schedule == "greedy" || cfg.parallel.schedule == "zb-v") {
    // Layer moves: one chunk per pipeline rank (the stage is the rank).
    if (layers_ && cfg.parallel.virtual_stages == 1) counts_ = stage_layer_counts(cfg);
  }
  std::string name() const override { return "adapt-schedule"; }
  bool due(const StepReport& r) const override {
    return (adapt_ && r.step > r.first_step) || list_step(r);
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    current_ = &e.pipeline()->schedule();  // decide() re-plans from it (rank 0)
    if (!adapt_) return list_inputs(measured_stage_costs(e, world));
    nlohmann::json in = adapt_inputs(e, r, world);
    if (list_step(r)) in["list_schedule"] = list_inputs(last_measured_)["list_schedule"];
    return in;
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    if (in.contains("list_schedule")) return list_decision(in["list_schedule"]);
    return adapt_decision(in);
  }

  void apply(Engine& e, const nlohmann::json& d) override {
    if (d.value("list_schedule", false)) {
      // The warm-up re-plan replaces the schedule only: the detectors go on
      // measuring as they were (their warm-up outlasts it).
      PipelineExecutor& pipe = *e.pipeline();
      pipe.set_schedule(schedule_from_json(pipe.schedule(), d.at("schedule").get<std::string>(),
                                           d.at("kept").get<std::string>(), d.at("ranks")));
      current_ = &pipe.schedule();
      return;
    }
    adapt_apply(e, d);
  }

 private:
  // The warm-up mode of a list-scheduled pipeline (parallel.schedule greedy
  // or zb-v): after the run's second step (the first warms caches and
  // buffers) the configured schedule is generated again, by the generator
  // that planned the first steps from the FLOP cost model, from the F, B and
  // W measured on that step (the maximum over the world).
  bool list_step(const StepReport& r) const { return list_warmup_ && r.step == r.first_step + 2; }

  static nlohmann::json list_inputs(const pp::StageCosts& c) {
    nlohmann::json in;
    in["f_s"] = c.f;
    in["b_s"] = c.b;
    in["w_s"] = c.w;
    return {{"list_schedule", in}};
  }

  nlohmann::json list_decision(const nlohmann::json& in) const {
    pp::StageCosts c;
    for (double f : in["f_s"]) c.f.push_back(std::max(f, 1e-9));
    for (double b : in["b_s"]) c.b.push_back(std::max(b, 1e-9));
    for (double w : in["w_s"]) c.w.push_back(w);
    const pp::Schedule s = engine_schedule(run_cfg_, &c);
    const pp::Timeline sim = pp::time_schedule(s, c);
    nlohmann::json d;
    d["list_schedule"] = true;
    d["schedule"] = s.name;
    d["kept"] = s.detail.empty() ? s.name : s.detail;
    d["predicted_bubble"] = sim.bubble_fraction;
    d["predicted_step_s"] = sim.makespan;
    d["ranks"] = schedule_ranks_json(s);
    char b[160];
    std::snprintf(b, sizeof b, " from the measured stage times (predicted bubble %.1f%%)",
                  100 * sim.bubble_fraction);
    d["console"] = "pipeline schedule -> " + s.name + b;
    return d;
  }

  nlohmann::json adapt_inputs(Engine& e, const StepReport& r, Comm& world) {
    // The memory the run was planned with: what the engine's own schedule
    // holds (the configured one, before any re-plan of this controller).
    if (held_limit_ < 0) {
      held_limit_ = pp::max_held_activations(*current_);
      cfg_ = e.config();
      budget_ = memory_budget(cfg_, *current_, e.backend().memory_capacity_bytes());
    }
    const pp::StageCosts now = measured_stage_costs(e, world);
    last_measured_ = now;
    const std::vector<double> links = measured_link_times(e, world);
    const int S = now.stages();
    // The re-plan reads each stage's F, B and W as medians over the last
    // `window` steps (the detectors' window): one step's times carry its noise.
    recent_.push_back(now);
    while (int(recent_.size()) > std::max(1, opts_.window)) recent_.pop_front();
    const pp::StageCosts c = median_costs(recent_);
    recent_links_.push_back(links);
    while (int(recent_links_.size()) > std::max(1, opts_.window)) recent_links_.pop_front();
    if (detectors_.empty()) detectors_.assign(size_t(S), ChangeDetector(opts_));
    if (link_detectors_.empty()) link_detectors_.assign(links.size(), ChangeDetector(opts_));
    // Every rank feeds the same agreed samples: the same flags everywhere.
    bool warmed = false, changed = false;
    std::vector<double> ratio(size_t(S), 1.0);
    std::vector<int> flagged;
    for (int s = 0; s < S; ++s) {
      ChangeDetector& d = detectors_[size_t(s)];
      const bool was_ready = d.ready();
      if (d.add(now.f[size_t(s)] + now.b[size_t(s)] + now.w[size_t(s)])) {
        changed = true;
        ratio[size_t(s)] = d.last_ratio();
        flagged.push_back(s);
      }
      warmed |= !was_ready && d.ready() && (!planned_ || refine_);
    }
    // A re-plan rebases every stage's detector on the level it planned
    // with (apply), so a change under way on another stage, not yet
    // confirmed, is either in the plan (its window's median) or flagged
    // against it afterwards. The record shows it: each stage's ratio is its
    // running median over its reference, the flagged stages' the confirmed
    // change.
    if (changed)
      for (int s = 0; s < S; ++s) {
        const ChangeDetector& d = detectors_[size_t(s)];
        if (d.ready() && std::find(flagged.begin(), flagged.end(), s) == flagged.end())
          ratio[size_t(s)] = d.level() / d.reference();
      }
    // A link's time (measured_link_times: the emulation's, or a probe on real
    // transports), from the first step a message crosses it; a link no
    // message crossed is not fed. A change counts only when the link's time,
    // before or after, is at least 5% of a stage's mean compute (F + B + W):
    // below that it cannot move a plan, and microsecond links on a shared
    // host jitter by more than the threshold.
    double stage_mean = 0;
    for (int s = 0; s < S; ++s) stage_mean += (now.f[size_t(s)] + now.b[size_t(s)] + now.w[size_t(s)]) / S;
    bool link_changed = false;
    std::vector<double> link_ratio(links.size(), 1.0);
    for (size_t k = 0; k < links.size(); ++k) {
      if (!(links[k] > 0)) continue;
      ChangeDetector& d = link_detectors_[k];
      const double before = d.reference();
      if (d.add(links[k]) && std::max(before, d.level()) >= kLinkFloor * stage_mean) {
        link_changed = true;
        link_ratio[k] = d.last_ratio();
      }
    }
    // The re-plan's message times: each link's median over the window
    // (pp::StageCosts::link), the slowest as the time of any other message.
    double comm = 0;
    std::vector<double> link_med(links.size(), 0.0);
    for (size_t k = 0; k < links.size(); ++k) {
      std::vector<double> x;
      for (const std::vector<double>& l : recent_links_) x.push_back(l[k]);
      link_med[k] = upper_median(std::move(x));
      comm = std::max(comm, link_med[k]);
    }
    nlohmann::json in;
    in["replan"] = changed ? "change" : link_changed ? "link change" : !warmed ? "" : planned_ ? "measured split" : "warm-up";
    if (changed || warmed || link_changed) {
      // What the plan will read per stage: the detectors' reference after
      // the rebase (apply).
      pending_level_.assign(size_t(S), 0.0);
      for (int s = 0; s < S; ++s) pending_level_[size_t(s)] = c.f[size_t(s)] + c.b[size_t(s)] + c.w[size_t(s)];
      in["f_s"] = c.f;
      in["b_s"] = c.b;
      in["w_s"] = c.w;
      in["comm_s"] = comm;
      in["link_s"] = link_med;
      if (jitter_samples_ > 0 && !c.jitter.empty()) in["jitter"] = c.jitter;
      in["stage_change"] = ratio;
      in["stage_flagged"] = flagged;
      in["link_change"] = link_ratio;
      in["measured_step_s"] = r.seconds;
    }
    return in;
  }

  nlohmann::json adapt_decision(const nlohmann::json& in) {
    nlohmann::json d;
    if (in.value("replan", "").empty()) return {{"quiet", true}};
    pp::StageCosts c;
    for (double f : in["f_s"]) c.f.push_back(std::max(f, 1e-9));
    for (double b : in["b_s"]) c.b.push_back(std::max(b, 1e-9));
    for (double w : in["w_s"]) c.w.push_back(std::max(w, 0.0));
    c.comm = std::max(0.0, in.value("comm_s", 0.0));
    if (in.contains("link_s"))
      for (double l : in["link_s"]) c.link.push_back(std::max(l, 0.0));
    // Each candidate's makespan: the mean over jitter_samples_ simulations
    // with the single instructions' measured spread drawn in (a schedule
    // that stalls the pipeline when one instruction runs late loses).
    if (in.contains("jitter"))
      for (double j : in["jitter"])
        if (j > 0) c.jitter.push_back(j);
    c.jitter_samples = jitter_samples_;
    if (!c.jitter.empty()) d["jitter_samples"] = jitter_samples_;
    const auto fits = [this](const pp::Schedule& s) { return memory_fits(cfg_, s, budget_); };
    const ScheduleChoice ch = choose_schedule(*current_, c, held_limit_, fits);
    d["why"] = in["replan"];
    d["schedule"] = ch.name;
    d["predicted_before_s"] = ch.current_predicted_s;
    d["predicted_after_s"] = ch.predicted_s;
    nlohmann::json cand = nlohmann::json::object();
    for (const auto& [n, t] : ch.candidates) cand[n] = t;
    d["candidates"] = cand;
    if (!ch.over_memory.empty()) {
      d["over_memory"] = ch.over_memory;  // refused: over the memory budget
      d["memory_budget_bytes"] = budget_;
    }
    d["switch"] = ch.predicted_s < ch.current_predicted_s;
    // schedule+layers: the layers re-balanced by the stages' measured speeds,
    // when that predicts a step at least 5% shorter than the best schedule on
    // the current split (a layout switch in memory; the schedule is re-planned
    // afterwards on the new split).
    if (counts_.size() == c.f.size() && counts_.size() > 1) {
      const StageCostModel cm = stage_cost_model(model_);
      const size_t S = counts_.size();
      std::vector<double> t(S), speed(S);
      const std::vector<double> unit(S, 1.0);
      const std::vector<double> cost = split_times(counts_, cm.layers, cm.embedding, cm.head, unit);
      for (size_t s = 0; s < S; ++s) {
        t[s] = c.f[s] + c.b[s] + c.w[s];
        speed[s] = cost[s] / t[s];
      }
      const std::vector<int64_t> next = speed_weighted_split(cm.layers, cm.embedding, cm.head, speed);
      if (next != counts_) {
        const std::vector<double> t2 = split_times(next, cm.layers, cm.embedding, cm.head, speed);
        pp::StageCosts c2 = c;
        for (size_t s = 0; s < S; ++s) {
          const double k = t2[s] / t[s];
          c2.f[s] *= k;
          c2.b[s] *= k;
          c2.w[s] *= k;
        }
        const ScheduleChoice ch2 = choose_schedule(*current_, c2, held_limit_, fits);
        d["layers_predicted_s"] = ch2.predicted_s;
        if (ch2.predicted_s < 0.95 * std::min(ch.predicted_s, ch.current_predicted_s)) {
          d["layers_before"] = counts_;
          d["layers"] = next;
          d["stage_speed"] = speed;
          std::string v;  // the trainer moves the layers (Controller: "layout_request")
          for (int64_t n : next) v += (v.empty() ? "" : ",") + std::to_string(n);
          d["layout_request"] = {"parallel.stage_layers=[" + v + "]"};
        }
      }
    }
    if (d["switch"]) {
      d["name"] = ch.schedule.name;
      d["detail"] = ch.schedule.detail;
      d["ranks"] = schedule_ranks_json(ch.schedule);
      char b[160];
      std::snprintf(b, sizeof b, " (predicted step %.4g s -> %.4g s)", ch.current_predicted_s,
                    ch.predicted_s);
      d["console"] = "pipeline schedule " + current_->name + " -> " + ch.schedule.name + b + " (" +
                     in["replan"].get<std::string>() + ")";
    }
    return d;
  }

  void adapt_apply(Engine& e, const nlohmann::json& d) {
    PipelineExecutor& pipe = *e.pipeline();
    current_ = &pipe.schedule();
    if (d.value("quiet", false)) return;
    planned_ = true;
    refine_ = false;
    // New work is measured from now on, against the level the plan used: a
    // change that began while it was made (half in its window's medians)
    // is flagged when the new medians confirm it, not taken as the new
    // reference and lost.
    for (size_t s = 0; s < detectors_.size(); ++s)
      detectors_[s].rebase(s < pending_level_.size() ? pending_level_[s] : 0.0);
    recent_.clear();
    // The links are not the schedule's work: their detectors keep their
    // reference (a re-plan does not change what a message takes).
    if (d.contains("layers")) return;  // the trainer moves the layers; a new adapter re-plans after
    if (!d.value("switch", false)) return;
    pp::Schedule s = schedule_from_json(pipe.schedule(), d.at("name").get<std::string>(),
                                        d.at("detail").get<std::string>(), d.at("ranks"));
    // A fused Backward's time was split half and half between B and W for
    // the plan; a schedule that splits them measures each, so it re-plans
    // once more when the detectors have warmed up again ("measured split").
    refine_ = has_op(pipe.schedule(), pp::Op::Backward) && has_op(s, pp::Op::BackwardInput);
    pipe.set_schedule(std::move(s));
    current_ = &pipe.schedule();
  }

  DetectorOptions opts_;
  ModelConfig model_;
  bool layers_ = false;
  int jitter_samples_ = 0;            // parallel.adapt_jitter_samples
  std::vector<int64_t> counts_;       // the stage split in use (schedule+layers, one chunk per rank)
  std::vector<ChangeDetector> detectors_;
  std::deque<pp::StageCosts> recent_;  // the last steps' measured stage times
  std::vector<double> pending_level_;  // per stage F + B + W of the inputs last sent to decide()
  std::vector<ChangeDetector> link_detectors_;       // per pipeline link (measured_link_times)
  std::deque<std::vector<double>> recent_links_;     // the last steps' link times
  bool planned_ = false;
  bool refine_ = false;  // re-plan at the next warm-up: the last plan guessed B and W
  std::int64_t held_limit_ = -1;  // activations a rank may hold (see observe)
  RunConfig cfg_;        // the engine's config at the first step (memory_fits)
  double budget_ = -1;   // memory_budget(): bytes a rank may hold; < 0 no limit
  const pp::Schedule* current_ = nullptr;
  RunConfig run_cfg_;          // the layout's config (the warm-up re-plan's generator input)
  bool adapt_ = true;          // parallel.adapt != off: the detectors and their re-plans
  bool list_warmup_ = false;   // greedy or zb-v: the warm-up re-plan after the second step
  pp::StageCosts last_measured_;  // this step's measured stage costs (adapt_inputs)
};

}  // namespace

std::unique_ptr<Controller> make_schedule_adapter(const RunConfig& cfg, DetectorOptions opts) {
  opts.threshold = cfg.parallel.adapt_threshold;  // one threshold for the adaptive layer
  return std::make_unique<ScheduleAdapter>(cfg, opts);
}

}  // namespace adgt::adapt
