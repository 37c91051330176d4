// Schedules under NCCL's grouped rendezvous sends (parallel/pipeline/grouped.hpp):
// every generator's lists, after for_rendezvous, run (greedy's with skewed and
// random costs, the schedules with grad reductions, interleaved, whose plain
// lists deadlock on NCCL), and still pass validate(); hand-made lists that swap
// two messages between a pair of ranks, or that need buffered sends, are
// refused with the ranks and instructions named.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/grouped.hpp"
#include "parallel/pipeline/validate.hpp"

using namespace adgt::pp;
using Catch::Matchers::Contains;

// The executor's list on NCCL: for_rendezvous(s), which must still pass
// validate() (buffered sends) and keep every compute and send in place.
void check_rendezvous(const Schedule& s) {
  const Schedule t = for_rendezvous(s);
  CHECK_NOTHROW(validate(t));
  CHECK_NOTHROW(validate_grouped(t));
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::vector<Instr> a, b;
    for (const Instr& in : s.ranks[r])
      if (!is_recv(in.op)) a.push_back(in);
    for (const Instr& in : t.ranks[r])
      if (!is_recv(in.op)) b.push_back(in);
    CHECK(a == b);
    CHECK(t.ranks[r].size() == s.ranks[r].size());
  }
}

TEST_CASE("grouped sends: every generated schedule runs on NCCL's rendezvous sends", "[schedule][grouped]") {
  int n = 0;
  for (int pp : {2, 3, 4, 6, 8})
    for (int m : {pp, pp + 1, 2 * pp, 3 * pp + 2}) {
      for (const std::string& name : {"gpipe", "1f1b", "zb-h1"}) {
        const Schedule s = with_grad_reductions(make_schedule(name, pp, m, 1));
        validate(s);
        INFO(name << " pp=" << pp << " m=" << m);
        check_rendezvous(s);
        ++n;
      }
      for (int v : {2, 3}) {
        if (m % pp == 0) {
          const Schedule s = make_schedule("interleaved", pp, m, v);
          INFO("interleaved pp=" << pp << " m=" << m << " v=" << v);
          check_rendezvous(s);
          ++n;
        }
        if (pp > 1) {
          const Schedule s = with_grad_reductions(make_schedule("greedy", pp, m, v));
          INFO("greedy pp=" << pp << " m=" << m << " v=" << v << " " << s.detail);
          check_rendezvous(s);
          ++n;
        }
      }
      std::mt19937 rng(unsigned(pp * 100 + m));
      std::uniform_real_distribution<double> u(0.2, 3.0);
      for (int trial = 0; trial < 3; ++trial) {
        StageCosts c = StageCosts::uniform(pp, 1, 1, 1, trial == 2 ? 0.5 : 0);
        if (trial > 0)
          for (int st = 0; st < pp; ++st) c.f[size_t(st)] = u(rng), c.b[size_t(st)] = u(rng), c.w[size_t(st)] = u(rng);
        for (int64_t limit : {int64_t(1), int64_t(pp), int64_t(2 * pp)}) {
          const Schedule s = greedy(pp, m, c, limit);
          INFO("greedy pp=" << pp << " m=" << m << " limit=" << limit << " " << s.detail);
          check_rendezvous(s);
          ++n;
        }
      }
    }
  CHECK(n > 250);
}

TEST_CASE("grouped sends: messages between two ranks must be in the same order on both", "[schedule][grouped]") {
  // 1F1B on 2 ranks, then rank 1 receives micro-batch 1's activation before
  // micro-batch 0's: fine with tags and buffered sends, swapped on NCCL.
  Schedule s = make_schedule("gpipe", 2, 2, 1);
  auto& r1 = s.ranks[1];
  // gpipe rank 1: RecvAct(0) F(0) RecvAct(1) F(1) ...: swap the two receives' micro-batches
  // and the forwards with them.
  size_t a = 0, b = 0;
  for (size_t i = 0; i < r1.size(); ++i)
    if (r1[i].op == Op::RecvAct) (r1[i].microbatch == 0 ? a : b) = i;
  std::swap(r1[a], r1[b]);
  std::swap(r1[a + 1], r1[b + 1]);
  REQUIRE_NOTHROW(validate(s));  // tags match them up
  CHECK_THROWS_WITH(validate_grouped(s),
                    Contains("NCCL matches messages by order") && Contains("rank 0's send 0 to rank 1") &&
                        Contains("RecvAct(mb 1, chunk 0)"));
}

