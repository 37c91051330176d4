// The schedule simulator and printer (parallel/pipeline/timeline.hpp,
// print.hpp): a timeline worked out by hand, the closed-form bubbles of
// GPipe, 1F1B, interleaved and ZB-H1 with equal stage times, the outstanding
// sends, and the text Gantt chart.
#include <catch2/catch.hpp>

#include <string>

#include "apps/schedule_bench.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/print.hpp"
#include "parallel/pipeline/timeline.hpp"

using namespace adgt::pp;
using Catch::Matchers::Contains;

namespace {
Approx near(double x) { return Approx(x).margin(1e-9).epsilon(1e-12); }
}  // namespace

TEST_CASE("schedule simulate: 1F1B on pp=2, m=2 with latency, by hand", "[schedule]") {
  // F = 1, B = 1, W = 1 (fused backward 2), comm 0.5. Rank 0: F0 [0,1], F1 [1,2];
  // rank 1: F0 [1.5,2.5], B0 [2.5,4.5], F1 [4.5,5.5], B1 [5.5,7.5]; rank 0:
  // B0 [5,7] (gradient sent at 4.5), B1 [8,10].
  const Timeline r = time_schedule(one_f_one_b(2, 2), StageCosts::uniform(2, 1, 1, 1, 0.5));
  REQUIRE(r.timeline.size() == 2);
  const double want0[][2] = {{0, 1}, {1, 2}, {5, 7}, {8, 10}};
  const double want1[][2] = {{1.5, 2.5}, {2.5, 4.5}, {4.5, 5.5}, {5.5, 7.5}};
  REQUIRE(r.timeline[0].size() == 4);
  REQUIRE(r.timeline[1].size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(r.timeline[0][i].start == near(want0[i][0]));
    CHECK(r.timeline[0][i].end == near(want0[i][1]));
    CHECK(r.timeline[1][i].start == near(want1[i][0]));
    CHECK(r.timeline[1][i].end == near(want1[i][1]));
  }
  CHECK(r.timeline[0][2].instr == Instr{Op::Backward, 0, 0, -1});
  CHECK(r.timeline[0][2].index == 5);  // F0 SendAct F1 SendAct RecvGrad [Backward]
  CHECK(r.makespan == near(10));
  CHECK(r.busy[0] == near(6));
  CHECK(r.idle[0] == near(4));
  CHECK(r.idle[1] == near(4));
  CHECK(r.bubble_fraction == near(8.0 / 20));
  CHECK(r.bubble_ratio == near(8.0 / 12));
}

TEST_CASE("schedule simulate: per-link message times, by hand", "[schedule]") {
  // GPipe, m = 1 on pp = 4, F = 1, B + W = 2: the forward crosses links 0, 1, 2 and
  // the gradient back; makespan = 4 + 8 + 2 (l0 + l1 + l2). Link 1 takes 3,
  // the others 0.25; comm (10) is only the fallback of an unlisted link.
  StageCosts c = StageCosts::uniform(4, 1, 1, 1, 10);
  c.link = {0.25, 3, 0.25, 0};
  CHECK(time_schedule(gpipe(4, 1), c).makespan == near(12 + 2 * 3.5));
  CHECK(c.message(1, 2, 4) == 3);
  CHECK(c.message(2, 1, 4) == 3);
  CHECK(c.message(3, 0, 4) == 0);   // the wrap link
  CHECK(c.message(0, -1, 4) == 10); // no peer: comm
  c.link.clear();
  CHECK(time_schedule(gpipe(4, 1), c).makespan == near(12 + 2 * 30));
  // The greedy schedule plans with the links too: slower link 1, later stage 2.
  StageCosts g = StageCosts::uniform(4, 1, 1, 1, 0);
  g.link = {0, 3, 0, 0};
  const Schedule s = make_schedule("greedy", 4, 8, 1, g, 4);
  CHECK(time_schedule(s, g).makespan <= time_schedule(one_f_one_b(4, 8), g).makespan + 1e-9);
  g.link = {0, -1, 0, 0};
  CHECK_THROWS_WITH(check_costs(g, 4, "test"), Contains("stage costs link[1]=") && Contains(">= 0"));
}

