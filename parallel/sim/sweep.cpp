// The layout sweep (sweep.hpp).
#include "parallel/sim/sweep.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <cmath>
#include <numeric>

#include "core/layout.hpp"
#include "core/model/stage_map.hpp"
#include "parallel/cost/memory.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt::sim {
namespace {
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

bool has(const std::vector<std::string>& v, const char* k) {
  return std::find(v.begin(), v.end(), k) != v.end();
}

// The speed of pipeline rank p: its slowest device.
double stage_rank_speed(const RunConfig& cfg, const cluster::Cluster& cl, const SimOptions& sim,
                        int p) {
  const Layout lay = layout_of(cfg);
  double s = 1e300;
  for (int d = 0; d < int(lay.dp); ++d)
    for (int t = 0; t < int(lay.tp); ++t) {
      const int r = rank_of(lay, RankCoords{t, d, p, 0, 0});
      double v = cl.speed_of_node(cl.node_of(r));
      if (auto it = sim.slow_ranks.find(r); it != sim.slow_ranks.end()) v /= it->second;
      s = std::min(s, v);
    }
  return s;
}
}  // namespace

std::string describe_layout(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  std::string s = "tp=" + std::to_string(p.tp);
  if (p.cp > 1) s += " cp=" + std::to_string(p.cp) + (p.cp_mode == "all-to-all" ? " a2a" : "");
  s += " pp=" + std::to_string(p.pp) + " dp=" + std::to_string(p.dp);
  if (p.ep > 1) s += " ep=" + std::to_string(p.ep);
  s += " zero=" + std::to_string(p.dp * p.cp > 1 ? p.zero : 0) +
       " sp=" + std::to_string(p.tp > 1 && p.sequence_parallel ? 1 : 0);
  if (p.pp > 1) {
    s += " " + p.schedule + (p.virtual_stages > 1 ? " v=" + std::to_string(p.virtual_stages) : "");
    if (!p.stage_layers.empty()) {
      s += " layers=";
      for (size_t i = 0; i < p.stage_layers.size(); ++i)
        s += (i ? "/" : "") + std::to_string(p.stage_layers[i]);
    }
  }
  s += " mb=" + std::to_string(cfg.train.micro_batch) + " rc=" + cfg.train.recompute;
  return s;
}

std::vector<int64_t> speed_weighted_stages(const RunConfig& cfg, const cluster::Cluster& cl,
                                           const SimOptions& sim) {
  const int P = int(cfg.parallel.pp), V = int(cfg.parallel.virtual_stages);
  const int64_t L = cfg.model.n_layers, S = int64_t(P) * V;
  if (P < 2 || L < S) return {};
  std::vector<double> speed(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) speed[size_t(p)] = stage_rank_speed(cfg, cl, sim, p);
  if (*std::max_element(speed.begin(), speed.end()) ==
      *std::min_element(speed.begin(), speed.end()))
    return {};
  // Stage s sits on rank rank_of_stage (the run's placement); largest
  // remainders, at least one layer each.
  const StagePlacement place = placement_of_schedule(cfg.parallel.schedule);
  std::vector<double> w(static_cast<size_t>(S));
  double total = 0;
  for (int64_t s = 0; s < S; ++s) total += (w[size_t(s)] = speed[size_t(rank_of_stage(place, P, int(s)))]);
  std::vector<int64_t> n(size_t(S), 1);
  int64_t left = L - S;
  std::vector<double> want(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) want[size_t(s)] = double(L) * w[size_t(s)] / total - 1;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k = std::min<int64_t>(left, std::max<int64_t>(0, int64_t(std::floor(want[size_t(s)]))));
    n[size_t(s)] += k;
    left -= k;
  }
  std::vector<int64_t> order(static_cast<size_t>(S));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return want[size_t(a)] - std::floor(want[size_t(a)]) > want[size_t(b)] - std::floor(want[size_t(b)]);
  });
  for (size_t i = 0; left > 0; i = (i + 1) % order.size(), --left) ++n[size_t(order[i])];
  return n;
}

