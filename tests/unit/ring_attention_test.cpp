// Context parallelism's core without MPI (the ring on 2 and 4 ranks is
// tests/parallel/ring_attention_test.cpp):
//  - the load balance and the ring schedule: over all ranks and steps every
//    (query chunk, key chunk) pair of the causal attention is computed once,
//    with the right mask, and every rank does the same work at every step;
//  - ring attention on a ring of one (SelfComm: the two chunks 0 and 1 of
//    one rank) is the whole attention, on the CPU and on the emulated device.
#include "parallel/cp/ring_attention.hpp"

#include <catch2/catch.hpp>
#include <map>
#include <utility>

#include "kernels/emulated/emulated_backend.hpp"
#include "parallel/cp/chunks.hpp"
#include "parallel/cp/ring_schedule.hpp"
#include "tests/unit/attention_fixture.hpp"

using namespace adgt;
using namespace adgt::attn_test;
using Catch::Contains;

TEST_CASE("cp load balance: rank r holds chunks r and 2P-1-r; 2P must divide T", "[cp]") {
  CHECK(cp::rank_chunks(0, 2) == std::array<int, 2>{0, 3});
  CHECK(cp::rank_chunks(1, 2) == std::array<int, 2>{1, 2});
  CHECK(cp::rank_chunks(3, 4) == std::array<int, 2>{3, 4});
  CHECK(cp::chunk_tokens(24, 3) == 4);
  CHECK_THROWS_WITH(cp::chunk_tokens(20, 3),
                    Contains("cp=3 splits the sequence into 2*cp=6 chunks, which must divide "
                             "seq_len=20; use a seq_len that is a multiple of 6"));
  CHECK(cp::chunk_pair_mask(2, 2) == BlockMask::causal);
  CHECK(cp::chunk_pair_mask(2, 1) == BlockMask::full);
  CHECK(!cp::chunk_pair_mask(1, 2).has_value());
}

TEST_CASE("cp tokens: a rank's two chunks of every sequence and their positions", "[cp]") {
  // P = 2, T = 8: c = 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  using V = std::vector<int64_t>;
  CHECK(cp::chunk_positions(0, 2, 4) == V{0, 1, 6, 7});
  CHECK(cp::chunk_positions(1, 2, 4) == V{2, 3, 4, 5});
  CHECK(cp::chunk_positions(0, 1, 6) == V{0, 1, 2, 3, 4, 5});  // cp = 1: the sequence itself
  // Every position once over the ranks, for P = 3, T = 12.
  std::vector<int> seen(12, 0);
  for (int r = 0; r < 3; ++r)
    for (int64_t p : cp::chunk_positions(r, 3, 4)) ++seen[size_t(p)];
  CHECK(seen == std::vector<int>(12, 1));
  // local_tokens: B = 2 sequences of T = 8 tokens 0..15; rank 1 of 2 takes
  // positions 2..5 of each.
  std::vector<int32_t> full(16), local(8);
  for (int i = 0; i < 16; ++i) full[size_t(i)] = i;
  cp::local_tokens(full.data(), local.data(), 2, 8, 1, 2);
  CHECK(local == std::vector<int32_t>{2, 3, 4, 5, 10, 11, 12, 13});
  cp::local_tokens(full.data(), local.data(), 2, 8, 0, 2);
  CHECK(local == std::vector<int32_t>{0, 1, 6, 7, 8, 9, 14, 15});
}

