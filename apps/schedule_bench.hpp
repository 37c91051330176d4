// The bubble table of `adgt-schedule`: every schedule simulated next to its
// closed form, so the numbers check themselves (house style 9).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline/costs.hpp"

namespace adgt::pp {

struct BenchRow {
  std::string schedule;  // "gpipe", "1f1b", ...
  int pp = 0, m = 0, v = 1;
  double makespan = 0;
  double bubble_fraction = 0;  // idle / (pp x makespan)
  double bubble_ratio = 0;     // idle / busy, relative to the ideal compute time
  double theory_ratio = 0;     // closed form of bubble_ratio; NaN where there is none
  double vs_1f1b = 0;          // makespan / 1F1B's makespan for the same pp, m and costs
  std::int64_t peak_inflight = 0;  // most activations in flight on one rank ((mb, chunk) units)
  double peak_inflight_stages = 0;  // the same in whole-stage units (a chunk is 1/v of a stage)
};

// The closed-form bubble relative to the ideal compute time, equal stage
// times with T_F = T_B = T_W: (p-1)/m for gpipe and 1f1b, (p-1)/(v m) for
// interleaved, (p-1)/(3m) for zb-h1 (the ZB paper's (p-1)(T_F+T_B-T_W) over
// m (T_F+T_B+T_W)); NaN for greedy.
double theory_bubble_ratio(const std::string& schedule, int pp, int m, int v);

// gpipe, 1f1b, interleaved (v chunks), zb-h1, zb-v (2 chunks, vee; pp >= 2;
// no closed form: it simulates at (p-1)/(6m), half ZB-H1's) and greedy
// (memory limit pp) for each m, with F = B = W = 1 per stage (1/v per
// chunk), comm 0.
std::vector<BenchRow> bubble_table(int pp, const std::vector<int>& ms, int v);

// gpipe, 1f1b, zb-h1 and greedy (memory limit pp) for each m with the given
// per-stage costs (pp stages); theory_ratio is NaN.
std::vector<BenchRow> cost_table(int pp, const std::vector<int>& ms, const StageCosts& costs);

// A fixed-width text table; `theory` adds the closed-form column and
// whether the simulation matches it.
std::string format_table(const std::vector<BenchRow>& rows, bool theory);

// Rows whose simulated bubble_ratio differs from a finite theory_ratio by
// more than tol (absolute).
std::vector<BenchRow> mismatches(const std::vector<BenchRow>& rows, double tol = 1e-9);

}  // namespace adgt::pp