double step_lower_bound(const RunConfig& cfg, const cluster::Cluster& cl, OpCosts& costs,
                        const SimOptions& sim) {
  // Each pipeline rank's compute at its speed; and where ranks share cores
  // (a node's cores_per_node, or every rank on host_cores), a pool's work
  // over its cores (processor sharing runs at most `cores` ranks at once).
  const Layout lay = layout_of(cfg);
  const int64_t per_stage = lay.tp * lay.dp * lay.cp;
  double lb = 0, all_ranks = 0;
  std::vector<double> node_work(size_t(cl.nodes), 0);
  for (int p = 0; p < int(cfg.parallel.pp); ++p) {
    const double busy = rank_step_compute(cfg, p, costs, sim.work);
    lb = std::max(lb, busy / stage_rank_speed(cfg, cl, sim, p));
    all_ranks += busy * double(per_stage);
    if (cl.cores_per_node > 0)
      for (int d = 0; d < int(lay.dp * lay.cp); ++d)  // cp fastest
        for (int t = 0; t < int(lay.tp); ++t) {
          const int cp = int(lay.cp);
          const int64_t n = cl.node_of(rank_of(lay, RankCoords{t, d / cp, p, 0, 0, d % cp}));
          if (n < cl.nodes) node_work[size_t(n)] += busy;
        }
  }
  // A pool runs ranks at no more than their speed, so speeds above 1 could
  // only shorten it: divide by the fastest node's speed.
  double top_speed = 1;
  for (int64_t n = 0; n < cl.nodes; ++n) top_speed = std::max(top_speed, cl.speed_of_node(n));
  if (sim.host_cores > 0) lb = std::max(lb, all_ranks / double(sim.host_cores) / top_speed);
  else if (cl.cores_per_node > 0)  // each computing rank takes its threads' cores
    for (double w : node_work)
      lb = std::max(lb, w * double(cl.rank_threads()) / double(cl.cores_per_node) / top_speed);
  return lb;
}

namespace {

// The sweep's candidates: the layouts that pass the rules, the constraints
// and memory, each with its step time's lower bound; `out` counts the rejected.
struct Candidates {
  const cluster::Cluster& cl;
  OpCosts& costs;
  const SimOptions& sim;
  SweepResult& out;
  int bytes = 4;
  double budget = 0;
  std::vector<SweepRow> cand;
  using HeldKey = std::tuple<std::string, int64_t, int64_t, int64_t, std::vector<int64_t>>;
  std::map<HeldKey, std::vector<std::vector<int64_t>>> held_of;  // the schedules' held activations

  void consider(RunConfig c) {
    if (layout_error(c.model, c.train, layout_of(c))) {
      ++out.rejected_rules;
      return;
    }
    try {
      validate(c);
    } catch (const std::exception&) {
      ++out.rejected_rules;
      return;
    }
    // A lower bound first (1F1B's activations: every swept schedule holds
    // at least as many), then the schedule's own count.
    if (double(estimate_memory(c, bytes).bytes_total) > budget) {
      ++out.rejected_memory;
      return;
    }
    std::vector<std::vector<int64_t>> held;
    if (c.parallel.pp > 1) {
      // The schedule depends on the stage costs' ratios only (the micro-batch
      // scales every stage alike), so candidates that differ in tp, ZeRO,
      // SP or recompute share it; zb-v and greedy list-schedule at every m.
      const HeldKey k{c.parallel.schedule, c.parallel.pp, c.parallel.virtual_stages,
                      c.pipeline_microbatches(), c.parallel.stage_layers};
      auto it = held_of.find(k);
      if (it == held_of.end())
        it = held_of.emplace(k, pp::held_activations(make_pipeline_schedule(c))).first;
      held = it->second;
    }
    if (double(estimate_memory(c, bytes, held).bytes_total) > budget) {
      ++out.rejected_memory;
      return;
    }
    SweepRow row;
    row.lower_bound_s = step_lower_bound(c, cl, costs, sim);
    row.layout = describe_layout(c);
    row.cfg = std::move(c);
    cand.push_back(std::move(row));
  }
};

// The (pp, cp) pairs of `ranks` devices (a tp group each): pp up to the
// layers; cp held by the options, or 1 and, for long sequences, each cp
// leaving a rank kCpMinTokens tokens or more (the rules reject what seq_len
// does not divide).
std::vector<std::pair<int64_t, int64_t>> pp_and_cp(const RunConfig& base, int64_t ranks,
                                                   const SweepOptions& opts) {
  const bool held = has(opts.fixed, "parallel.cp");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t pp : divisors(ranks)) {
    if (pp > base.model.n_layers) continue;
    std::vector<int64_t> cps = {held ? base.parallel.cp : 1};
    if (!held && opts.context_parallel)
      for (int64_t c : divisors(ranks / pp))
        if (c > 1 && base.model.seq_len / c >= kCpMinTokens) cps.push_back(c);
    for (int64_t cp : cps)
      if ((ranks / pp) % cp == 0) out.emplace_back(pp, cp);
  }
  return out;
}

