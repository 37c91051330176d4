// Layer re-balancing of run-time adaptation (parallel.adapt:
// schedule+layers; docs/adaptation.md): contiguous layer counts per pipeline
// stage that minimise the slowest stage's time when the stages run at
// different measured speeds. Pure.
#pragma once
#include <cstdint>
#include <vector>

namespace adgt::adapt {

// Counts (each >= 1, summing to layer_cost.size()) for speed.size() stages:
// stage s holds the next counts[s] layers and costs the sum of their
// layer_cost (plus first_extra on stage 0, last_extra on the last), in time
// cost / speed[s]. Minimises the largest stage time exactly (dynamic
// programming over split points, O(S L^2)); among optimal splits the one
// whose stage times' sum of squares is least, then the first found. Throws
// std::invalid_argument for fewer layers than stages or a speed <= 0.
std::vector<int64_t> speed_weighted_split(const std::vector<double>& layer_cost, double first_extra,
                                          double last_extra, const std::vector<double>& speed);

// Each stage's time for `counts` under the same model.
std::vector<double> split_times(const std::vector<int64_t>& counts, const std::vector<double>& layer_cost,
                                double first_extra, double last_extra, const std::vector<double>& speed);

}  // namespace adgt::adapt
