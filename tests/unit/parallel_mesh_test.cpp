// The rank layout of parallel/mesh.hpp against its worked example (16 ranks,
// tp=2 dp=4 pp=2), written out by hand, and the formula on other layouts.
#include <catch2/catch.hpp>
#include <algorithm>
#include <set>
#include <vector>

#include "parallel/mesh.hpp"

using namespace adgt;

namespace {
ParallelDims dims(int tp, int dp, int pp) {
  ParallelDims d;
  d.tp = tp, d.dp = dp, d.pp = pp;
  return d;
}
}  // namespace

TEST_CASE("mesh: the 16-rank worked example of mesh.hpp", "[parallel][mesh]") {
  const ParallelDims d = dims(2, 4, 2);
  REQUIRE(d.world() == 16);
  struct Row { int rank, tp, dp, pp; };
  for (Row r : {Row{0, 0, 0, 0}, Row{1, 1, 0, 0}, Row{2, 0, 1, 0}, Row{7, 1, 3, 0},
                Row{8, 0, 0, 1}, Row{9, 1, 0, 1}, Row{15, 1, 3, 1}}) {
    const RankCoords c = coords_of(d, r.rank);
    CHECK(c.tp == r.tp);
    CHECK(c.dp == r.dp);
    CHECK(c.pp == r.pp);
    CHECK(rank_of(d, c) == r.rank);
  }
  CHECK(tp_group(d, 0) == std::vector<int>{0, 1});
  CHECK(tp_group(d, 15) == std::vector<int>{14, 15});
  CHECK(dp_group(d, 0) == std::vector<int>{0, 2, 4, 6});
  CHECK(dp_group(d, 3) == std::vector<int>{1, 3, 5, 7});
  CHECK(dp_group(d, 12) == std::vector<int>{8, 10, 12, 14});
  CHECK(dp_group(d, 13) == std::vector<int>{9, 11, 13, 15});
  CHECK(pp_group(d, 0) == std::vector<int>{0, 8});
  CHECK(pp_group(d, 7) == std::vector<int>{7, 15});
  CHECK(pp_group(d, 9) == std::vector<int>{1, 9});
}

TEST_CASE("mesh: groups partition the world and contain their rank", "[parallel][mesh]") {
  for (ParallelDims d : {dims(1, 1, 1), dims(2, 1, 1), dims(1, 2, 1), dims(4, 2, 1), dims(2, 4, 1),
                         dims(8, 1, 1), dims(2, 3, 2), dims(3, 2, 4)}) {
    for (auto group : {tp_group, dp_group, pp_group}) {
      std::set<int> seen;
      int groups = 0;
      for (int r = 0; r < d.world(); ++r) {
        const std::vector<int> g = group(d, r);
        CHECK(std::find(g.begin(), g.end(), r) != g.end());
        if (g.front() == r) {  // count each group once, at its first member
          ++groups;
          for (int m : g) CHECK(seen.insert(m).second);
        }
        for (int m : g) CHECK(group(d, m) == g);  // every member sees the same group
      }
      CHECK(int(seen.size()) == d.world());
      (void)groups;
    }
    for (int r = 0; r < d.world(); ++r) {
      const RankCoords c = coords_of(d, r);
      CHECK(r == c.tp + d.tp * (c.dp + d.dp * c.pp));  // the formula as written in mesh.hpp
      CHECK(tp_group(d, r).size() == size_t(d.tp));
      CHECK(dp_group(d, r).size() == size_t(d.dp));
      CHECK(pp_group(d, r).size() == size_t(d.pp));
    }
  }
}

TEST_CASE("mesh: out-of-range ranks and coordinates are errors", "[parallel][mesh]") {
  const ParallelDims d = dims(2, 2, 1);
  CHECK_THROWS_WITH(coords_of(d, 4), Catch::Contains("rank 4 is outside tp=2 x dp=2 x pp=1 = 4 ranks"));
  CHECK_THROWS(coords_of(d, -1));
  RankCoords c;
  c.dp = 2;
  CHECK_THROWS_WITH(rank_of(d, c), Catch::Contains("outside tp=2 dp=2 pp=1"));
  CHECK_THROWS_WITH(coords_of(dims(0, 1, 1), 0), Catch::Contains("every size must be >= 1"));
}
