// Per-stage compute times and the point-to-point latency: what the simulator
// (timeline.hpp) and the greedy generator (generators.hpp) plan with.
#pragma once

#include <string>
#include <vector>

namespace adgt::pp {

// Times for one micro-batch, indexed by model stage s (pp * v entries each;
// which rank and chunk hold stage s: Schedule::stage(), core/model/stage_map.hpp). Any unit; the printer and the tables only use ratios.
// A fused Backward costs b[s] + w[s].
struct StageCosts {
  std::vector<double> f;  // (S) Forward
  std::vector<double> b;  // (S) BackwardInput: gradient w.r.t. the input
  std::vector<double> w;  // (S) BackwardWeight: gradient w.r.t. the weights
  double comm = 0;        // one activation or gradient message, end of the producer to
                          // the earliest start of the consumer; occupies neither rank
  // Per pipeline link k (between ranks k and k + 1; k = pp - 1: the wrap
  // link between ranks pp - 1 and 0), a message's time on it; empty: every
  // link takes `comm`. A link measured slower than the rest (one congested
  // cable) is planned for where it is.
  std::vector<double> link;
  // The spread of single instructions' times: measured ratios of an
  // instruction's time to its stage's median (e.g. quantiles; all > 0).
  // Empty: every instruction takes exactly its stage's time. Used by
  // expected_makespan (timeline.hpp, with jitter_samples draws), not by
  // time_schedule.
  std::vector<double> jitter;
  int jitter_samples = 32;

  // Every stage the same.
  static StageCosts uniform(int stages, double f, double b, double w, double comm = 0);
  int stages() const { return static_cast<int>(f.size()); }
  // A message's time from pipeline rank `from` to rank `to` (neighbours, or
  // the wrap link) of a pipeline of pp ranks: link[k] when given, else comm;
  // 0 from a rank to itself (the vee placement's turn, in memory).
  double message(int from, int to, int pp) const;
};

// Throws ScheduleError unless f, b, w have `stages` entries, f and b > 0,
// w >= 0, comm >= 0 and every link >= 0 (all finite); `what` prefixes the message.
void check_costs(const StageCosts& c, int stages, const std::string& what);

}  // namespace adgt::pp
