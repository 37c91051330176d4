#include "parallel/metrics/tei.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "parallel/cost/flops.hpp"
#include "parallel/cost/stages.hpp"

namespace adgt {

namespace {
// Where run r's surviving work ends: its last snapshot (no later run), else its
// latest checkpoint snapshot at a step <= cutoff, else the end of its start-up.
TeiCounters kept_counters(const TeiRun& r, int64_t cutoff) {
  const TeiCounters& last = r.snapshots.back().c;
  if (cutoff == std::numeric_limits<int64_t>::max()) return last;
  const TeiSnapshot* best = nullptr;
  for (const TeiSnapshot& s : r.snapshots)
    if (s.checkpoint && s.step <= cutoff && (!best || s.step >= best->step)) best = &s;
  if (best) return best->c;
  TeiCounters k;
  k.wall_s = k.startup_s = last.startup_s;
  return k;
}
}  // namespace

TeiBreakdown tei_account(const std::vector<TeiRun>& runs) {
  TeiBreakdown b;
  const size_t n = runs.size();
  b.runs = int(n);
  // cutoff[k] = min over later runs j of resumed_from_j.
  std::vector<int64_t> cutoff(n, std::numeric_limits<int64_t>::max());
  for (size_t k = n; k-- > 1;) cutoff[k - 1] = std::min(cutoff[k], runs[k].resumed_from);
  // Every category in FLOPs at peak (peak x device-seconds), so runs with
  // different peaks or device counts add up; divided by the capacity at the end.
  double useful = 0, below = 0, rc = 0, comm = 0, bubble = 0, opt = 0, ckpt = 0, eval = 0,
         startup = 0, lost = 0, other = 0;
  bool any = false, peaks_known = true;
  const TeiRun* prev = nullptr;
  for (size_t k = 0; k < n; ++k) {
    const TeiRun& r = runs[k];
    // The time between the previous run's last record and this run's start.
    if (prev && r.start_unix > 0 && prev->start_unix > 0) {
      const double prev_wall = prev->snapshots.empty()
                                   ? 0.0
                                   : prev->snapshots.back().c.wall_s / double(std::max(1, prev->devices));
      b.gap_s += std::max(0.0, r.start_unix - (prev->start_unix + prev_wall));
    }
    prev = &r;
    if (r.snapshots.empty()) continue;  // it died before its first record: nothing known
    if (r.peak_flops <= 0) {
      peaks_known = false;
      continue;
    }
    any = true;
    const TeiCounters& last = r.snapshots.back().c;
    const TeiCounters kept = kept_counters(r, cutoff[k]);
    const double P = r.peak_flops;
    const double compute = kept.step_s - kept.comm_s - kept.bubble_s - kept.optimizer_s;
    const double useful_s = kept.model_flops / P;
    const double flops = kept.model_flops + kept.recompute_flops;
    const double rc_s = flops > 0 ? compute * kept.recompute_flops / flops : 0.0;
    useful += P * useful_s;
    rc += P * rc_s;
    below += P * (compute - rc_s - useful_s);
    comm += P * kept.comm_s;
    bubble += P * kept.bubble_s;
    opt += P * kept.optimizer_s;
    ckpt += P * kept.checkpoint_s;
    eval += P * kept.eval_s;
    startup += P * kept.startup_s;
    lost += P * ((last.wall_s - kept.wall_s) + kept.skipped_s);
    other += P * (kept.wall_s - (kept.startup_s + kept.step_s + kept.checkpoint_s + kept.eval_s +
                                 kept.skipped_s));
    b.capacity_flops += P * last.wall_s;
    b.device_s += last.wall_s;
    b.wall_s += last.wall_s / double(std::max(1, r.devices));
    b.counted_flops += kept.model_flops;
    b.counted_steps += kept.steps - kept.skipped_steps;
    b.lost_steps += (last.steps - kept.steps) + kept.skipped_steps;
  }
  b.valid = any && peaks_known && b.capacity_flops > 0;
  if (!b.valid) return b;
  const double C = b.capacity_flops;
  b.useful = useful / C;
  b.tei = b.useful;
  b.below_peak = below / C;
  b.recompute = rc / C;
  b.comm = comm / C;
  b.bubble = bubble / C;
  b.optimizer = opt / C;
  b.checkpoint = ckpt / C;
  b.eval = eval / C;
  b.startup = startup / C;
  b.lost = lost / C;
  b.other = other / C;
  return b;
}

double recompute_flops_per_token(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const std::string& rc = cfg.train.recompute;
  double f = 0;
  if (rc == "selective") {
    for (int64_t l = 0; l < m.n_layers; ++l) f += attention_core_flops(m, AttentionCount::Full);
  } else if (rc == "full") {
    const std::vector<int64_t> counts = stage_layer_counts(cfg);
    int64_t first = 0;
    for (int64_t c : counts) {
      const int64_t k = cfg.train.recompute_layers > 0 ? std::min(cfg.train.recompute_layers, c) : c;
      for (int64_t l = first; l < first + k; ++l) {
        const LayerFlops lf = layer_forward_flops(m, l, AttentionCount::Full);
        f += lf.total() - (m.is_moe_layer(l) ? lf.ffn : 0.0);
      }
      first += c;
    }
  }
  return f;
}

std::string format_tei(const TeiBreakdown& b) {
  if (!b.valid) return "";
  char buf[640];
  std::string s;
  std::snprintf(buf, sizeof buf,
                "TEI:              %.2f%% (goodput MFU over %d run%s: %.1f s wall-clock, %.1f "
                "device-s; docs/tei.md)\n",
                100.0 * b.tei, b.runs, b.runs == 1 ? "" : "s", b.wall_s, b.device_s);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "  steps:          %ld counted, %ld lost (redone after a resume, or skipped)\n",
                long(b.counted_steps), long(b.lost_steps));
  s += buf;
  if (b.runs > 1) {
    std::snprintf(buf, sizeof buf, "  restart gaps:   %.1f s between runs (not in TEI)\n", b.gap_s);
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "  breakdown:      useful %.1f%% | compute below peak %.1f%% | recompute %.1f%% "
                "(estimated) | exposed comm %.1f%% | bubble %.1f%% | optimizer %.1f%%\n"
                "                  checkpoint saves %.1f%% | eval %.1f%% | start-up %.1f%% | lost "
                "%.1f%% | other %.1f%% (sum %.1f%%)\n",
                100 * b.useful, 100 * b.below_peak, 100 * b.recompute, 100 * b.comm, 100 * b.bubble,
                100 * b.optimizer, 100 * b.checkpoint, 100 * b.eval, 100 * b.startup, 100 * b.lost,
                100 * b.other, 100 * b.sum());
  s += buf;
  return s;
}

}  // namespace adgt
