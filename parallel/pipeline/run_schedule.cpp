#include "parallel/pipeline/run_schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/layout.hpp"
#include "core/model/stage_map.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/print.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt {

pp::StageCosts predicted_stage_costs(const RunConfig& cfg) {
  const std::vector<int64_t> counts = stage_layer_counts(cfg);
  const double tokens = double(cfg.train.micro_batch * cfg.model.seq_len);
  auto gflop = [&](double per_token) { return per_token * tokens / 1e9; };
  pp::StageCosts c;
  const int S = int(counts.size());
  int64_t first = 0;  // the stage's first layer
  for (int s = 0; s < S; first += counts[size_t(s)], ++s) {
    const PassFlops p =
        stage_pass_flops(cfg.model, first, first + counts[size_t(s)], s == 0, s == S - 1);
    c.f.push_back(gflop(p.forward));
    c.b.push_back(gflop(p.backward_input));
    c.w.push_back(gflop(p.backward_weight));
  }
  return c;
}

pp::Schedule make_pipeline_schedule(const RunConfig& cfg, const pp::StageCosts* costs) {
  const int pp = int(cfg.parallel.pp), v = int(cfg.parallel.virtual_stages);
  const int m = int(cfg.pipeline_microbatches());
  const pp::StageCosts predicted = costs ? pp::StageCosts{} : predicted_stage_costs(cfg);
  pp::Schedule s = pp::make_schedule(cfg.parallel.schedule, pp, m, v, costs ? *costs : predicted, pp,
                                     std::numeric_limits<std::int64_t>::max(),
                                     placement_of_schedule(cfg.parallel.schedule));
  pp::validate(s);
  return s;
}

std::string describe_pipeline_schedule(const RunConfig& cfg) {
  std::ostringstream o;
  const std::vector<int64_t> counts = stage_layer_counts(cfg);
  o << "pipeline: pp=" << cfg.parallel.pp << ", schedule " << cfg.parallel.schedule
    << ", micro-batches " << cfg.pipeline_microbatches() << ", virtual stages "
    << cfg.parallel.virtual_stages << "\n";
  const int pp = int(cfg.parallel.pp);
  const StagePlacement place = placement_of_schedule(cfg.parallel.schedule);
  if (place != StagePlacement::looped) o << "  stage placement: " << stage_placement_name(place) << "\n";
  for (size_t s = 0, first = 0; s < counts.size(); first += size_t(counts[s]), ++s) {
    o << "  stage " << s << " (pipeline rank " << rank_of_stage(place, pp, int(s)) << ", chunk "
      << chunk_of_stage(place, pp, int(s)) << "): layers "
      << first << ".." << first + size_t(counts[s]) - 1;
    if (s == 0) o << " + embedding";
    if (s + 1 == counts.size()) o << " + final norm, lm_head, loss";
    o << "\n";
  }
  // Pipeline rank p is every world rank with that pp coordinate (world rank =
  // layout rank: core/layout.hpp's rank_of); the timeline's rows are pipeline ranks.
  const Layout l = layout_of(cfg);
  if (l.tp * l.dp > 1) {
    for (int p = 0; p < pp; ++p) {
      o << "  pipeline rank " << p << " = world ranks";
      const char* sep = " ";
      for (int d = 0; d < int(l.dp); ++d)
        for (int t = 0; t < int(l.tp); ++t) {
          RankCoords c;
          c.tp = t, c.dp = d, c.pp = p;
          o << sep << rank_of(l, c);
          sep = ",";
        }
      o << " (tp=" << l.tp << " x dp=" << l.dp << ")\n";
    }
  }
  const pp::StageCosts costs = predicted_stage_costs(cfg);
  const pp::Schedule sched = make_pipeline_schedule(cfg, &costs);
  const pp::Timeline sim = pp::time_schedule(sched, costs);
  if (!sched.detail.empty()) o << "  " << sched.detail << "\n";
  o << "times from the FLOP cost model (F = B = W per stage, GFLOP per micro-batch); rows are "
       "pipeline ranks:\n";
  o << pp::timeline(sched, sim);
  const std::vector<int64_t> peak = pp::peak_inflight(sched);
  o << "peak micro-batches in flight per pipeline rank (forward to input backward):";
  for (int64_t p : peak) o << " " << p;
  o << "\nactivations held per pipeline rank (forward to the last backward, all chunks):";
  for (const auto& r : pp::held_activations(sched)) {
    int64_t n = 0;
    for (int64_t h : r) n += h;
    o << " " << n;
  }
  o << "\n";
  return o.str();
}

pp::Schedule engine_schedule(const RunConfig& cfg, const pp::StageCosts* costs) {
  return pp::with_grad_reductions(make_pipeline_schedule(cfg, costs));
}

}  // namespace adgt
