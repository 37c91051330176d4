// The dynamic pipeline schedule controller (schedule_controller.hpp).
#include "parallel/adapt/schedule_controller.hpp"

#include <vector>

#include "kernels/check.hpp"
#include "parallel/adapt/schedule_choice.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/schedule/validate.hpp"

namespace adgt::adapt {
namespace {

class ScheduleAdapter final : public Controller {
 public:
  ScheduleAdapter(const RunConfig&, DetectorOptions o) : opts_(o) {}
  std::string name() const override { return "adapt-schedule"; }
  bool due(const StepReport& r) const override { return r.step > r.first_step; }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    current_ = &e.pipeline()->schedule();  // decide() re-plans from it (rank 0)
    const pp::StageCosts c = measured_stage_costs(e, world);
    const int S = c.stages();
    if (detectors_.empty()) detectors_.assign(size_t(S), ChangeDetector(opts_));
    // Every rank feeds the same agreed samples: the same flags everywhere.
    bool warmed = false, changed = false;
    std::vector<double> ratio(size_t(S), 1.0);
    for (int s = 0; s < S; ++s) {
      ChangeDetector& d = detectors_[size_t(s)];
      const bool was_ready = d.ready();
      if (d.add(c.f[size_t(s)] + c.b[size_t(s)] + c.w[size_t(s)])) {
        changed = true;
        ratio[size_t(s)] = d.last_ratio();
      }
      warmed |= !was_ready && d.ready() && !planned_;
    }
    nlohmann::json in;
    in["replan"] = changed ? "change" : warmed ? "warm-up" : "";
    if (changed || warmed) {
      in["f_s"] = c.f;
      in["b_s"] = c.b;
      in["w_s"] = c.w;
      in["stage_change"] = ratio;
      in["measured_step_s"] = r.seconds;
    }
    return in;
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    nlohmann::json d;
    if (in.value("replan", "").empty()) return {{"quiet", true}};
    pp::StageCosts c;
    for (double f : in["f_s"]) c.f.push_back(std::max(f, 1e-9));
    for (double b : in["b_s"]) c.b.push_back(std::max(b, 1e-9));
    for (double w : in["w_s"]) c.w.push_back(std::max(w, 0.0));
    const ScheduleChoice ch = choose_schedule(*current_, c);
    d["why"] = in["replan"];
    d["schedule"] = ch.name;
    d["predicted_before_s"] = ch.current_predicted_s;
    d["predicted_after_s"] = ch.predicted_s;
    nlohmann::json cand = nlohmann::json::object();
    for (const auto& [n, t] : ch.candidates) cand[n] = t;
    d["candidates"] = cand;
    d["switch"] = ch.predicted_s < ch.current_predicted_s;
    if (d["switch"]) {
      d["name"] = ch.schedule.name;
      d["detail"] = ch.schedule.detail;
      d["ranks"] = schedule_ranks_json(ch.schedule);
    }
    return d;
  }

  void apply(Engine& e, const nlohmann::json& d) override {
    PipelineExecutor& pipe = *e.pipeline();
    current_ = &pipe.schedule();
    if (d.value("quiet", false)) return;
    planned_ = true;
    for (ChangeDetector& det : detectors_) det.rebase();  // new work is measured from now on
    if (!d.value("switch", false)) return;
    pp::Schedule s = schedule_from_json(pipe.schedule(), d.at("name").get<std::string>(),
                                        d.at("detail").get<std::string>(), d.at("ranks"));
    pipe.set_schedule(std::move(s));
    current_ = &pipe.schedule();
  }

 private:
  DetectorOptions opts_;
  std::vector<ChangeDetector> detectors_;
  bool planned_ = false;
  const pp::Schedule* current_ = nullptr;
};

}  // namespace

std::unique_ptr<Controller> make_schedule_adapter(const RunConfig& cfg, DetectorOptions opts) {
  return std::make_unique<ScheduleAdapter>(cfg, opts);
}

}  // namespace adgt::adapt
