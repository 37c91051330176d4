// Pipeline-schedule generators (parallel/pipeline/generators.hpp): every
// generator's lists validate, with the peak in-flight activations its
// description promises (the bound is tight); hand-written expected lists for
// small cases; greedy against 1F1B on unequal stage times; the named errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

using namespace adgt::pp;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

std::int64_t max_of(const std::vector<std::int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

// Only the compute instructions of one rank, as "F0 B0 W0 ..." (lower case for chunk 1).
std::string compute_string(const Schedule& s, int rank) {
  std::string out;
  for (const Instr& in : s.ranks[static_cast<size_t>(rank)]) {
    if (!is_compute(in.op)) continue;
    char c = in.op == Op::Forward ? 'F' : in.op == Op::BackwardWeight ? 'W' : 'B';
    if (in.chunk == 1) c = static_cast<char>(c - 'A' + 'a');
    out += (out.empty() ? "" : " ") + std::string(1, c) + std::to_string(in.microbatch);
  }
  return out;
}

// Every list passes the validator at its documented peak and fails one below it.
void validates_tightly(const Schedule& s, std::int64_t peak) {
  INFO(s.name << " pp=" << s.pp << " m=" << s.microbatches << " v=" << s.virtual_stages);
  CHECK_NOTHROW(validate(s, peak));
  CHECK(max_of(peak_inflight(s)) == peak);
  CHECK_THROWS_WITH(validate(s, peak - 1), Contains("activations in flight") && Contains("above max_inflight"));
}

}  // namespace

TEST_CASE("schedule generators: every generator validates for pp in {2,4}, m in {pp,2pp,3pp}", "[schedule]") {
  for (int pp : {2, 4}) {
    for (int m : {pp, 2 * pp, 3 * pp}) {
      validates_tightly(gpipe(pp, m), m);
      validates_tightly(one_f_one_b(pp, m), pp);
      validates_tightly(zb_h1(pp, m), pp);
      for (int v : {2, 3}) {
        // Megatron: all m*v forwards first when m == pp, else 2(pp-1) + (v-1)pp warm-up
        // forwards on rank 0, then one more before the first backward.
        const std::int64_t peak = m == pp ? m * v : std::min(2 * (pp - 1) + (v - 1) * pp + 1, m * v);
        validates_tightly(interleaved_1f1b(pp, m, v), peak);
      }
      const Schedule g = greedy(pp, m, StageCosts::uniform(pp, 1, 1, 1), pp);
      INFO("greedy pp=" << pp << " m=" << m);
      CHECK_NOTHROW(validate(g, pp));
      // Per rank: 1F1B's peak is min(pp - r, m); ZB-H1 keeps it.
      const auto a = peak_inflight(one_f_one_b(pp, m)), b = peak_inflight(zb_h1(pp, m));
      for (int r = 0; r < pp; ++r) {
        CHECK(a[static_cast<size_t>(r)] == std::min(pp - r, m));
        CHECK(b[static_cast<size_t>(r)] == a[static_cast<size_t>(r)]);
      }
    }
  }
  // pp = 1 is a valid degenerate pipeline: no communication at all.
  const Schedule one = one_f_one_b(1, 3);
  CHECK_NOTHROW(validate(one, 1));
  for (const Instr& in : one.ranks[0]) CHECK_FALSE((is_send(in.op) || is_recv(in.op)));
}

TEST_CASE("schedule generators: 1F1B on pp=2, m=2 is the hand-written list", "[schedule]") {
  const Schedule s = one_f_one_b(2, 2);
  REQUIRE(s.ranks.size() == 2);
  const std::vector<Instr> r0{{Op::Forward, 0, 0, -1},   {Op::SendAct, 0, 0, 1},  {Op::Forward, 1, 0, -1},
                              {Op::SendAct, 1, 0, 1},    {Op::RecvGrad, 0, 0, 1}, {Op::Backward, 0, 0, -1},
                              {Op::RecvGrad, 1, 0, 1},   {Op::Backward, 1, 0, -1}, {Op::WaitSends, -1, -1, -1}};
  const std::vector<Instr> r1{{Op::RecvAct, 0, 0, 0},   {Op::Forward, 0, 0, -1}, {Op::Backward, 0, 0, -1},
                              {Op::SendGrad, 0, 0, 0},  {Op::RecvAct, 1, 0, 0},  {Op::Forward, 1, 0, -1},
                              {Op::Backward, 1, 0, -1}, {Op::SendGrad, 1, 0, 0}, {Op::WaitSends, -1, -1, -1}};
  CHECK(s.ranks[0] == r0);
  CHECK(s.ranks[1] == r1);
}

