// The device mesh: one validated ParallelDims value and the process groups it
// implies. Rank layout: tp fastest, then dp, then pp (ep is carved out of dp
// by the expert-parallel issue):
//
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//
// Worked example, 16 ranks with tp=2, dp=4, pp=2:
//   rank  0: tp 0 dp 0 pp 0     rank  8: tp 0 dp 0 pp 1
//   rank  1: tp 1 dp 0 pp 0     rank  9: tp 1 dp 0 pp 1
//   rank  2: tp 0 dp 1 pp 0     ...
//   rank  7: tp 1 dp 3 pp 0     rank 15: tp 1 dp 3 pp 1
//   tp groups: {0,1} {2,3} ... {14,15}           (consecutive pairs: one node's NVLink)
//   dp groups: {0,2,4,6} {1,3,5,7} {8,10,12,14} {9,11,13,15}
//   pp groups: {0,8} {1,9} ... {7,15}
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"

namespace adgt {

struct ParallelDims {
  int tp = 1, pp = 1, dp = 1, ep = 1;
  int world() const { return tp * pp * dp; }
};

struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
};

RankCoords coords_of(const ParallelDims& d, int rank);
int rank_of(const ParallelDims& d, const RankCoords& c);
// World ranks of the tp / dp / pp group containing `rank`, in group-rank order.
std::vector<int> tp_group(const ParallelDims& d, int rank);
std::vector<int> dp_group(const ParallelDims& d, int rank);
std::vector<int> pp_group(const ParallelDims& d, int rank);

}  // namespace adgt
