// The rank layout of parallel/mesh.hpp: rank = tp_rank + tp * (dp_rank + dp * pp_rank).
#include "parallel/mesh.hpp"

#include "kernels/check.hpp"

namespace adgt {

namespace {
void check_dims(const ParallelDims& d) {
  ADGT_CHECK(d.tp >= 1 && d.dp >= 1 && d.pp >= 1,
             "parallel: tp=" << d.tp << " dp=" << d.dp << " pp=" << d.pp
                             << ": every size must be >= 1");
}
void check_rank(const ParallelDims& d, int rank) {
  check_dims(d);
  ADGT_CHECK(rank >= 0 && rank < d.world(),
             "parallel: rank " << rank << " is outside tp=" << d.tp << " x dp=" << d.dp
                               << " x pp=" << d.pp << " = " << d.world() << " ranks");
}
}  // namespace

RankCoords coords_of(const ParallelDims& d, int rank) {
  check_rank(d, rank);
  RankCoords c;
  c.tp = rank % d.tp;
  c.dp = (rank / d.tp) % d.dp;
  c.pp = rank / (d.tp * d.dp);
  return c;
}

int rank_of(const ParallelDims& d, const RankCoords& c) {
  check_dims(d);
  ADGT_CHECK(c.tp >= 0 && c.tp < d.tp && c.dp >= 0 && c.dp < d.dp && c.pp >= 0 && c.pp < d.pp,
             "parallel: coordinates tp " << c.tp << " dp " << c.dp << " pp " << c.pp
                                         << " are outside tp=" << d.tp << " dp=" << d.dp
                                         << " pp=" << d.pp);
  return c.tp + d.tp * (c.dp + d.dp * c.pp);
}

std::vector<int> tp_group(const ParallelDims& d, int rank) {
  RankCoords c = coords_of(d, rank);
  std::vector<int> g;
  for (c.tp = 0; c.tp < d.tp; ++c.tp) g.push_back(rank_of(d, c));
  return g;
}

std::vector<int> dp_group(const ParallelDims& d, int rank) {
  RankCoords c = coords_of(d, rank);
  std::vector<int> g;
  for (c.dp = 0; c.dp < d.dp; ++c.dp) g.push_back(rank_of(d, c));
  return g;
}

std::vector<int> pp_group(const ParallelDims& d, int rank) {
  RankCoords c = coords_of(d, rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < d.pp; ++c.pp) g.push_back(rank_of(d, c));
  return g;
}

}  // namespace adgt
