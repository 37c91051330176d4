// The schedule re-plan (schedule_choice.hpp).
#include "parallel/adapt/schedule_choice.hpp"

#include <algorithm>
#include <stdexcept>

#include "parallel/cost/memory.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt::adapt {

namespace {
// `cfg` run with `s`: its generator (a split backward's buffers or not).
// On the vee placement (a zb-v run) every candidate keeps zb-v: the stage
// slices are the placement's, and zb-v's buffers are a split backward's (a
// fused greedy candidate holds no more).
RunConfig with_schedule(const RunConfig& cfg, const pp::Schedule& s) {
  RunConfig c = cfg;
  if (s.placement == StagePlacement::vee) {
    c.parallel.schedule = "zb-v";
    return c;
  }
  for (const char* n : {"1f1b", "zb-h1", "greedy", "interleaved", "gpipe"})
    if (s.name == n) c.parallel.schedule = n;
  return c;
}
}  // namespace

bool memory_fits(const RunConfig& cfg, const pp::Schedule& candidate, double budget_bytes) {
  if (budget_bytes < 0) return true;
  return double(estimate_memory(with_schedule(cfg, candidate), compute_bytes_per_element(cfg),
                                pp::held_activations(candidate))
                    .bytes_total) <= budget_bytes;
}

double memory_budget(const RunConfig& cfg, const pp::Schedule& planned, std::int64_t capacity_bytes) {
  if (capacity_bytes <= 0) return -1;
  const double plan = double(estimate_memory(with_schedule(cfg, planned), compute_bytes_per_element(cfg),
                                             pp::held_activations(planned))
                                 .bytes_total);
  return std::max(0.9 * double(capacity_bytes), plan);
}

ScheduleChoice choose_schedule(const pp::Schedule& current, const pp::StageCosts& c,
                               std::int64_t held_limit,
                               const std::function<bool(const pp::Schedule&)>& fits) {
  const int P = current.pp, m = current.microbatches, v = current.virtual_stages;
  if (held_limit < 0) held_limit = pp::max_held_activations(current);
  ScheduleChoice out;
  out.schedule = current;
  out.name = current.detail.empty() ? current.name : current.name + " (" + current.detail + ")";
  // Every makespan is the expected one under the measured jitter of single
  // instructions (c.jitter; without it the medians' simulation).
  out.current_predicted_s = pp::expected_makespan(current, c);
  out.predicted_s = out.current_predicted_s;
  out.candidates.emplace_back("current " + out.name, out.predicted_s);
  // The stages stay where the model holds them: on the vee placement (zb-v)
  // only the schedules that run there.
  const StagePlacement place = current.placement;
  std::vector<std::string> names = place == StagePlacement::vee ? std::vector<std::string>{"zb-v", "greedy"}
                                   : v > 1 ? std::vector<std::string>{"interleaved", "greedy"}
                                           : std::vector<std::string>{"1f1b", "zb-h1", "greedy"};
  for (const std::string& n : names) {
    try {
      pp::Schedule s =
          pp::with_grad_reductions(pp::make_schedule(n, P, m, v, c, P, held_limit, place));
      pp::validate(s);
      if (pp::max_held_activations(s) > held_limit) continue;  // more memory than planned
      const std::string label = s.detail.empty() ? n : n + " (" + s.detail + ")";
      if (fits && !fits(s)) {  // a rank over the memory budget
        out.over_memory.push_back(label);
        continue;
      }
      const double t = pp::expected_makespan(s, c);
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
