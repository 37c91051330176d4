#include "parallel/adapt/layer_balance.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace adgt::adapt {

std::vector<double> split_times(const std::vector<int64_t>& counts, const std::vector<double>& layer_cost,
                                double first_extra, double last_extra, const std::vector<double>& speed) {
  std::vector<double> t(counts.size(), 0.0);
  size_t l = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    double c = (s == 0 ? first_extra : 0) + (s + 1 == counts.size() ? last_extra : 0);
    for (int64_t k = 0; k < counts[s]; ++k) c += layer_cost.at(l++);
    t[s] = c / speed.at(s);
  }
  return t;
}

std::vector<int64_t> speed_weighted_split(const std::vector<double>& layer_cost, double first_extra,
                                          double last_extra, const std::vector<double>& speed) {
  const size_t L = layer_cost.size(), S = speed.size();
  if (S == 0 || L < S)
    throw std::invalid_argument("speed_weighted_split: " + std::to_string(L) + " layers for " +
                                std::to_string(S) + " stages");
  for (double v : speed)
    if (!(v > 0)) throw std::invalid_argument("speed_weighted_split: a stage speed is not positive");
  std::vector<double> prefix(L + 1, 0.0);
  for (size_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + layer_cost[l];
  const auto stage_time = [&](size_t s, size_t a, size_t b) {  // layers [a, b) on stage s
    return (prefix[b] - prefix[a] + (s == 0 ? first_extra : 0) + (s + 1 == S ? last_extra : 0)) / speed[s];
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  // best[s][b]: (largest time, sum of squares) of stages 0..s holding layers [0, b).
  struct Cell {
    double worst = inf, squares = inf;
    size_t from = 0;
  };
  std::vector<std::vector<Cell>> best(S, std::vector<Cell>(L + 1));
  for (size_t b = 1; b + (S - 1) <= L; ++b) {
    const double t = stage_time(0, 0, b);
    best[0][b] = {t, t * t, 0};
  }
  for (size_t s = 1; s < S; ++s)
    for (size_t b = s + 1; b + (S - 1 - s) <= L; ++b)
      for (size_t a = s; a < b; ++a) {
        const Cell& p = best[s - 1][a];
        if (p.worst == inf) continue;
        const double t = stage_time(s, a, b);
        const Cell c{std::max(p.worst, t), p.squares + t * t, a};
        Cell& q = best[s][b];
        const double tol = 1e-12 * std::max(1.0, c.worst);
        if (c.worst < q.worst - tol || (c.worst <= q.worst + tol && c.squares < q.squares - tol)) q = c;
      }
  std::vector<int64_t> counts(S);
  size_t b = L;
  for (size_t s = S; s-- > 0;) {
    const size_t a = s == 0 ? 0 : best[s][b].from;
    counts[s] = int64_t(b - a);
    b = a;
  }
  return counts;
}

}  // namespace adgt::adapt
