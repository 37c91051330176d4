// The planner (planner.hpp).
#include "parallel/plan/planner.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/layout.hpp"
#include "parallel/cost/memory.hpp"
#include "parallel/cp/support.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/pipeline/validate.hpp"
#include "parallel/sim/dry_run.hpp"

namespace adgt::plan {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string value_of(const RunConfig& c, const std::string& key) {
  const ParallelConfig& p = c.parallel;
  if (key == "parallel.tp") return std::to_string(p.tp);
  if (key == "parallel.pp") return std::to_string(p.pp);
  if (key == "parallel.dp") return std::to_string(p.dp);
  if (key == "parallel.ep") return std::to_string(p.ep);
  if (key == "parallel.cp") return std::to_string(p.cp);
  if (key == "parallel.cp_mode") return p.cp_mode;
  if (key == "parallel.zero") return std::to_string(p.zero);
  if (key == "parallel.sequence_parallel") return p.sequence_parallel ? "true" : "false";
  if (key == "parallel.schedule") return p.schedule;
  if (key == "parallel.virtual_stages") return std::to_string(p.virtual_stages);
  if (key == "parallel.stage_layers") return list(p.stage_layers);
  if (key == "parallel.microbatches") return std::to_string(p.microbatches);
  if (key == "parallel.expert_placement") return list(p.expert_placement);
  if (key == "train.micro_batch") return std::to_string(c.train.micro_batch);
  if (key == "train.recompute") return c.train.recompute;
  if (key == "train.recompute_layers") return std::to_string(c.train.recompute_layers);
  return "";
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * x);
  return b;
}

PlanRow row_of(sim::SweepRow&& r, const cluster::Cluster& cl) {
  PlanRow p{std::move(r.cfg), r.result, std::move(r.layout), ""};
  p.limit = plan_limit(p.result, cl);
  return p;
}

}  // namespace


std::string plan_limit(const sim::SimResult& r, const cluster::Cluster& cl) {
  const double T = r.step_time_s > 0 ? r.step_time_s : 1;
  std::vector<std::pair<double, std::string>> parts = {
      {r.bubble * T, "bubble"},          {r.exposed_tp_s, "tp comm"},
      {r.exposed_pp_s, "pp comm"},       {r.exposed_dp_s, "dp comm"},
      {r.exposed_ep_s, "ep comm"},       {r.exposed_cp_s, "cp comm"},
      {r.exposed_step_s, "step comm"},
      {r.optimizer_s, "optimizer"}};
  const auto top = *std::max_element(parts.begin(), parts.end());
  std::string s = top.first / T >= 0.05 ? top.second + " " + pct(top.first / T) : "compute";
  if (cl.device.memory_bytes > 0 && r.memory_bytes_max > 0.9 * cl.device.memory_bytes)
    s += ", mem " + pct(r.memory_bytes_max / cl.device.memory_bytes);
  return s;
}

std::vector<std::string> plan_overrides(const RunConfig& c) {
  std::vector<std::string> o;
  for (const std::string& k : layout_keys()) o.push_back(k + "=" + value_of(c, k));
  return o;
}

