// The schedule validator (parallel/pipeline/validate.hpp) on hand-broken
// lists: each error names the rank, the instruction index and what is wrong.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/validate.hpp"

using namespace adgt::pp;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

// Removes the first instruction of rank r equal to `in`; fails if none.
void erase(Schedule& s, int r, const Instr& in) {
  auto& list = s.ranks[static_cast<size_t>(r)];
  for (auto it = list.begin(); it != list.end(); ++it)
    if (*it == in) {
      list.erase(it);
      return;
    }
  FAIL("instruction not found: " << to_string(in));
}

size_t find(const Schedule& s, int r, const Instr& in) {
  const auto& list = s.ranks[static_cast<size_t>(r)];
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i] == in) return i;
  FAIL("instruction not found: " << to_string(in));
  return 0;
}

Schedule two_ranks(std::vector<Instr> r0, std::vector<Instr> r1, int m = 1) {
  Schedule s;
  s.pp = 2;
  s.microbatches = m;
  s.name = "hand";
  s.ranks = {std::move(r0), std::move(r1)};
  return s;
}

constexpr Instr kStep{Op::WaitSends, -1, -1, -1};

}  // namespace

TEST_CASE("schedule validate: a missing RecvAct names the rank and the unmatched SendAct", "[schedule]") {
  Schedule s = one_f_one_b(2, 2);
  erase(s, 1, {Op::RecvAct, 1, 0, 0});
  CHECK_THROWS_WITH(validate(s), Equals("rank 0 #3 SendAct(mb 1, chunk 0) to rank 1 has no matching "
                                        "RecvAct(mb 1, chunk 0) on rank 1"));
  // And the other way round: a Recv whose Send is gone.
  Schedule t = one_f_one_b(2, 2);
  erase(t, 1, {Op::SendGrad, 0, 0, 0});
  CHECK_THROWS_WITH(validate(t), Equals("rank 0 #4 RecvGrad(mb 0, chunk 0) from rank 1 has no matching "
                                        "SendGrad(mb 0, chunk 0) on rank 1"));
  // Interleaved: the message from rank 1's chunk 0 (stage 1) goes to rank 0's chunk 1 (stage 2).
  Schedule u = interleaved_1f1b(2, 2, 2);
  erase(u, 0, {Op::RecvAct, 1, 1, 1});
  CHECK_THROWS_WITH(validate(u), Contains("SendAct(mb 1, chunk 0) to rank 0 has no matching RecvAct(mb 1, chunk 1) "
                                          "on rank 0"));
}

TEST_CASE("schedule validate: two ranks each receiving before sending deadlock", "[schedule]") {
  // Rank 0 waits for the gradient of micro-batch 0 before sending its activation.
  const Schedule s = two_ranks(
      {{Op::RecvGrad, 0, 0, 1}, {Op::Forward, 0, 0, -1}, {Op::SendAct, 0, 0, 1}, {Op::Backward, 0, 0, -1}, kStep},
      {{Op::RecvAct, 0, 0, 0}, {Op::Forward, 0, 0, -1}, {Op::Backward, 0, 0, -1}, {Op::SendGrad, 0, 0, 0}, kStep});
  CHECK_THROWS_WITH(validate(s), Equals("deadlock: rank 0 waits at #0 RecvGrad(mb 0, chunk 0) from rank 1, which "
                                        "waits at #0 RecvAct(mb 0, chunk 0) from rank 0: a cycle (sends are "
                                        "buffered, receives block)"));

  // 1F1B with rank 1's two micro-batches swapped: rank 1 waits for micro-batch 1
  // first, which rank 0 only sends after it got micro-batch 0's gradient.
  Schedule t = two_ranks(
      {{Op::Forward, 0, 0, -1}, {Op::SendAct, 0, 0, 1}, {Op::RecvGrad, 0, 0, 1}, {Op::Backward, 0, 0, -1},
       {Op::Forward, 1, 0, -1}, {Op::SendAct, 1, 0, 1}, {Op::RecvGrad, 1, 0, 1}, {Op::Backward, 1, 0, -1}, kStep},
      {{Op::RecvAct, 1, 0, 0}, {Op::Forward, 1, 0, -1}, {Op::Backward, 1, 0, -1}, {Op::SendGrad, 1, 0, 0},
       {Op::RecvAct, 0, 0, 0}, {Op::Forward, 0, 0, -1}, {Op::Backward, 0, 0, -1}, {Op::SendGrad, 0, 0, 0}, kStep},
      2);
  CHECK_THROWS_WITH(validate(t), Equals("deadlock: rank 0 waits at #2 RecvGrad(mb 0, chunk 0) from rank 1, which "
                                        "waits at #0 RecvAct(mb 1, chunk 0) from rank 0: a cycle (sends are "
                                        "buffered, receives block)"));

  // Four ranks: the cycle is between ranks 1 and 2; ranks 0 and 3 are stuck behind it.
  Schedule u = one_f_one_b(4, 4);
  auto& r1 = u.ranks[1];
  const size_t recv = find(u, 1, {Op::RecvGrad, 0, 0, 2});
  const Instr moved = r1[recv];
  r1.erase(r1.begin() + static_cast<long>(recv));
  r1.insert(r1.begin(), moved);  // rank 1 first waits for micro-batch 0's gradient
  CHECK_THROWS_WITH(validate(u), Contains("deadlock: rank 0 waits at #") &&
                                     Contains("which waits at #0 RecvGrad(mb 0, chunk 0) from rank 2, which waits at") &&
                                     Contains("from rank 1: a cycle; also stuck: rank 3 at #0 RecvAct(mb 0, chunk 0) "
                                              "from rank 2"));
}

