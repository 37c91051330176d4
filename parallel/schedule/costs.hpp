// Per-stage compute times and the point-to-point latency: what the simulator
// (simulate.hpp) and the greedy generator (generators.hpp) plan with.
#pragma once

#include <string>
#include <vector>

namespace adgt::pp {

// Times for one micro-batch, indexed by model stage s = chunk * pp + rank
// (pp * v entries each). Any unit; the printer and the tables only use ratios.
// A fused Backward costs b[s] + w[s].
struct StageCosts {
  std::vector<double> f;  // (S) Forward
  std::vector<double> b;  // (S) BackwardInput: gradient w.r.t. the input
  std::vector<double> w;  // (S) BackwardWeight: gradient w.r.t. the weights
  double comm = 0;        // one activation or gradient message, end of the producer to
                          // the earliest start of the consumer; occupies neither rank

  // Every stage the same.
  static StageCosts uniform(int stages, double f, double b, double w, double comm = 0);
  int stages() const { return static_cast<int>(f.size()); }
};

// Throws ScheduleError unless f, b, w have `stages` entries, f and b > 0,
// w >= 0 and comm >= 0 (all finite); `what` prefixes the message.
void check_costs(const StageCosts& c, int stages, const std::string& what);

}  // namespace adgt::pp
