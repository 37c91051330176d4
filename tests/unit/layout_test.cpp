// The parallel layout of core/layout.hpp: the rank formula against its worked
// example (16 ranks, tp=2 dp=4 pp=2 ep=2), written out by hand; coords_of /
// rank_of round trips; group_ranks against a brute-force grouping; and the
// layout rules, which report every broken rule where validate() stops at the
// first.
#include <catch2/catch.hpp>
#include <algorithm>
#include <initializer_list>
#include <set>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"

using namespace adgt;

namespace {

Layout dims(int tp, int dp, int pp, int ep = 1, int cp = 1) {
  Layout l;
  l.tp = tp, l.dp = dp, l.pp = pp, l.ep = ep, l.cp = cp;
  return l;
}

const Group kGroups[] = {Group::tp,    Group::dp, Group::pp,   Group::ep,   Group::edp,
                         Group::world, Group::cp, Group::dpcp, Group::edpcp};

// Rank r's g group by brute force: the ranks whose other coordinates equal
// r's, ordered by the group's own coordinate.
std::vector<int> brute_group(const Layout& l, Group g, int r) {
  const RankCoords me = coords_of(l, r);
  using M = int RankCoords::*;
  std::vector<M> same;  // the coordinates every member shares
  M own = nullptr;      // the coordinate that orders the group
  switch (g) {
    case Group::tp:
      same = {&RankCoords::cp, &RankCoords::dp, &RankCoords::pp};
      own = &RankCoords::tp;
      break;
    case Group::dp:
      same = {&RankCoords::tp, &RankCoords::cp, &RankCoords::pp};
      own = &RankCoords::dp;
      break;
    case Group::pp:
      same = {&RankCoords::tp, &RankCoords::cp, &RankCoords::dp};
      own = &RankCoords::pp;
      break;
    case Group::ep:
      same = {&RankCoords::tp, &RankCoords::cp, &RankCoords::pp, &RankCoords::edp};
      own = &RankCoords::ep;
      break;
    case Group::edp:
      same = {&RankCoords::tp, &RankCoords::cp, &RankCoords::pp, &RankCoords::ep};
      own = &RankCoords::edp;
      break;
    case Group::cp:
      same = {&RankCoords::tp, &RankCoords::dp, &RankCoords::pp};
      own = &RankCoords::cp;
      break;
    case Group::dpcp: same = {&RankCoords::tp, &RankCoords::pp}; break;  // by (edp, cp, ep)
    case Group::edpcp:
      same = {&RankCoords::tp, &RankCoords::pp, &RankCoords::ep};  // by (edp, cp)
      break;
    case Group::world: break;
  }
  // The order of the groups of two coordinates: the slower one first.
  auto order = [&](const RankCoords& c) {
    if (g == Group::dpcp) return (c.edp * int(l.cp) + c.cp) * int(l.ep) + c.ep;
    return c.edp * int(l.cp) + c.cp;
  };
  std::vector<std::pair<int, int>> found;  // (own coordinate, rank)
  for (int q = 0; q < l.world(); ++q) {
    const RankCoords c = coords_of(l, q);
    if (std::all_of(same.begin(), same.end(), [&](M m) { return c.*m == me.*m; }))
      found.push_back({own ? c.*own : g == Group::world ? q : order(c), q});
  }
  std::sort(found.begin(), found.end());
  std::vector<int> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

const std::vector<Layout> kLayouts = {
    dims(1, 1, 1),    dims(2, 1, 1),    dims(1, 2, 1),    dims(4, 2, 1),    dims(2, 4, 1),
    dims(8, 1, 1),    dims(2, 3, 2),    dims(3, 2, 4),    dims(1, 2, 1, 2), dims(2, 4, 2, 2),
    dims(1, 4, 1, 4), dims(2, 6, 1, 3), dims(3, 4, 2, 2), dims(1, 8, 3, 4), dims(2, 4, 1, 4),
    dims(1, 1, 1, 1, 2), dims(2, 2, 1, 1, 2), dims(1, 2, 2, 2, 3), dims(2, 2, 2, 2, 2),
    dims(1, 1, 2, 1, 4)};

}  // namespace

TEST_CASE("layout: the 16-rank worked example of core/layout.cpp", "[layout][mesh]") {
  const Layout d = dims(2, 4, 2, 2);
  REQUIRE(d.world() == 16);
  struct Row { int rank, tp, dp, pp, ep, edp; };
  for (Row r : {Row{0, 0, 0, 0, 0, 0}, Row{1, 1, 0, 0, 0, 0}, Row{2, 0, 1, 0, 1, 0},
                Row{4, 0, 2, 0, 0, 1}, Row{7, 1, 3, 0, 1, 1}, Row{8, 0, 0, 1, 0, 0},
                Row{9, 1, 0, 1, 0, 0}, Row{15, 1, 3, 1, 1, 1}}) {
    const RankCoords c = coords_of(d, r.rank);
    CHECK(c == RankCoords{r.tp, r.dp, r.pp, r.ep, r.edp});
    CHECK(rank_of(d, c) == r.rank);
  }
  using V = std::vector<int>;
  CHECK(group_ranks(d, Group::tp, 0) == V{0, 1});
  CHECK(group_ranks(d, Group::tp, 15) == V{14, 15});
  CHECK(group_ranks(d, Group::dp, 0) == V{0, 2, 4, 6});
  CHECK(group_ranks(d, Group::dp, 3) == V{1, 3, 5, 7});
  CHECK(group_ranks(d, Group::dp, 12) == V{8, 10, 12, 14});
  CHECK(group_ranks(d, Group::dp, 13) == V{9, 11, 13, 15});
  CHECK(group_ranks(d, Group::pp, 0) == V{0, 8});
  CHECK(group_ranks(d, Group::pp, 7) == V{7, 15});
  CHECK(group_ranks(d, Group::pp, 9) == V{1, 9});
  CHECK(group_ranks(d, Group::ep, 0) == V{0, 2});
  CHECK(group_ranks(d, Group::ep, 6) == V{4, 6});
  CHECK(group_ranks(d, Group::ep, 1) == V{1, 3});
  CHECK(group_ranks(d, Group::ep, 13) == V{13, 15});
  CHECK(group_ranks(d, Group::edp, 0) == V{0, 4});
  CHECK(group_ranks(d, Group::edp, 6) == V{2, 6});
  CHECK(group_ranks(d, Group::edp, 5) == V{1, 5});
  CHECK(group_ranks(d, Group::edp, 11) == V{11, 15});
  CHECK(group_ranks(d, Group::world, 9).size() == 16);
  CHECK(group_rank(d, Group::edp, 6) == 1);
  CHECK(group_rank(d, Group::world, 9) == 9);
}

TEST_CASE("layout: context parallelism's worked example of core/layout.cpp", "[layout][mesh]") {
  const Layout d = dims(2, 2, 1, 1, 2);  // tp=2 cp=2 dp=2: 8 ranks
  REQUIRE(d.world() == 8);
  struct Row { int rank, tp, cp, dp; };
  for (Row r : {Row{0, 0, 0, 0}, Row{1, 1, 0, 0}, Row{2, 0, 1, 0}, Row{3, 1, 1, 0},
                Row{4, 0, 0, 1}, Row{7, 1, 1, 1}}) {
    const RankCoords c = coords_of(d, r.rank);
    CHECK((c.tp == r.tp && c.cp == r.cp && c.dp == r.dp && c.pp == 0));
    CHECK(rank_of(d, c) == r.rank);
  }
  using V = std::vector<int>;
  CHECK(group_ranks(d, Group::cp, 0) == V{0, 2});
  CHECK(group_ranks(d, Group::cp, 3) == V{1, 3});
  CHECK(group_ranks(d, Group::cp, 6) == V{4, 6});
  CHECK(group_ranks(d, Group::dp, 0) == V{0, 4});
  CHECK(group_ranks(d, Group::dp, 7) == V{3, 7});
  CHECK(group_ranks(d, Group::dpcp, 4) == V{0, 2, 4, 6});
  CHECK(group_ranks(d, Group::dpcp, 3) == V{1, 3, 5, 7});
  CHECK(group_rank(d, Group::dpcp, 6) == 3);
  CHECK(group_ranks(d, Group::tp, 6) == V{6, 7});
  // With ep = 2 (core/layout.cpp's example): dpcp ep fastest, then cp, then edp.
  Layout x = d;
  x.ep = 2;
  CHECK(group_ranks(x, Group::dpcp, 0) == V{0, 4, 2, 6});
  CHECK(group_ranks(x, Group::dpcp, 7) == V{1, 5, 3, 7});
  CHECK(group_rank(x, Group::dpcp, 2) == 2);
  CHECK(group_ranks(x, Group::edpcp, 0) == V{0, 2});
  CHECK(group_ranks(x, Group::edpcp, 6) == V{4, 6});
  CHECK(group_ranks(x, Group::edpcp, 5) == V{5, 7});
  CHECK(group_ranks(x, Group::ep, 0) == V{0, 4});
  for (int r = 0; r < 8; ++r)  // the checkpoint's view: a dpcp rank modulo ep is the ep rank
    CHECK(group_rank(x, Group::dpcp, r) % 2 == coords_of(x, r).ep);
  // cp = 1 keeps the formula before context parallelism (checkpoints, rank tables).
  const Layout e = dims(2, 4, 2, 2);
  for (int r = 0; r < 16; ++r) {
    const RankCoords c = coords_of(e, r);
    CHECK(r == c.tp + 2 * (c.dp + 4 * c.pp));
    CHECK(group_ranks(e, Group::dpcp, r) == group_ranks(e, Group::dp, r));
    CHECK(group_ranks(e, Group::cp, r) == V{r});
  }
}

TEST_CASE("layout: coords_of and rank_of round-trip on every rank", "[layout][mesh]") {
  for (const Layout& d : kLayouts) {
    std::set<std::vector<int>> seen;
    for (int r = 0; r < d.world(); ++r) {
      const RankCoords c = coords_of(d, r);
      CHECK(rank_of(d, c) == r);
      CHECK((c.tp >= 0 && c.tp < d.tp && c.dp >= 0 && c.dp < d.dp && c.pp >= 0 && c.pp < d.pp));
      CHECK((c.ep >= 0 && c.ep < d.ep && c.edp >= 0 && c.edp < d.dp / d.ep));
      CHECK((c.cp >= 0 && c.cp < d.cp));
      CHECK(seen.insert({c.tp, c.cp, c.dp, c.pp}).second);  // one rank per place
    }
  }
}

TEST_CASE("layout: group_ranks agree with a brute-force grouping", "[layout][mesh]") {
  for (const Layout& d : kLayouts)
    for (Group g : kGroups) {
      INFO("tp=" << d.tp << " dp=" << d.dp << " pp=" << d.pp << " ep=" << d.ep << " group "
                 << group_name(g));
      std::set<int> covered;
      for (int r = 0; r < d.world(); ++r) {
        const std::vector<int> want = brute_group(d, g, r);
        const std::vector<int> got = group_ranks(d, g, r);
        CHECK(got == want);
        const auto at = std::find(got.begin(), got.end(), r);
        REQUIRE(at != got.end());
        CHECK(group_rank(d, g, r) == int(at - got.begin()));
        if (got.front() == r) covered.insert(got.begin(), got.end());  // each group once
      }
      CHECK(int(covered.size()) == d.world());  // the groups partition the world
    }
}

TEST_CASE("layout: out-of-range ranks, coordinates and sizes are errors", "[layout][mesh]") {
  const Layout d = dims(2, 2, 1);
  CHECK_THROWS_WITH(coords_of(d, 4),
                    Catch::Contains("rank 4 is outside tp=2 x dp=2 x pp=1 = 4 ranks"));
  CHECK_THROWS(coords_of(d, -1));
  RankCoords c;
  c.dp = 2;
  CHECK_THROWS_WITH(rank_of(d, c), Catch::Contains("outside tp=2 dp=2 pp=1"));
  CHECK_THROWS_WITH(coords_of(dims(0, 1, 1), 0), Catch::Contains("every size must be >= 1"));
  CHECK_THROWS_WITH(coords_of(dims(1, 4, 1, 3), 0), Catch::Contains("ep=3 does not divide dp=4"));
}

TEST_CASE("layout: layout_of carries the parallel keys", "[layout][config]") {
  RunConfig cfg = load_config_text(
      "parallel:\n  tp: 2\n  pp: 2\n  dp: 2\n  schedule: interleaved\n  virtual_stages: 2\n"
      "  zero: 1\n  sequence_parallel: true\n  stage_layers: [1, 1, 1, 1]\n"
      "train:\n  micro_batch: 1\n  global_batch: 4\n",
      "x.yaml");
  const Layout l = layout_of(cfg);
  CHECK((l.tp == 2 && l.pp == 2 && l.dp == 2 && l.ep == 1 && l.world() == 8));
  CHECK((l.zero == 1 && l.sequence_parallel && l.schedule == "interleaved"));
  CHECK(l.virtual_stages == 2);
  CHECK(l.stage_layers == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(l.microbatches == 0);
  CHECK(layout_errors(cfg.model, cfg.train, l).empty());
  CHECK(!layout_error(cfg.model, cfg.train, l));
  CHECK(!world_error(l, 8));
  CHECK(world_error(l, 12) ==
        "parallel.tp=2 x pp=2 x dp=2 = 8 ranks, but the launch has 12 (mpirun -np / srun -n); "
        "with tp=2 pp=2 use dp=3");
}

TEST_CASE("layout: layout_errors reports every broken rule, the first as validate() does",
          "[layout][config]") {
  RunConfig cfg;  // defaults: n_heads 8, n_kv_heads 4, ffn_hidden 688, n_layers 4, no experts
  cfg.source = "code";
  cfg.train.micro_batch = 8, cfg.train.global_batch = 8;  // one micro-batch
  cfg.parallel.tp = 3;              // does not divide n_heads
  cfg.parallel.ep = 2;              // needs experts
  cfg.parallel.zero = 5;            // no ZeRO-5
  cfg.parallel.pp = 2;              // one micro-batch is fewer than two stages under 1f1b
  cfg.parallel.virtual_stages = 2;  // needs the interleaved schedule
  const std::vector<LayoutIssue> all = layout_errors(cfg.model, cfg.train, layout_of(cfg));
  std::vector<std::string> keys;
  for (const LayoutIssue& i : all) keys.push_back(i.key);
  CHECK(keys == std::vector<std::string>{"parallel.ep", "parallel.zero", "parallel.tp",
                                         "parallel.virtual_stages", "train.global_batch"});
  REQUIRE(all.size() == 5);
  CHECK(all[0].message ==
        "parallel.ep=2 needs a mixture-of-experts model; set model.n_experts (e.g. 8) or "
        "parallel.ep: 1");
  CHECK(all[1].message == "parallel.zero=5: ZeRO stages are 0, 1, 2 and 3");
  CHECK(all[2].message == "parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}");
  CHECK(all[3].message ==
        "parallel.virtual_stages=2 needs parallel.schedule=interleaved, greedy or zb-v (got 1f1b); use "
        "virtual_stages=1, or schedule=interleaved, greedy or zb-v");
  CHECK(all[4].message ==
        "parallel.schedule=1f1b with parallel.pp=2: fewer micro-batches than stages "
        "(train.global_batch=8 / (train.micro_batch=8 x parallel.dp=1) = 1, need >= 2); use "
        "train.global_batch >= 16, or parallel.schedule=gpipe");
  CHECK(layout_error(cfg.model, cfg.train, layout_of(cfg)) == all[0].message);
  REQUIRE_THROWS_WITH(validate(cfg), "code: " + all[0].message);

  // Fix the first and validate() reports the next.
  cfg.parallel.ep = 1;
  REQUIRE_THROWS_WITH(validate(cfg), "code: " + all[1].message);
  CHECK(layout_errors(cfg.model, cfg.train, layout_of(cfg)).size() == 4);
}

TEST_CASE("layout: rules whose premise is broken are not evaluated", "[layout][config]") {
  ModelConfig m;
  TrainConfig t;
  t.micro_batch = 4, t.global_batch = 10;  // not a multiple: the micro-batch count is not exact
  Layout l = dims(1, 1, 2);
  l.microbatches = 7;
  const std::vector<LayoutIssue> all = layout_errors(m, t, l);
  REQUIRE(all.size() == 1);  // no micro-batch-count rule on an inexact count
  CHECK(all[0].message ==
        "train.global_batch=10 is not a multiple of train.micro_batch=4 x parallel.dp=1; "
        "use 8 or 12");

  // Sizes < 1 stop the check (nothing else can be divided by them).
  const std::vector<LayoutIssue> zero = layout_errors(m, t, dims(0, 1, 1, 0));
  REQUIRE(zero.size() == 2);
  CHECK(zero[0].message == "parallel.tp=0: must be >= 1");
  CHECK(zero[1].key == "parallel.ep");

  // Expert placement: a wrong-length list is one issue, not also a count per rank.
  m.n_experts = 4;
  t.global_batch = 8;
  Layout e = dims(1, 2, 1, 2);
  e.expert_placement = {0, 1, 1};
  const std::vector<LayoutIssue> pl = layout_errors(m, t, e);
  REQUIRE(pl.size() == 1);
  CHECK(pl[0].key == "parallel.expert_placement");
}

TEST_CASE("layout: context parallelism's rules name the rule and a fitting cp", "[layout][config]") {
  ModelConfig m;  // n_heads 8, n_kv_heads 4
  m.seq_len = 96;
  TrainConfig t;
  t.micro_batch = 1, t.global_batch = 4;
  Layout l = dims(1, 1, 1, 1, 4);  // 96 = 12 chunks of 8: fits
  CHECK(layout_errors(m, t, l).empty());
  l.cp = 5;  // 96 is not 10 chunks
  std::vector<LayoutIssue> all = layout_errors(m, t, l);
  REQUIRE(all.size() == 1);
  CHECK(all[0].key == "parallel.cp");
  CHECK(all[0].message ==
        "parallel.cp=5 needs model.seq_len=96 divisible by 2 x cp = 10 (each rank holds two of 2 "
        "x cp equal chunks of a sequence); use cp in {1,2,3,4,6,8,12,16,24,48}");
  // all-to-all scatters the heads: heads / tp divisible by cp.
  l = dims(2, 1, 1, 1, 4);
  l.cp_mode = "all-to-all";
  all = layout_errors(m, t, l);
  REQUIRE(all.size() == 1);
  CHECK(all[0].key == "parallel.cp_mode");
  CHECK(all[0].message ==
        "parallel.cp_mode=all-to-all scatters the attention heads over the cp ranks: it needs "
        "model.n_heads / tp = 4 and model.n_kv_heads / tp = 2 divisible by parallel.cp=4; use cp "
        "in {1,2} or cp_mode: ring");
  l.cp = 2;
  CHECK(layout_errors(m, t, l).empty());
  l.cp_mode = "ulysses";
  all = layout_errors(m, t, l);
  REQUIRE(all.size() == 1);
  CHECK(all[0].message == "parallel.cp_mode='ulysses': use ring or all-to-all");
  // Sequence parallelism splits a rank's seq_len / cp tokens over tp.
  l = dims(4, 1, 1, 1, 3);
  l.sequence_parallel = true;
  m.seq_len = 6 * 5;  // 30 / 3 = 10 tokens: not a multiple of tp = 4
  m.n_heads = 8, m.n_kv_heads = 4;
  all = layout_errors(m, t, l);
  REQUIRE(all.size() == 1);
  CHECK(all[0].message ==
        "parallel.sequence_parallel needs train.micro_batch x model.seq_len / parallel.cp = 10 "
        "tokens divisible by parallel.tp=4");
  // The world counts cp.
  l = dims(2, 2, 2, 1, 2);
  CHECK(l.world() == 16);
  CHECK(world_error(l, 24) ==
        "parallel.tp=2 x cp=2 x pp=2 x dp=2 = 16 ranks, but the launch has 24 (mpirun -np / srun "
        "-n); with tp=2 cp=2 pp=2 use dp=3");
  CHECK(describe(l) ==
        "tp=2 dp=2 zero=0 sequence_parallel=0 pp=2 ep=1 schedule=1f1b virtual_stages=1 cp=2 "
        "cp_mode=ring");
  CHECK(describe(dims(2, 2, 2)) ==
        "tp=2 dp=2 zero=0 sequence_parallel=0 pp=2 ep=1 schedule=1f1b virtual_stages=1");
}