TEST_CASE("grouped sends: a receive issued before the send its peer waits for is a deadlock", "[schedule][grouped]") {
  // Rank 0 waits for a gradient before sending the activation rank 1 waits
  // for; each rank's send is in a later group than its receive.
  Schedule s;
  s.pp = 2;
  s.microbatches = 1;
  s.ranks = {{{Op::RecvGrad, 0, 0, 1}, {Op::SendAct, 0, 0, 1}, {Op::WaitSends, -1, -1, -1}},
             {{Op::RecvAct, 0, 0, 0}, {Op::SendGrad, 0, 0, 0}, {Op::WaitSends, -1, -1, -1}}};
  CHECK_THROWS_WITH(validate_grouped(s),
                    Contains("deadlock with grouped rendezvous sends (NCCL)") &&
                        Contains("rank 0's group at #0 RecvGrad(mb 0, chunk 0) from rank 1 waits for "
                                 "#1 SendGrad(mb 0, chunk 0) to rank 0 on rank 1"));
  // Queued with the receive, the same sends run: the group issues both.
  Schedule t = s;
  std::swap(t.ranks[0][0], t.ranks[0][1]);
  std::swap(t.ranks[1][0], t.ranks[1][1]);
  CHECK_NOTHROW(validate_grouped(t));
}

TEST_CASE("grouped sends: interleaved 1F1B as generated deadlocks on NCCL; for_rendezvous mends it", "[schedule][grouped]") {
  const Schedule s = make_schedule("interleaved", 2, 4, 2);
  CHECK_THROWS_WITH(validate_grouped(s), Contains("deadlock with grouped rendezvous sends (NCCL)"));
  CHECK_NOTHROW(validate_grouped(for_rendezvous(s)));
}

TEST_CASE("grouped sends: zb-v's turn on rank pp-1 is no transport operation", "[schedule][grouped]") {
  // Rank pp-1 sends stage pp-1's activations (and stage pp's input
  // gradients) to itself: the executor copies them in memory. for_rendezvous
  // keeps those receives where they were, after their sends, and
  // validate_grouped does not count them as NCCL operations.
  for (int pp : {2, 3, 4, 8})
    for (int m : {1, pp, 2 * pp, 3 * pp + 1}) {
      const Schedule s = with_grad_reductions(zb_v(pp, m));
      INFO("zb-v pp=" << pp << " m=" << m);
      check_rendezvous(s);
      const Schedule t = for_rendezvous(s);
      const auto& a = s.ranks[size_t(pp - 1)];
      const auto& b = t.ranks[size_t(pp - 1)];
      int self = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (is_recv(a[i].op) && a[i].peer == pp - 1) {
          ++self;
          // Same position among the rank's non-moving instructions: the
          // instructions before it that are not moved receives are the same.
          std::vector<Instr> before_a, before_b;
          for (size_t k = 0; k < i; ++k)
            if (!is_recv(a[k].op) || a[k].peer == pp - 1) before_a.push_back(a[k]);
          size_t j = 0;
          while (j < b.size() && !(b[j] == a[i])) ++j;
          REQUIRE(j < b.size());
          for (size_t k = 0; k < j; ++k)
            if (!is_recv(b[k].op) || b[k].peer == pp - 1) before_b.push_back(b[k]);
          CHECK(before_a == before_b);
        }
      CHECK(self == 2 * m);  // each micro-batch's activation and its gradient
    }
}