TEST_CASE("ring schedule: every causal chunk pair once, the same work on every rank and step",
          "[cp]") {
  for (int P = 1; P <= 8; ++P) {
    INFO("P=" << P);
    std::map<std::pair<int, int>, int> seen;  // (q chunk, k chunk) -> times computed
    for (int r = 0; r < P; ++r) {
      const std::array<int, 2> mine = cp::rank_chunks(r, P);
      for (int s = 0; s < P; ++s) {
        const int src = cp::ring_source(r, P, s);
        CHECK(src == (r - s + P) % P);
        const std::array<int, 2> theirs = cp::rank_chunks(src, P);
        int full = 0, causal = 0;
        for (const cp::RingBlock& b : cp::ring_step_blocks(r, P, s)) {
          CHECK(b.q_chunk == mine[size_t(b.q_half)]);
          CHECK(b.k_chunk == theirs[size_t(b.k_half)]);
          CHECK(b.k_chunk <= b.q_chunk);
          CHECK((b.mask == BlockMask::causal) == (b.k_chunk == b.q_chunk));
          ++seen[{b.q_chunk, b.k_chunk}];
          (b.mask == BlockMask::causal ? causal : full) += 1;
        }
        // Step 0: both diagonal blocks and the late chunk against the early
        // one; every later step two full blocks.
        CHECK(causal == (s == 0 ? 2 : 0));
        CHECK(full == (s == 0 ? 1 : 2));
      }
    }
    for (int qc = 0; qc < 2 * P; ++qc)
      for (int kc = 0; kc <= qc; ++kc) CHECK(seen[{qc, kc}] == 1);
    CHECK(seen.size() == size_t(2 * P * (2 * P + 1) / 2));
  }
}

namespace {

// Ring attention on a ring of one: the rank holds chunks 0 and 1, i.e. the
// whole sequence in order, so its local tensors are the full ones.
template <class T>
void ring_of_one(Backend& be, double tol) {
  const Problem<T> p(2, 2 * 37, 4, 2, 8, 7);
  const Grads<T> want = reference(p);
  SelfComm self("cp");
  const cp::RingShape s{p.B, cp::chunk_tokens(p.T, 1), p.H, p.KV, p.hd};
  Mem<T> m(be);
  const Tensor q = m.put(p.q, {p.B, p.T, p.H, p.hd}), k = m.put(p.k, {p.B, p.T, p.KV, p.hd});
  const Tensor v = m.put(p.v, {p.B, p.T, p.KV, p.hd}), dout = m.put(p.dout, {p.B, p.T, p.H, p.hd});
  const Tensor out = m.zeros({p.B, p.T, p.H, p.hd}), dq = m.zeros({p.B, p.T, p.H, p.hd});
  const Tensor dk = m.zeros({p.B, p.T, p.KV, p.hd}), dv = m.zeros({p.B, p.T, p.KV, p.hd});
  const Tensor lse = m.zeros({2, p.B, p.H, s.chunk});
  cp::ring_attention_forward(be, self, out, lse, q, k, v, s);
  cp::ring_attention_backward(be, self, dq, dk, dv, dout, q, k, v, out, lse, s);
  CHECK(max_abs_diff(m.get(out), want.out) <= tol);
  CHECK(max_abs_diff(m.get(dq), want.dq) <= tol);
  CHECK(max_abs_diff(m.get(dk), want.dk) <= tol);
  CHECK(max_abs_diff(m.get(dv), want.dv) <= tol);
}

}  // namespace

TEST_CASE("ring attention on a ring of one is the whole attention", "[cp]") {
  CpuBackend cpu;
  ring_of_one<double>(cpu, 1e-12);
  ring_of_one<float>(cpu, 1e-5);
  EmulatedBackend emu(size_t(1) << 30);
  ring_of_one<double>(emu, 1e-12);
}

TEST_CASE("ring attention: shapes and dtypes are checked, naming what was expected", "[cp]") {
  CpuBackend be;
  SelfComm self("cp");
  const cp::RingShape s{1, 4, 4, 2, 8};
  std::vector<double> q(8 * 4 * 8), k(8 * 2 * 8), out(q.size());
  std::vector<float> lse(size_t(cp::ring_lse_elems(s)));
  auto t = [](auto& x, DType d) { return Tensor(x.data(), d, {int64_t(x.size())}); };
  CHECK_THROWS_WITH(
      cp::ring_attention_forward(be, self, t(out, DType::F64), t(lse, DType::F32), t(q, DType::F64),
                                 t(k, DType::F64), t(k, DType::F64), s),
      Contains("ring_attention_forward: lse(32) f32: expected 32 elements (2, B, H, c) in f64"));
  const cp::RingShape gqa{1, 4, 4, 3, 8};
  CHECK_THROWS_WITH(
      cp::ring_attention_forward(be, self, t(out, DType::F64), t(lse, DType::F32), t(q, DType::F64),
                                 t(k, DType::F64), t(k, DType::F64), gqa),
      Contains("n_kv_heads divide n_heads"));
}