TEST_CASE("schedule simulate: one instruction scaled, by hand", "[schedule]") {
  // The by-hand case above with rank 0's F0 (list index 0) taking 2 instead
  // of 1: everything after it moves by 1. Rank 0: F0 [0,2], F1 [2,3];
  // rank 1: F0 [2.5,3.5], B0 [3.5,5.5], F1 [5.5,6.5], B1 [6.5,8.5]; rank 0:
  // B0 [6,8], B1 [9,11].
  const Schedule s = one_f_one_b(2, 2);
  const StageCosts c = StageCosts::uniform(2, 1, 1, 1, 0.5);
  const Timeline r = time_schedule(s, c, [](int rank, int index) { return rank == 0 && index == 0 ? 2.0 : 1.0; });
  REQUIRE(r.timeline[0].size() == 4);
  const double want0[][2] = {{0, 2}, {2, 3}, {6, 8}, {9, 11}};
  const double want1[][2] = {{2.5, 3.5}, {3.5, 5.5}, {5.5, 6.5}, {6.5, 8.5}};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(r.timeline[0][i].start == near(want0[i][0]));
    CHECK(r.timeline[0][i].end == near(want0[i][1]));
    CHECK(r.timeline[1][i].start == near(want1[i][0]));
    CHECK(r.timeline[1][i].end == near(want1[i][1]));
  }
  CHECK(r.makespan == near(11));
  // Scale 1 everywhere is time_schedule() itself.
  CHECK(time_schedule(s, c, [](int, int) { return 1.0; }).makespan == near(time_schedule(s, c).makespan));
}

TEST_CASE("schedule simulate: the expected makespan under measured jitter", "[schedule]") {
  const Schedule s = one_f_one_b(4, 8);
  StageCosts c = StageCosts::uniform(4, 1, 1, 1);  // no message time: scaling is exact
  const double exact = time_schedule(s, c).makespan;
  CHECK(expected_makespan(s, c) == near(exact));  // no jitter measured
  c.jitter = {1.0};
  CHECK(expected_makespan(s, c) == near(exact));
  c.jitter = {2.0};  // every instruction twice as long
  CHECK(expected_makespan(s, c) == near(2 * exact));
  // Instructions at 0.5x or 1.5x at random (mean 1): the pipeline waits for
  // its late instructions, so it expects a longer step than the medians'
  // (the maximum of random paths), by less than the 1.5x of all late.
  c.jitter = {0.5, 1.5};
  c.jitter_samples = 64;
  const double jittered = expected_makespan(s, c);
  CHECK(jittered > 1.02 * exact);
  CHECK(jittered < 1.5 * exact);
  CHECK(expected_makespan(s, c) == jittered);  // seeded: the same figure every time
  CHECK(expected_makespan(s, c, 7) != jittered);  // another seed, other draws
  c.jitter_samples = 0;  // off: the medians' simulation
  CHECK(expected_makespan(s, c) == near(exact));
  c.jitter = {1.0, 0.0};
  CHECK_THROWS_WITH(check_costs(c, 4, "t"), Contains("jitter[1]") && Contains("> 0"));
}

TEST_CASE("schedule simulate: bubbles equal the closed forms with equal stage times", "[schedule]") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 3 * p, 4 * p}) {
      INFO("pp=" << p << " m=" << m);
      const StageCosts c = StageCosts::uniform(p, 1, 1, 1);  // 1F1B, GPipe: fused B = 2F
      for (const Schedule& s : {one_f_one_b(p, m), gpipe(p, m)}) {
        INFO(s.name);
        const Timeline r = time_schedule(s, c);
        CHECK(r.makespan == near(3.0 * (m + p - 1)));
        CHECK(r.bubble_fraction == near((p - 1.0) / (m + p - 1)));  // of pp x makespan
        CHECK(r.bubble_ratio == near((p - 1.0) / m));               // of the ideal compute time
      }
      // ZB-H1, T_F = T_B = T_W: the bubble is (p-1)(T_F + T_B - T_W) = p-1 per rank.
      const Timeline z = time_schedule(zb_h1(p, m), c);
      CHECK(z.makespan == near(3.0 * m + p - 1));
      CHECK(z.bubble_ratio == near((p - 1.0) / (3 * m)));
      CHECK(z.bubble_fraction == near((p - 1.0) / (3 * m + p - 1)));
      // Interleaved, each chunk 1/v of a stage: 1F1B's bubble divided by v.
      for (int v : {2, 3}) {
        INFO("v=" << v);
        const Timeline i = time_schedule(interleaved_1f1b(p, m, v), StageCosts::uniform(p * v, 1.0 / v, 1.0 / v, 1.0 / v));
        CHECK(i.bubble_ratio == near((p - 1.0) / (v * m)));
        CHECK(i.makespan == near(3.0 * m + 3.0 * (p - 1) / v));
      }
    }
  }
}