Plan make_plan(const PlanInput& in, sim::OpCosts& costs) {
  const auto t0 = std::chrono::steady_clock::now();
  Plan plan;
  plan.world = in.world;
  for (const std::string& k : in.fixed)
    if (std::find(layout_keys().begin(), layout_keys().end(), k) != layout_keys().end()) {
      plan.fixed.push_back(k);
      plan.fixed_values.push_back(value_of(in.base, k));
    }
  sim::SweepOptions so;
  so.headroom = in.headroom;
  so.fixed = plan.fixed;
  so.keep = std::max<size_t>(in.top, 1);
  so.max_tp = in.max_tp;
  so.energy = in.base.parallel.auto_objective == "energy";
  // Context parallelism where this run could train it: on host ranks (CPU or
  // the emulated device) and without what cp does not run yet
  // (parallel/cp/support.hpp). CUDA runs cp when a run file asks for it, but
  // the planner does not choose it there until it has run on a GPU
  // (docs/context-parallel.md, "What remains").
  RunConfig c2 = in.base;
  c2.parallel.cp = 2;
  const std::string& dev = in.base.train.device;
  const bool host = dev == "cpu" || dev == "emulated" || (dev == "auto" && in.cluster.cpu_ranks());
  so.context_parallel = host && context_parallel_unsupported(c2).empty();
  sim::SweepResult sw = sim::sweep_layouts(in.base, in.world, in.cluster, costs, so, in.sim);
  plan.candidates = sw.candidates;
  plan.simulated = int64_t(sw.rows.size());
  plan.bounded = sw.bounded;
  plan.rejected_rules = sw.rejected_rules;
  plan.rejected_memory = sw.rejected_memory;
  plan.rejected_fixed = sw.rejected_fixed;
  plan.costs = costs.describe();
  if (sw.rows.empty()) {
    std::ostringstream os;
    os << "parallel.auto: no plan for " << in.world << " ranks of " << in.cluster.name;
    if (plan.fixed.empty()) {
      os << " fits: " << sw.rejected_memory << " layouts need more than "
         << int((1 - in.headroom) * 100) << "% of the device's "
         << in.cluster.device.memory_bytes / 1073741824.0 << " GiB and " << sw.rejected_rules
         << " break a layout rule; use more devices, a smaller model or a shorter sequence";
      throw ConfigError(os.str());
    }
    os << " keeps";
    for (const std::string& k : plan.fixed) os << " " << k << "=" << value_of(in.base, k);
    os << " (set in " << (in.base.source.empty() ? "the run file" : in.base.source)
       << " or by --set)";
    // The nearest plans without the constraints: fewest changed keys, then fastest.
    so.fixed.clear();
    so.keep = 50;
    sim::SweepResult free = sim::sweep_layouts(in.base, in.world, in.cluster, costs, so, in.sim);
    if (free.rows.empty()) {
      os << "; nothing fits even without them: use more devices or a smaller model";
      throw ConfigError(os.str());
    }
    std::vector<std::pair<int, size_t>> near;
    for (size_t i = 0; i < free.rows.size(); ++i) {
      int changed = 0;
      for (const std::string& k : plan.fixed)
        changed += value_of(free.rows[i].cfg, k) != value_of(in.base, k);
      near.emplace_back(changed, i);
    }
    std::stable_sort(near.begin(), near.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    os << "; nearest feasible plans:";
    for (size_t j = 0; j < near.size() && j < 3; ++j) {
      const sim::SweepRow& r = free.rows[near[j].second];
      os << "\n  " << r.layout << " (" << r.result.step_time_s << " s; changes";
      for (const std::string& k : plan.fixed)
        if (value_of(r.cfg, k) != value_of(in.base, k))
          os << " " << k << " to " << value_of(r.cfg, k);
      os << ")";
    }
    throw ConfigError(os.str());
  }
  for (sim::SweepRow& r : sw.rows) plan.rows.push_back(row_of(std::move(r), in.cluster));
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

std::string format_plan(const Plan& p, const cluster::Cluster& cl) {
  std::ostringstream os;
  char b[512];
  std::snprintf(b, sizeof b, "plan: %ld ranks on %s (%ld x %ld %s), costs: %s\n", long(p.world),
                cl.name.c_str(), long(cl.nodes), long(cl.devices_per_node),
                cl.device.name.c_str(), p.costs.c_str());
  os << b;
  if (!p.rows.empty()) os << "  precision: " << sim::precision_line(p.chosen().cfg, cl) << "\n";
  os << "  constraints: ";
  if (p.fixed.empty()) os << "none";
  for (size_t i = 0; i < p.fixed.size(); ++i)
    os << (i ? ", " : "") << p.fixed[i] << "=" << p.fixed_values[i];
  os << "\n";
  std::snprintf(b, sizeof b, "  %-3s %-62s %10s %11s %6s %9s  %s\n", "#", "layout", "step s",
                "tokens/s", "MFU", "mem GiB", "limited by");
  os << b;
  for (size_t i = 0; i < p.rows.size() && i < 10; ++i) {
    const auto& r = p.rows[i];
    std::snprintf(b, sizeof b, "  %-3zu %-62s %10.4g %11.4g %5.1f%% %9.3g  %s%s\n", i + 1,
                  r.layout.c_str(), r.result.step_time_s, r.result.tokens_per_s,
                  100 * r.result.mfu, r.result.memory_bytes_max / 1073741824.0, r.limit.c_str(),
                  i == 0 ? "  <- chosen" : "");
    os << b;
  }
  std::snprintf(b, sizeof b,
                "  %ld layouts fit (%ld simulated, %ld bounded out by a lower bound of their "
                "step time); %ld broke a layout rule, %ld did not fit %.3g GiB, %ld differ from "
                "a constraint; planned in %.3f s\n",
                long(p.candidates), long(p.simulated), long(p.bounded), long(p.rejected_rules),
                long(p.rejected_memory), cl.device.memory_bytes / 1073741824.0,
                long(p.rejected_fixed), p.seconds);
  os << b;
  return os.str();
}

std::optional<PlanRow> megatron_default(const PlanInput& in, sim::OpCosts& costs) {
  const ModelConfig& m = in.base.model;
  int64_t tp = std::min<int64_t>(in.cluster.devices_per_node, in.world);
  while (tp > 1 && (m.n_heads % tp || m.n_kv_heads % tp || in.world % tp)) --tp;
  const int bytes = compute_bytes_per_element(in.base);
  const double budget = in.cluster.device.memory_bytes * (1 - in.headroom);
  for (int64_t pp = 1; pp <= in.world / tp; ++pp) {
    if ((in.world / tp) % pp || pp > m.n_layers) continue;
    for (const char* rc : {"none", "selective", "full"}) {
      RunConfig c = in.base;
      ParallelConfig& p = c.parallel;
      p.tp = tp;
      p.pp = pp;
      p.dp = in.world / tp / pp;
      p.ep = 1;
      p.zero = 0;
      p.sequence_parallel = tp > 1;
      p.schedule = "1f1b";
      p.virtual_stages = 1;
      p.microbatches = 0;
      p.stage_layers.clear();
      p.expert_placement.clear();
      c.train.micro_batch = 1;
      c.train.recompute = rc;
      c.train.recompute_layers = 0;
      if (c.train.global_batch % p.dp) continue;
      if (layout_error(c.model, c.train, layout_of(c))) continue;
      try {
        validate(c);
      } catch (const std::exception&) {
        continue;
      }
      std::vector<std::vector<int64_t>> held;
      if (pp > 1) held = pp::held_activations(make_pipeline_schedule(c));
      if (double(estimate_memory(c, bytes, held).bytes_total) > budget) continue;
      sim::SweepRow r{c, sim::simulate_step(c, in.cluster, costs, in.sim), sim::describe_layout(c)};
      return row_of(std::move(r), in.cluster);
    }
  }
  return std::nullopt;
}

std::string plan_json(const Plan& p, const cluster::Cluster& cl) {
  nlohmann::json j;
  const PlanRow& c = p.chosen();
  j["layout"] = c.layout;
  nlohmann::json keys;
  for (const std::string& k : layout_keys()) keys[k] = value_of(c.cfg, k);
  j["keys"] = keys;
  j["predicted_step_s"] = c.result.step_time_s;
  j["predicted_tokens_per_s"] = c.result.tokens_per_s;
  j["predicted_mfu"] = c.result.mfu;
  j["predicted_memory_gib"] = c.result.memory_bytes_max / 1073741824.0;
  j["limited_by"] = c.limit;
  j["constraints"] = p.fixed;
  j["cluster"] = cl.name;
  j["world"] = p.world;
  j["candidates"] = p.candidates;
  j["simulated"] = p.simulated;
  j["plan_seconds"] = p.seconds;
  j["costs"] = p.costs;
  return j.dump();
}

}  // namespace adgt::plan