TEST_CASE("schedule validate: order on a rank", "[schedule]") {
  // A backward before its forward (last rank of 1F1B, micro-batch 0 swapped).
  Schedule s = one_f_one_b(2, 2);
  const size_t f = find(s, 1, {Op::Forward, 0, 0, -1}), b = find(s, 1, {Op::Backward, 0, 0, -1});
  std::swap(s.ranks[1][f], s.ranks[1][b]);
  CHECK_THROWS_WITH(validate(s), Equals("rank 1 #1 Backward(mb 0, chunk 0) comes before its Forward(mb 0, chunk 0), "
                                        "which must come first"));

  // A weight gradient before its input gradient.
  Schedule w = zb_h1(2, 2);
  const size_t bi = find(w, 0, {Op::BackwardInput, 0, 0, -1}), bw = find(w, 0, {Op::BackwardWeight, 0, 0, -1});
  std::swap(w.ranks[0][bi], w.ranks[0][bw]);
  CHECK_THROWS_WITH(validate(w), Contains("BackwardWeight(mb 0, chunk 0) comes before its BackwardInput(mb 0, chunk 0)"));

  // A forward before the RecvAct that brings its input.
  Schedule r = one_f_one_b(2, 2);
  std::swap(r.ranks[1][0], r.ranks[1][1]);
  CHECK_THROWS_WITH(validate(r), Equals("rank 1 #0 Forward(mb 0, chunk 0) comes before its RecvAct(mb 0, chunk 0) "
                                        "from rank 0, which must come first"));
}

TEST_CASE("schedule validate: the memory limit", "[schedule]") {
  const Schedule s = one_f_one_b(4, 8);
  CHECK_NOTHROW(validate(s, 4));
  // Rank 0's fourth forward (#6, after three forwards and their sends) is one too many.
  CHECK_THROWS_WITH(validate(s, 3), Equals("rank 0 #6 Forward(mb 3, chunk 0): 4 activations in flight on rank 0 "
                                           "(Forward done, backward not yet), above max_inflight=3"));
  CHECK_THROWS_WITH(validate(gpipe(4, 8), 4), Contains("5 activations in flight on rank 0"));
}

TEST_CASE("schedule validate: shape and completeness", "[schedule]") {
  Schedule wrong_peer = one_f_one_b(4, 4);
  wrong_peer.ranks[0][1].peer = 2;  // SendAct(mb 0) of stage 0 must go to rank 1
  CHECK_THROWS_WITH(validate(wrong_peer), Equals("rank 0 #1 SendAct(mb 0, chunk 0) to rank 2: stage 0's next stage 1 "
                                                 "is on rank 1, not rank 2"));

  Schedule no_step = one_f_one_b(2, 2);
  no_step.ranks[1].pop_back();
  CHECK_THROWS_WITH(validate(no_step), Contains("rank 1: the list must end with WaitSends"));

  Schedule early_step = one_f_one_b(2, 2);
  early_step.ranks[0].insert(early_step.ranks[0].begin(), kStep);
  CHECK_THROWS_WITH(validate(early_step), Contains("rank 0 #0 WaitSends: WaitSends must be the last"));

  Schedule send_from_last = one_f_one_b(2, 2);
  send_from_last.ranks[1].insert(send_from_last.ranks[1].begin() + 2, Instr{Op::SendAct, 0, 0, 0});
  CHECK_THROWS_WITH(validate(send_from_last), Contains("rank 1 #2 SendAct(mb 0, chunk 0) to rank 0: stage 1 is the "
                                                       "last stage; it has no next stage to send to"));

  Schedule twice = gpipe(2, 2);
  twice.ranks[0].insert(twice.ranks[0].begin(), Instr{Op::Forward, 1, 0, -1});
  CHECK_THROWS_WITH(validate(twice), Contains("rank 0 #3 Forward(mb 1, chunk 0) appears again (first at #0)"));

  Schedule no_w = zb_h1(2, 2);
  erase(no_w, 1, {Op::BackwardWeight, 1, 0, -1});
  CHECK_THROWS_WITH(validate(no_w), Contains("rank 1: BackwardWeight(mb 1, chunk 0) is missing (stage 1)"));

  Schedule no_b = gpipe(2, 2);
  erase(no_b, 0, {Op::Backward, 1, 0, -1});
  erase(no_b, 0, {Op::RecvGrad, 1, 0, 1});
  erase(no_b, 1, {Op::SendGrad, 1, 0, 0});
  CHECK_THROWS_WITH(validate(no_b), Contains("rank 0: BackwardInput(mb 1, chunk 0) is missing (stage 0)"));

  Schedule mixed = zb_h1(2, 2);
  mixed.ranks[0].insert(mixed.ranks[0].end() - 1, Instr{Op::Backward, 1, 0, -1});
  CHECK_THROWS_WITH(validate(mixed), Contains("both a Backward and a split BackwardInput/BackwardWeight"));

  Schedule out_of_range = gpipe(2, 2);
  out_of_range.ranks[0][0].microbatch = 2;
  CHECK_THROWS_WITH(validate(out_of_range), Contains("rank 0 #0 Forward(mb 2, chunk 0): micro-batch out of range 0..1"));

  Schedule ranks = gpipe(2, 2);
  ranks.ranks.pop_back();
  CHECK_THROWS_WITH(validate(ranks), Contains("has 1 rank lists for pp=2"));
}
