// The layout sweep (sweep.hpp).
#include "parallel/sim/sweep.hpp"

#include <algorithm>

#include "core/layout.hpp"
#include "parallel/cost/memory.hpp"
#include "parallel/pipeline_plan.hpp"

namespace adgt::sim {
namespace {
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}
}  // namespace

std::string describe_layout(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  std::string s = "tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp) +
                  " dp=" + std::to_string(p.dp);
  if (p.ep > 1) s += " ep=" + std::to_string(p.ep);
  s += " zero=" + std::to_string(p.dp > 1 ? p.zero : 0) +
       " sp=" + std::to_string(p.tp > 1 && p.sequence_parallel ? 1 : 0);
  if (p.pp > 1) s += " " + p.schedule + (p.virtual_stages > 1 ? " v=" + std::to_string(p.virtual_stages) : "");
  s += " mb=" + std::to_string(cfg.train.micro_batch) + " rc=" + cfg.train.recompute;
  return s;
}

SweepResult sweep_layouts(const RunConfig& base, int64_t gpus, const cluster::Cluster& cl,
                          OpCosts& costs, const SweepOptions& opts, const SimOptions& sim) {
  SweepResult out;
  const ModelConfig& m = base.model;
  const int64_t max_tp = opts.max_tp > 0 ? opts.max_tp : cl.devices_per_node;
  const int bytes = base.train.dtype == "bf16" ? 2 : base.train.dtype == "f64" ? 8 : 4;
  for (int64_t tp : divisors(gpus)) {
    if (tp > max_tp || m.n_heads % tp || m.n_kv_heads % tp) continue;
    for (int64_t pp : divisors(gpus / tp)) {
      if (pp > m.n_layers) continue;
      const int64_t dp = gpus / tp / pp;
      for (int64_t mb : {1, 2, 4, 8, 16}) {
        if (base.train.global_batch % (mb * dp)) continue;
        for (int64_t zero : {0, 1}) {
          if (zero && dp == 1) continue;
          for (const char* sched : {"1f1b", "interleaved", "zb-h1"}) {
            if (pp == 1 && std::string(sched) != "1f1b") continue;
            for (const char* rc : {"none", "selective", "full"}) {
              RunConfig c = base;
              c.parallel.tp = tp;
              c.parallel.pp = pp;
              c.parallel.dp = dp;
              c.parallel.ep = 1;
              c.parallel.zero = zero;
              c.parallel.sequence_parallel = tp > 1;
              c.parallel.schedule = sched;
              c.parallel.virtual_stages = std::string(sched) == "interleaved" ? 2 : 1;
              c.parallel.microbatches = 0;
              c.parallel.stage_layers.clear();
              c.parallel.expert_placement.clear();
              c.train.micro_batch = mb;
              c.train.recompute = rc;
              c.train.recompute_layers = 0;
              if (layout_error(c.model, c.train, layout_of(c))) {
                ++out.rejected_rules;
                continue;
              }
              try {
                validate(c);
              } catch (const std::exception&) {
                ++out.rejected_rules;
                continue;
              }
              // A lower bound first (1F1B's activations: every swept schedule
              // holds at least as many), then the schedule's own count.
              if (double(estimate_memory(c, bytes).bytes_total) >
                  cl.device.memory_bytes * (1 - opts.headroom)) {
                ++out.rejected_memory;
                continue;
              }
              std::vector<std::vector<int64_t>> held;
              if (pp > 1) held = held_microbatches(make_pipeline_schedule(c));
              const double mem = double(estimate_memory(c, bytes, held).bytes_total);
              if (mem > cl.device.memory_bytes * (1 - opts.headroom)) {
                ++out.rejected_memory;
                continue;
              }
              SweepRow row{c, simulate_step(c, cl, costs, sim), describe_layout(c)};
              out.rows.push_back(std::move(row));
            }
          }
        }
      }
    }
  }
  std::sort(out.rows.begin(), out.rows.end(), [](const SweepRow& a, const SweepRow& b) {
    return a.result.step_time_s < b.result.step_time_s;
  });
  return out;
}

}  // namespace adgt::sim
