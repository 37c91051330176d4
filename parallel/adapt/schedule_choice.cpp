// The schedule re-plan (schedule_choice.hpp).
#include "parallel/adapt/schedule_choice.hpp"

#include <stdexcept>

#include "parallel/schedule/generators.hpp"
#include "parallel/schedule/simulate.hpp"
#include "parallel/schedule/validate.hpp"

namespace adgt::adapt {

ScheduleChoice choose_schedule(const pp::Schedule& current, const pp::StageCosts& c,
                               std::int64_t held_limit) {
  const int P = current.pp, m = current.microbatches, v = current.virtual_stages;
  if (held_limit < 0) held_limit = pp::max_held_activations(current);
  ScheduleChoice out;
  out.schedule = current;
  out.name = current.detail.empty() ? current.name : current.name + " (" + current.detail + ")";
  out.current_predicted_s = pp::simulate(current, c).makespan;
  out.predicted_s = out.current_predicted_s;
  out.candidates.emplace_back("current " + out.name, out.predicted_s);
  std::vector<std::string> names = v > 1 ? std::vector<std::string>{"interleaved", "greedy"}
                                         : std::vector<std::string>{"1f1b", "zb-h1", "greedy"};
  for (const std::string& n : names) {
    try {
      pp::Schedule s = pp::with_grad_reductions(pp::make_schedule(n, P, m, v, c, P, held_limit));
      pp::validate(s);
      if (pp::max_held_activations(s) > held_limit) continue;  // more memory than planned
      const double t = pp::simulate(s, c).makespan;
      const std::string label = s.detail.empty() ? n : n + " (" + s.detail + ")";
      out.candidates.emplace_back(label, t);
      // A strictly shorter makespan replaces the current one (ties keep it).
      if (t < out.predicted_s * (1 - 1e-9)) {
        out.predicted_s = t;
        out.schedule = std::move(s);
        out.name = label;
      }
    } catch (const std::exception&) {
      // This generator does not fit the pipeline (m < pp, ...): not a candidate.
    }
  }
  return out;
}

}  // namespace adgt::adapt