TEST_CASE("schedule generators: the compute orders of 1F1B, GPipe, ZB-H1 and interleaved", "[schedule]") {
  // 1F1B, pp=4, m=6: rank r warms up with pp-r-1 forwards.
  const Schedule a = one_f_one_b(4, 6);
  CHECK(compute_string(a, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(compute_string(a, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(compute_string(a, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  CHECK(compute_string(gpipe(2, 3), 1) == "F0 F1 F2 B0 B1 B2");
  // ZB-H1, pp=4, m=6: 1F1B's F/B order; rank r defers its first r W's.
  const Schedule z = zb_h1(4, 6);
  CHECK(compute_string(z, 0) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5");
  CHECK(compute_string(z, 1) == "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5");
  CHECK(compute_string(z, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5");
  // Interleaved, pp=2, v=2, m=4 (chunk 1 in lower case): rank 0 warms up with
  // 2(pp-1) + (v-1)pp = 4 forwards, micro-batches in groups of pp per chunk;
  // backwards visit chunk 1 first.
  const Schedule i = interleaved_1f1b(2, 4, 2);
  CHECK(compute_string(i, 0) == "F0 F1 f0 f1 F2 b0 F3 b1 f2 B0 f3 B1 b2 b3 B2 B3");
  CHECK(compute_string(i, 1) == "F0 F1 f0 b0 f1 b1 F2 B0 F3 B1 f2 b2 f3 b3 B2 B3");
}

TEST_CASE("schedule generators: greedy from unequal stage times beats 1F1B within the memory limit", "[schedule]") {
  StageCosts c;
  c.f = {1.0, 1.3, 0.8, 1.6};
  c.b = {1.2, 1.1, 0.9, 1.8};
  c.w = {0.7, 0.9, 0.5, 1.1};
  c.comm = 0.1;
  for (int m : {4, 8, 16}) {
    INFO("m=" << m);
    const double t1 = time_schedule(one_f_one_b(4, m), c).makespan;
    for (std::int64_t limit : {4, 3, 2, 1}) {
      INFO("memory limit " << limit);
      const Schedule g = greedy(4, m, c, limit);
      CHECK_NOTHROW(validate(g, limit));
      CHECK(max_of(peak_inflight(g)) <= limit);
      if (limit == 4) CHECK(time_schedule(g, c).makespan < t1);
      // Never worse than ZB-H1 (which fits the 1F1B limit) either.
      if (limit == 4) CHECK(time_schedule(g, c).makespan <= time_schedule(zb_h1(4, m), c).makespan + 1e-9);
    }
  }
  // Equal times: greedy reaches ZB-H1's makespan, 3m + pp - 1.
  for (int m : {4, 8}) CHECK(time_schedule(greedy(4, m, StageCosts::uniform(4, 1, 1, 1), 4), StageCosts::uniform(4, 1, 1, 1)).makespan == Approx(3 * m + 3));
  // Fewer micro-batches than ranks is fine for greedy.
  CHECK_NOTHROW(validate(greedy(4, 2, StageCosts::uniform(4, 1, 2, 1), 4)));
}

TEST_CASE("schedule generators: greedy over several chunks per rank", "[schedule]") {
  // The d256 test model's measured times per chunk of one layer (8 layers, pp
  // 4, v 2): the embedding's stage and the head's heavier, B = 2.3 W.
  StageCosts c;
  c.f = {0.775, 0.635, 0.635, 0.635, 0.635, 0.635, 0.635, 0.735};
  for (double f : c.f) c.b.push_back(1.394 * f), c.w.push_back(0.606 * f);
  c.comm = 0.003;
  for (int m : {4, 8, 16}) {
    INFO("m=" << m);
    const Schedule il = interleaved_1f1b(4, m, 2);
    const std::int64_t held = max_held_activations(il);
    const Schedule g = greedy(4, m, c, 4, held);
    CHECK(g.virtual_stages == 2);
    CHECK_NOTHROW(validate(g));
    // Within the interleaved schedule's memory and never slower than it on the given times.
    CHECK(max_held_activations(g) <= held);
    const double tg = time_schedule(g, c).makespan, ti = time_schedule(il, c).makespan;
    CHECK(tg <= ti + 1e-12);
    // Split backwards: the weight gradients fill the interleaved schedule's bubble.
    if (m >= 8) CHECK(tg < 0.97 * ti);
    // Against one chunk per rank on the same layers (stage times summed per rank):
    // below ZB-H1's makespan, and its bubble at most 0.5x 1F1B's.
    StageCosts one;
    for (int r = 0; r < 4; ++r) {
      one.f.push_back(c.f[size_t(r)] + c.f[size_t(r + 4)]);
      one.b.push_back(c.b[size_t(r)] + c.b[size_t(r + 4)]);
      one.w.push_back(c.w[size_t(r)] + c.w[size_t(r + 4)]);
    }
    one.comm = c.comm;
    if (m >= 8) {
      CHECK(tg < time_schedule(zb_h1(4, m), one).makespan);
      CHECK(time_schedule(g, c).bubble_fraction <= 0.5 * time_schedule(one_f_one_b(4, m), one).bubble_fraction);
    }
  }
  // List scheduling alone (m not a multiple of pp: no interleaved order to
  // start from), for several memory limits: valid, within the admission
  // limit (each admitted micro-batch holds at most v chunks' activations).
  for (int m : {2, 5, 7})
    for (std::int64_t limit : {1, 2, 4}) {
      INFO("m=" << m << " limit=" << limit);
      const Schedule g = greedy(4, m, c, limit);
      CHECK_NOTHROW(validate(g));
      CHECK(g.detail.find("list scheduling") == 0);
      for (std::int64_t p : peak_inflight(g)) CHECK(p <= 2 * limit);
    }
  // Equal times per chunk: never slower than interleaved 1F1B.
  const StageCosts u = StageCosts::uniform(8, 0.5, 0.5, 0.5);
  for (int m : {4, 8})
    CHECK(time_schedule(greedy(4, m, u, 4), u).makespan <= time_schedule(interleaved_1f1b(4, m, 2), u).makespan + 1e-12);
  // Three chunks per rank.
  const Schedule g3 = greedy(2, 4, StageCosts::uniform(6, 1, 1, 1), 2);
  CHECK(g3.virtual_stages == 3);
  CHECK_NOTHROW(validate(g3));
  // make_schedule passes the chunks through, and the costs must have pp x v entries.
  CHECK(make_schedule("greedy", 4, 8, 2).virtual_stages == 2);
  CHECK_THROWS_WITH(make_schedule("greedy", 4, 8, 2, StageCosts::uniform(4, 1, 1, 1)),
                    Contains("greedy: stage costs f has 4 entries; the schedule has 8 stages"));
  CHECK_THROWS_WITH(make_schedule("greedy", 1, 8, 2),
                    Equals("parallel.pp=1: greedy with parallel.virtual_stages=2 needs at least 2 pipeline ranks; "
                           "use pp >= 2, or virtual_stages=1"));
}

TEST_CASE("schedule generators: greedy's per-rank deferrals on the 16-layer model", "[schedule]") {
  // The d256 model at 16 layers, two per chunk (pp 4, v 2), as measured: the
  // embedding's and the head's stages heavier, B = 2.3 W. At interleaved
  // 1F1B's memory (12 chunks held) the best uniform deferral (d x rank W's
  // deferred) simulates to 10.0% (m = 8) and 5.9% (m = 16) of pp x makespan;
  // the coordinate descent over per-rank deferrals and warm-ups must beat it.
  StageCosts c;
  c.f = {1.42, 1.28, 1.28, 1.28, 1.28, 1.28, 1.28, 1.38};
  for (double f : c.f) c.b.push_back(1.394 * f), c.w.push_back(0.606 * f);
  c.comm = 0.006;
  for (auto [m, bound] : {std::pair{8, 0.092}, std::pair{16, 0.056}}) {
    INFO("m=" << m);
    const Schedule g = greedy(4, m, c, 4, 12);
    CHECK_NOTHROW(validate(g));
    CHECK(max_held_activations(g) <= 12);
    CHECK(g.detail.find("per rank") != std::string::npos);
    CHECK(time_schedule(g, c).bubble_fraction <= bound);
  }
}

TEST_CASE("schedule generators: ZB-V on the vee placement", "[schedule]") {
  using adgt::StagePlacement;
  // The placements: vee puts chunk 1 of rank r on stage 2pp-1-r; both invert.
  for (StagePlacement pl : {StagePlacement::looped, StagePlacement::vee})
    for (int s = 0; s < 8; ++s) {
      const int r = adgt::rank_of_stage(pl, 4, s), c = adgt::chunk_of_stage(pl, 4, s);
      CHECK(adgt::stage_of(pl, 4, r, c) == s);
    }
  CHECK(adgt::stage_of(StagePlacement::vee, 4, 0, 1) == 7);
  CHECK(adgt::stage_of(StagePlacement::vee, 4, 3, 1) == 4);
  CHECK(adgt::stage_of(StagePlacement::looped, 4, 0, 1) == 4);
  // A message from a rank to itself (vee's turn on rank pp-1) costs nothing.
  StageCosts k = StageCosts::uniform(8, 1, 1, 1, 0.25);
  CHECK(k.message(3, 3, 4) == 0.0);
  CHECK(k.message(2, 3, 4) == 0.25);

  const StageCosts u = StageCosts::uniform(8, 0.5, 0.5, 0.5);  // F = B = W per stage of the whole model
  const StageCosts u1 = StageCosts::uniform(4, 1, 1, 1);
  for (int m : {4, 8, 16}) {
    INFO("m=" << m);
    const Schedule z = zb_v(4, m);
    CHECK(z.name == "zb-v");
    CHECK(z.placement == StagePlacement::vee);
    CHECK(z.virtual_stages == 2);
    CHECK_NOTHROW(validate(z));
    // 1F1B's activations: 4 stages' worth, 8 chunks of half a stage.
    CHECK(max_held_activations(z) <= 8);
    // Rank 3 turns every micro-batch around itself; rank 0 never talks to rank 3.
    int self = 0;
    for (const Instr& in : z.ranks[3])
      if ((is_send(in.op) || is_recv(in.op)) && in.peer == 3) ++self;
    CHECK(self == 4 * m);  // SendAct, RecvAct, SendGrad, RecvGrad per micro-batch
    for (const Instr& in : z.ranks[0]) CHECK(in.peer != 3);
    // On equal times: far below ZB-H1's bubble and at most 0.3x 1F1B's (the
    // interleaved schedule needs 1.5x the memory for 0.66x).
    const double bz = time_schedule(z, u).bubble_fraction;
    if (m >= 8) {
      CHECK(bz < 0.6 * time_schedule(zb_h1(4, m), u1).bubble_fraction);
      CHECK(bz <= 0.3 * time_schedule(one_f_one_b(4, m), u1).bubble_fraction);
    }
  }
  // greedy on the vee placement, with measured-like costs and a held limit.
  StageCosts c = StageCosts::uniform(8, 1, 1.4, 0.6, 0.01);
  const Schedule g = greedy(4, 8, c, 4, 10, StagePlacement::vee);
  CHECK(g.placement == StagePlacement::vee);
  CHECK_NOTHROW(validate(g));
  CHECK(max_held_activations(g) <= 10);
  // The placement's rules, as named errors.
  CHECK_THROWS_WITH(make_schedule("zb-v", 4, 8, 2),
                    Contains("parallel.schedule=\"zb-v\" runs on the V-shaped (vee) stage placement only"));
  CHECK_THROWS_WITH(make_schedule("greedy", 4, 8, 1, {}, 0, 100, StagePlacement::vee),
                    Contains("the vee stage placement (zb-v) places two chunks per rank"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 8, 2, {}, 0, 100, StagePlacement::vee),
                    Contains("does not run on the vee stage placement"));
  CHECK_THROWS_WITH(zb_v(1, 8), Contains("the vee stage placement (zb-v) needs at least 2 pipeline ranks"));
}

TEST_CASE("schedule generators: make_schedule dispatches by name", "[schedule]") {
  for (const std::string& name : schedule_names()) {
    const int v = name == "interleaved" || name == "zb-v" ? 2 : 1;
    const auto place = name == "zb-v" ? adgt::StagePlacement::vee : adgt::StagePlacement::looped;
    const Schedule s = make_schedule(name, 4, 8, v, {}, 0, std::numeric_limits<std::int64_t>::max(), place);
    CHECK(s.name == name);
    CHECK(s.virtual_stages == v);
    CHECK_NOTHROW(validate(s));
  }
}

TEST_CASE("schedule generators: bad settings are named errors", "[schedule]") {
  CHECK_THROWS_WITH(make_schedule("1f1b", 4, 2, 1),
                    Equals("parallel.microbatches=2 < parallel.pp=4: 1F1B needs at least pp micro-batches; use >= 4"));
  CHECK_THROWS_WITH(zb_h1(4, 3), Equals("parallel.microbatches=3 < parallel.pp=4: ZB-H1 needs at least pp "
                                        "micro-batches; use >= 4"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 2, 2),
                    Contains("parallel.microbatches=2 < parallel.pp=4: The interleaved schedule needs at least pp"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 6, 2),
                    Equals("parallel.microbatches=6 is not a multiple of parallel.pp=4: the interleaved schedule runs "
                           "micro-batches in groups of pp (as Megatron does); use 4 or 8"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 4, 8, 2),
                    Equals("parallel.virtual_stages=2 needs parallel.schedule=interleaved, greedy or zb-v (got 1f1b); "
                           "use virtual_stages=1, or schedule=interleaved, greedy or zb-v"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 8, 1), Contains("needs at least 2 chunks per rank"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 1, 8, 2), Contains("needs at least 2 pipeline ranks"));
  CHECK_THROWS_WITH(make_schedule("zb-h2", 4, 8, 1),
                    Equals("parallel.schedule=\"zb-h2\": unknown pipeline schedule; use one of gpipe, 1f1b, "
                           "interleaved, zb-h1, zb-v, greedy"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 0, 8, 1), Contains("parallel.pp=0: must be >= 1"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 4, 0, 1), Contains("parallel.microbatches=0: must be >= 1"));
  CHECK_NOTHROW(make_schedule("gpipe", 4, 2, 1));  // GPipe runs with any m

  // Layers per stage.
  CHECK_NOTHROW(check_pipeline_config(32, 4, 2, 8, "interleaved"));
  CHECK_THROWS_WITH(check_pipeline_config(30, 4, 1, 8, "1f1b"),
                    Equals("model.n_layers=30 is not divisible by parallel.pp=4: every pipeline stage holds the same "
                           "number of layers; use pp in {1,2,3,5,6,10,15,30}"));
  CHECK_THROWS_WITH(check_pipeline_config(12, 2, 4, 4, "interleaved"),
                    Equals("model.n_layers=12 is not divisible by parallel.pp x parallel.virtual_stages = 2 x 4 = 8 "
                           "stages: every stage holds the same number of layers; use virtual_stages in {2,3,6}"));
  CHECK_THROWS_WITH(check_pipeline_config(2, 2, 2, 4, "interleaved"),
                    Contains("no virtual_stages >= 2 divides n_layers/pp=1; use parallel.schedule=1f1b"));
  // The schedule's own rules come first.
  CHECK_THROWS_WITH(check_pipeline_config(32, 4, 2, 8, "1f1b"), Contains("needs parallel.schedule=interleaved"));

  // Greedy's own arguments.
  CHECK_THROWS_WITH(greedy(4, 8, StageCosts::uniform(4, 1, 1, 1), 0),
                    Contains("greedy: mem_limit_microbatches=0: at least one micro-batch's activations must fit"));
  CHECK_THROWS_WITH(greedy(4, 8, StageCosts::uniform(3, 1, 1, 1), 4),
                    Contains("greedy: stage costs f has 3 entries; the schedule has 4 stages"));
  StageCosts neg = StageCosts::uniform(4, 1, 1, 1);
  neg.b[2] = 0;
  CHECK_THROWS_WITH(greedy(4, 8, neg, 4), Contains("b[2]=0.000000: must be > 0"));
}