TEST_CASE("schedule simulate: the bubble table checks itself", "[schedule]") {
  const auto rows = bubble_table(4, {4, 8, 16, 32}, 2);
  CHECK(rows.size() == 24);  // six schedules x four m
  CHECK(mismatches(rows).empty());
  for (const BenchRow& r : rows) {
    if (r.schedule == "1f1b" || r.schedule == "gpipe") CHECK(r.vs_1f1b == near(1));
    if (r.schedule == "zb-h1" || r.schedule == "greedy" || r.schedule == "interleaved" || r.schedule == "zb-v")
      CHECK(r.vs_1f1b < 1);
  }
  // ZB-V below ZB-H1 at every m (same activations: 8 chunks = 4 stages).
  for (const BenchRow& z : rows)
    for (const BenchRow& h : rows)
      if (z.schedule == "zb-v" && h.schedule == "zb-h1" && z.m == h.m) CHECK(z.vs_1f1b < h.vs_1f1b);
  const std::string t = format_table(rows, true);
  CHECK_THAT(t, Contains("theory") && Contains("ok") && !Contains("DIFF"));
}

TEST_CASE("schedule simulate: sends outstanding when the receiver is slower", "[schedule]") {
  // GPipe pp=2, m=4; rank 1's forward takes 2. Rank 0 sends at 1, 2, 3, 4;
  // rank 1 receives at 1, 3, 5, 7: two messages wait in buffers at t = 4.
  StageCosts c = StageCosts::uniform(2, 1, 1, 1);
  c.f[1] = 2;
  const Timeline r = time_schedule(gpipe(2, 4), c);
  CHECK(r.max_outstanding_sends[0] == 2);
}

TEST_CASE("schedule simulate: a list that cannot finish is an error", "[schedule]") {
  Schedule s = gpipe(2, 1);  // rank 0: F0 SendAct RecvGrad B0
  std::swap(s.ranks[0][0], s.ranks[0][2]);  // rank 0 waits for the gradient first
  CHECK_THROWS_WITH(time_schedule(s, StageCosts::uniform(2, 1, 1, 1)),
                    Contains("simulate gpipe: rank 0 cannot get past #0 RecvGrad(mb 0, chunk 0) from rank 1"));
  CHECK_THROWS_WITH(time_schedule(one_f_one_b(2, 2), StageCosts::uniform(3, 1, 1, 1)),
                    Contains("stage costs f has 3 entries; the schedule has 2 stages"));
}

TEST_CASE("schedule print: the timeline of 1F1B on pp=2, m=2", "[schedule]") {
  const Schedule s = one_f_one_b(2, 2);
  const std::string t = timeline(s, time_schedule(s, StageCosts::uniform(2, 1, 1, 1)));
  CHECK_THAT(t, Contains("1f1b: pp=2, m=2, v=1; one character = 0.5 time units\n"));
  CHECK_THAT(t, Contains("rank 0 |F0F1....B0--..B1--|\n"));
  CHECK_THAT(t, Contains("rank 1 |..F0B0--F1B1--....|\n"));
  CHECK_THAT(t, Contains("makespan 9, ideal 6 (compute per rank); predicted bubble 33.3% of pp x makespan "
                         "(idle / (pp x makespan)), 50.0% of the ideal compute time (idle / busy)"));
}

TEST_CASE("schedule print: ZB-H1, interleaved and labels", "[schedule]") {
  const Schedule z = zb_h1(4, 8);
  const std::string t = timeline(z, time_schedule(z, StageCosts::uniform(4, 1, 1, 1)));
  CHECK_THAT(t, Contains("rank 3 |......F0B0F1B1F2B2F3B3W0F4B4W1"));
  CHECK_THAT(t, Contains("rank 0 |F0F1F2F3......B0W0F4B1W1"));

  const Schedule i = interleaved_1f1b(2, 4, 2);
  const std::string ti = timeline(i, time_schedule(i, StageCosts::uniform(4, 0.5, 0.5, 0.5)));
  CHECK_THAT(ti, Contains("rank 0 |F0F1f0f1") && Contains("lower case: chunk 1"));

  CHECK(label({Op::Forward, 3, 2, -1}, 3) == "F3.2");
  CHECK(label({Op::BackwardWeight, 12, 0, -1}, 1) == "W12");
  CHECK(label({Op::Backward, 0, 1, -1}, 2) == "b0");
  // A fixed scale: two characters per time unit draw a 1-unit F as "F0".
  const Schedule g = gpipe(2, 1);
  const std::string tg = timeline(g, time_schedule(g, StageCosts::uniform(2, 1, 1, 1)), {0.25});
  CHECK_THAT(tg, Contains("rank 0 |F0--............B0------|"));
}