// Every layout of `gpus` devices the sweep tries (tp, pp, cp, dp, ep, micro-batch,
// ZeRO, SP, schedule, virtual stages, recompute; keys given with --set held),
// each given to cands.consider.
void enumerate_layouts(const RunConfig& base, int64_t gpus, const cluster::Cluster& cl,
                       const SweepOptions& opts, const SimOptions& sim, Candidates& cands) {
  const ModelConfig& m = base.model;
  const ParallelConfig& bp = base.parallel;
  const auto& fx = opts.fixed;
  const int64_t max_tp = opts.max_tp > 0 ? opts.max_tp : cl.devices_per_node;
  auto pick = [&](const char* key, auto value, auto base_value) {
    return !has(fx, key) || value == base_value;
  };
  // zb-v is not swept: at pp 2 it ties closely with zb-h1, so a re-plan on
  // noisy measurements could flip between the two (docs/planner.md).
  const std::vector<const char*> schedules = {"1f1b", "interleaved", "zb-h1"};
  for (int64_t tp : divisors(gpus)) {
    if (tp > max_tp || m.n_heads % tp || m.n_kv_heads % tp) continue;
    if (!pick("parallel.tp", tp, bp.tp)) { ++cands.out.rejected_fixed; continue; }
    for (const auto& [pp, cp] : pp_and_cp(base, gpus / tp, opts)) {
      if (!pick("parallel.pp", pp, bp.pp)) { ++cands.out.rejected_fixed; continue; }
      const int64_t dp = gpus / tp / pp / cp;
      if (!pick("parallel.dp", dp, bp.dp)) { ++cands.out.rejected_fixed; continue; }
      std::vector<int64_t> eps = {1};
      if (m.n_experts > 1)
        for (int64_t e : divisors(dp))
          if (e > 1 && m.n_experts % e == 0) eps.push_back(e);
      for (int64_t ep : eps) {
        if (!pick("parallel.ep", ep, bp.ep)) { ++cands.out.rejected_fixed; continue; }
        for (int64_t mb : {1, 2, 4, 8, 16}) {
          if (base.train.global_batch % (mb * dp)) continue;
          if (!pick("train.micro_batch", mb, base.train.micro_batch)) { ++cands.out.rejected_fixed; continue; }
          for (int64_t zero : {0, 1, 2, 3}) {
            if (zero && dp * cp == 1) continue;
            // ZeRO-2/3 run without gradient compression (docs/zero.md).
            if (zero >= 2 && base.parallel.grad_compression != "off") continue;
            if (!pick("parallel.zero", zero, dp * cp > 1 ? bp.zero : 0)) {
              ++cands.out.rejected_fixed;
              continue;
            }
            for (bool sp : {true, false}) {
              if (!sp && tp == 1) continue;  // tp = 1: sequence parallelism is moot
              if (tp > 1 && !pick("parallel.sequence_parallel", sp, bp.sequence_parallel)) {
                ++cands.out.rejected_fixed;
                continue;
              }
              for (const char* sched : schedules) {
                const std::string sc = sched;
                if (pp == 1 && sc != "1f1b") continue;
                if (pp > 1 && has(fx, "parallel.schedule") && sc != bp.schedule) {
                  ++cands.out.rejected_fixed;
                  continue;
                }
                std::vector<int64_t> vs = {1};
                if (sc == "interleaved") vs = {2, 4};
                if (has(fx, "parallel.virtual_stages")) vs = {bp.virtual_stages};
                for (int64_t v : vs) {
                  for (const char* rc : {"none", "selective", "full"}) {
                    if (!pick("train.recompute", std::string(rc), base.train.recompute)) {
                      ++cands.out.rejected_fixed;
                      continue;
                    }
                    RunConfig c = base;
                    ParallelConfig& p = c.parallel;
                    p.tp = tp;
                    p.pp = pp;
                    p.dp = dp;
                    p.cp = cp;
                    if (!has(fx, "parallel.cp_mode")) p.cp_mode = "ring";
                    p.ep = ep;
                    p.zero = zero;
                    p.sequence_parallel = tp > 1 && sp;
                    p.schedule = pp > 1 ? sc : (has(fx, "parallel.schedule") ? bp.schedule : "1f1b");
                    p.virtual_stages = v;
                    if (!has(fx, "parallel.microbatches")) p.microbatches = 0;
                    if (!has(fx, "parallel.stage_layers")) p.stage_layers.clear();
                    if (!has(fx, "parallel.expert_placement")) p.expert_placement.clear();
                    c.train.micro_batch = mb;
                    c.train.recompute = rc;
                    if (!has(fx, "train.recompute_layers")) c.train.recompute_layers = 0;
                    if (pp > 1 && !has(fx, "parallel.stage_layers")) {
                      const auto w = speed_weighted_stages(c, cl, sim);
                      if (!w.empty()) {
                        RunConfig cw = c;
                        cw.parallel.stage_layers = w;
                        cands.consider(std::move(cw));
                      }
                    }
                    cands.consider(std::move(c));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

SweepResult sweep_layouts(const RunConfig& base, int64_t gpus, const cluster::Cluster& cl,
                          OpCosts& costs, const SweepOptions& opts, const SimOptions& sim) {
  SweepResult out;
  if (opts.energy && !cl.device.power.on())
    throw ConfigError("the energy objective needs the cluster's power model: " + cl.name + "'s device " +
                      cl.device.name + " has no device.power (docs/power.md, docs/cluster.md)");
  Candidates cands{cl, costs, sim, out};
  cands.bytes = bf16_compute(base.train) ? 2 : base.train.dtype == "f64" ? 8 : 4;
  cands.budget = cl.device.memory_bytes * (1 - opts.headroom);
  enumerate_layouts(base, gpus, cl, opts, sim, cands);
  out.candidates = int64_t(cands.cand.size());
  std::stable_sort(cands.cand.begin(), cands.cand.end(), [](const SweepRow& a, const SweepRow& b) {
    return a.lower_bound_s < b.lower_bound_s;
  });
  std::vector<double> best;  // simulated step times, sorted
  for (SweepRow& row : cands.cand) {
    if (!opts.energy && opts.keep > 0 && best.size() >= opts.keep &&
        row.lower_bound_s > best[opts.keep - 1]) {
      ++out.bounded;
      continue;
    }
    row.result = simulate_step(row.cfg, cl, costs, sim);
    best.insert(std::upper_bound(best.begin(), best.end(), row.result.step_time_s),
                row.result.step_time_s);
    out.rows.push_back(std::move(row));
  }
  std::stable_sort(out.rows.begin(), out.rows.end(), [&](const SweepRow& a, const SweepRow& b) {
    return opts.energy ? a.result.energy_per_token_j < b.result.energy_per_token_j
                       : a.result.step_time_s < b.result.step_time_s;
  });
  if (opts.energy && !out.rows.empty() && out.rows.front().result.energy_j <= 0)
    throw ConfigError("the energy objective: " + costs.describe() +
                      " carries no energy (measured op costs); plan with the device model");
  if (opts.energy && opts.keep > 0 && out.rows.size() > opts.keep) out.rows.resize(opts.keep);
  return out;
}

}  // namespace adgt::sim
