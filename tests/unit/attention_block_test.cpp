// The blockwise attention ops (Backend::attention_block_forward,
// attention_merge, attention_block_backward) against the whole-sequence
// causal attention (attention_forward / attention_backward, which keep T x T
// probabilities: an independent computation):
//  - one causal block over the whole sequence is the whole attention;
//  - the sequence cut into 2 or 3 chunks of unequal lengths (across the CPU
//    kernel's 64-row blocks), each query chunk against the earlier key
//    chunks (full) and its own (causal), merged, is the whole attention; the
//    blocks' backwards with the final out and lse sum to its gradients;
//  - finite differences (f64) of a loss through two merged blocks;
//  - the same on the emulated device (bit for bit the CPU's), the bf16 path
//    (the fp32 op on the same values, each output rounded once), and the
//    preconditions' messages.
// f64 within 1e-12, f32 within 1e-5 (max abs error; inputs in [-1, 1)).
#include <catch2/catch.hpp>
#include <cstdio>
#include <limits>
#include <string>

#include "kernels/common/bf16.hpp"
#include "kernels/emulated/emulated_backend.hpp"
#include "tests/unit/attention_fixture.hpp"
#include "tests/unit/doc_starts.hpp"

using namespace adgt;
using namespace adgt::attn_test;
using Catch::Contains;

namespace {

template <class T>
std::vector<T> ninf(size_t n) {
  return std::vector<T>(n, -std::numeric_limits<T>::infinity());
}

// The whole causal attention built from blocks: the sequence cut into chunks
// of `sizes`; query chunk i against key chunks j <= i (causal on the
// diagonal, full before), merged; then the backward block by block with the
// final out and lse. from_ninf: every block is merged into (0, -inf);
// otherwise the diagonal block writes (out, lse) and the others are merged.
// docs (B*T, optional): each token's document start in the whole sequence,
// given to every block of its query chunk (q_doc_start, k_pos = the key
// chunk's first position).
template <class T>
Grads<T> by_blocks(Backend& be, const Problem<T>& p, const std::vector<int64_t>& sizes,
                   bool from_ninf, const std::vector<int32_t>* docs = nullptr) {
  const int64_t B = p.B, T_ = p.T, H = p.H, KV = p.KV, hd = p.hd, wq = H * hd, wk = KV * hd;
  std::vector<int64_t> at{0};
  for (int64_t n : sizes) at.push_back(at.back() + n);
  REQUIRE(at.back() == T_);
  Grads<T> g{std::vector<T>(p.q.size()), std::vector<T>(p.q.size()), std::vector<T>(p.k.size()),
             std::vector<T>(p.k.size())};
  Mem<T> m(be);
  Mem<int32_t> mi(be);
  const int n = int(sizes.size());
  std::vector<Tensor> k(n), v(n);
  for (int j = 0; j < n; ++j) {
    k[j] = m.put(rows_of(p.k, B, T_, wk, at[j], sizes[j]), {B, sizes[j], KV, hd});
    v[j] = m.put(rows_of(p.v, B, T_, wk, at[j], sizes[j]), {B, sizes[j], KV, hd});
  }
  for (int i = 0; i < n; ++i) {
    const int64_t L = sizes[i];
    const Tensor q = m.put(rows_of(p.q, B, T_, wq, at[i], L), {B, L, H, hd});
    const Tensor dout = m.put(rows_of(p.dout, B, T_, wq, at[i], L), {B, L, H, hd});
    const Tensor out = m.zeros({B, L, H, hd}), ob = m.zeros({B, L, H, hd}),
                 dq = m.zeros({B, L, H, hd});
    const Tensor lse = m.put(ninf<T>(size_t(B * H * L)), {B, H, L}), lb = m.zeros({B, H, L});
    const int32_t* qdoc = docs ? mi.put(rows_of(*docs, B, T_, 1, at[i], L), {B, L}).ptr<int32_t>()
                               : nullptr;
    auto block = [&](int j) {
      AttentionBlock b{B, L, sizes[j], H, KV, hd, j == i ? BlockMask::causal : BlockMask::full};
      b.q_doc_start = qdoc;
      b.k_pos = at[j];
      return b;
    };
    // Diagonal first, then the earlier chunks in descending order.
    std::vector<int> order{i};
    for (int j = i - 1; j >= 0; --j) order.push_back(j);
    for (int j : order) {
      const AttentionBlock b = block(j);
      if (j == i && !from_ninf) {
        be.attention_block_forward(out, lse, q, k[j], v[j], b);
        continue;
      }
      be.attention_block_forward(ob, lb, q, k[j], v[j], b);
      be.attention_merge(out, lse, ob, lb);
    }
    put_rows(g.out, m.get(out), B, T_, wq, at[i], L);
    for (size_t o = 0; o < order.size(); ++o) {
      const int j = order[o];
      const AttentionBlock b = block(j);
      const Tensor dk = m.zeros({B, sizes[j], KV, hd}), dv = m.zeros({B, sizes[j], KV, hd});
      be.attention_block_backward(dq, dk, dv, dout, q, k[j], v[j], out, lse, b, o > 0);
      put_rows(g.dk, m.get(dk), B, T_, wk, at[j], sizes[j], true);
      put_rows(g.dv, m.get(dv), B, T_, wk, at[j], sizes[j], true);
    }
    put_rows(g.dq, m.get(dq), B, T_, wq, at[i], L);
  }
  return g;
}

template <class T>
void expect_close(const Grads<T>& got, const Grads<T>& want, double tol, const std::string& what) {
  const double eo = max_abs_diff(got.out, want.out), eq = max_abs_diff(got.dq, want.dq);
  const double ek = max_abs_diff(got.dk, want.dk), ev = max_abs_diff(got.dv, want.dv);
  std::printf("attention blocks %s: max abs error out %.3g dq %.3g dk %.3g dv %.3g\n", what.c_str(),
              eo, eq, ek, ev);
  INFO(what);
  CHECK(eo <= tol);
  CHECK(eq <= tol);
  CHECK(ek <= tol);
  CHECK(ev <= tol);
}

template <class T>
void blocks_equal_whole(double tol, const char* ty) {
  CpuBackend be;
  // B = 2, T = 150 (three 64-row blocks, the last partial), grouped-query (H/KV = 2).
  const Problem<T> p(2, 150, 4, 2, 8, 11);
  const Grads<T> want = reference(p);
  const std::string t = ty;
  expect_close(by_blocks(be, p, {150}, false), want, tol, t + " one causal block");
  expect_close(by_blocks(be, p, {70, 80}, false), want, tol, t + " chunks 70+80");
  expect_close(by_blocks(be, p, {50, 37, 63}, true), want, tol, t + " chunks 50+37+63 from -inf");
}

template <class T>
void masked_blocks_equal_whole(double tol, const char* ty) {
  CpuBackend be;
  EmulatedBackend emu(size_t(1) << 30);
  const Problem<T> p(2, 150, 4, 2, 8, 12);
  // Documents across the chunks' edges (50, 87): one starting exactly at a
  // chunk's first row, one of a single token, and long ones spanning three
  // chunks; query rows whose document begins inside their own chunk see no
  // key of an earlier block (lse -inf there, skipped by the merge).
  const std::vector<int32_t> docs =
      test::doc_starts_of<int32_t>({{0, 20, 45, 60, 100, 140}, {0, 87, 88, 149}}, 150);
  const Grads<T> want = reference(p, &docs);
  const Grads<T> plain = reference(p);
  const std::string t = ty;
  // The mask matters: the masked attention is not the plain one.
  CHECK(max_abs_diff(want.out, plain.out) > 1e-2);
  expect_close(by_blocks(be, p, {150}, false, &docs), want, tol, t + " masked, one causal block");
  expect_close(by_blocks(be, p, {50, 37, 63}, false, &docs), want, tol, t + " masked, chunks 50+37+63");
  expect_close(by_blocks(be, p, {70, 80}, true, &docs), want, tol, t + " masked, chunks 70+80 from -inf");
  // The emulated device: the CPU's numbers bit for bit, the doc starts checked as device memory.
  const Grads<T> cpu = by_blocks(be, p, {50, 37, 63}, false, &docs);
  const Grads<T> dev = by_blocks(emu, p, {50, 37, 63}, false, &docs);
  CHECK(max_abs_diff(cpu.out, dev.out) == 0);
  CHECK(max_abs_diff(cpu.dq, dev.dq) == 0);
  CHECK(max_abs_diff(cpu.dk, dev.dk) == 0);
  CHECK(max_abs_diff(cpu.dv, dev.dv) == 0);
}

}  // namespace

TEST_CASE("attention blocks: document-masked blocks are the whole masked attention (f64, f32)",
          "[attention][cp]") {
  masked_blocks_equal_whole<double>(1e-12, "f64");
  masked_blocks_equal_whole<float>(1e-5, "f32");
}

TEST_CASE("attention blocks: a causal block and merged chunks are the whole attention (f64)",
          "[attention][cp]") {
  blocks_equal_whole<double>(1e-12, "f64");
}

TEST_CASE("attention blocks: a causal block and merged chunks are the whole attention (f32)",
          "[attention][cp]") {
  blocks_equal_whole<float>(1e-5, "f32");
}

TEST_CASE("attention blocks: lse is the log-sum-exp of each row's visible scores",
          "[attention][cp]") {
  CpuBackend be;
  const Problem<double> p(1, 9, 2, 1, 4, 5);
  std::vector<double> out(p.q.size()), lse(size_t(p.H * p.T));
  auto t = [](std::vector<double>& x) { return Tensor(x.data(), DType::F64, {int64_t(x.size())}); };
  std::vector<double> q = p.q, k = p.k, v = p.v;
  be.attention_block_forward(t(out), Tensor(lse.data(), DType::F64, {1, p.H, p.T}), t(q), t(k),
                             t(v), {1, p.T, p.T, p.H, p.KV, p.hd, BlockMask::causal});
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t i = 0; i < p.T; ++i) {
      double s = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < p.hd; ++d)
          dot += q[size_t((i * p.H + h) * p.hd + d)] * k[size_t(j * p.hd + d)];
        s += std::exp(dot / std::sqrt(double(p.hd)));
      }
      CHECK(std::abs(lse[size_t(h * p.T + i)] - std::log(s)) <= 1e-13);
    }
}

namespace {

// Query chunk q (B, Tq) against two key blocks, A (Tk = 7, full) and B (the
// diagonal, causal), merged: loss = sum(dout * out). f64 on the CPU backend.
struct TwoBlocks {
  int64_t B = 2, Tq = 5, TkA = 7, H = 4, KV = 2, hd = 4;
  std::vector<double> q, ka, va, kb, vb, dout;
  TwoBlocks() {
    Rng r(3);
    auto fill = [&](std::vector<double>& x, int64_t n) {
      x.resize(size_t(n));
      for (double& e : x) e = 2 * r.uniform() - 1;
    };
    fill(q, B * Tq * H * hd), fill(ka, B * TkA * KV * hd), fill(va, B * TkA * KV * hd);
    fill(kb, B * Tq * KV * hd), fill(vb, B * Tq * KV * hd), fill(dout, B * Tq * H * hd);
  }
  AttentionBlock a() const { return {B, Tq, TkA, H, KV, hd, BlockMask::full}; }
  AttentionBlock b() const { return {B, Tq, Tq, H, KV, hd, BlockMask::causal}; }
  static Tensor t(std::vector<double>& x) {
    return Tensor(x.data(), DType::F64, {int64_t(x.size())});
  }
  Tensor l(std::vector<double>& x) const { return Tensor(x.data(), DType::F64, {B, H, Tq}); }
  // out and lse of the merged blocks.
  void forward(CpuBackend& be, std::vector<double>& out, std::vector<double>& lse) {
    std::vector<double> ob(q.size()), lb(lse.size());
    be.attention_block_forward(t(out), l(lse), t(q), t(ka), t(va), a());
    be.attention_block_forward(t(ob), l(lb), t(q), t(kb), t(vb), b());
    be.attention_merge(t(out), l(lse), t(ob), l(lb));
  }
  double loss(CpuBackend& be) {
    std::vector<double> out(q.size()), lse(size_t(B * H * Tq));
    forward(be, out, lse);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += dout[i] * out[i];
    return s;
  }
};

}  // namespace

TEST_CASE("attention blocks: the backward through a merge matches finite differences (f64)",
          "[attention][cp]") {
  CpuBackend be;
  TwoBlocks p;
  std::vector<double> out(p.q.size()), lse(size_t(p.B * p.H * p.Tq));
  p.forward(be, out, lse);
  std::vector<double> dq(p.q.size()), dka(p.ka.size()), dva(p.va.size()), dkb(p.kb.size()),
      dvb(p.vb.size());
  using TB = TwoBlocks;
  be.attention_block_backward(TB::t(dq), TB::t(dka), TB::t(dva), TB::t(p.dout), TB::t(p.q),
                              TB::t(p.ka), TB::t(p.va), TB::t(out), p.l(lse), p.a(), false);
  be.attention_block_backward(TB::t(dq), TB::t(dkb), TB::t(dvb), TB::t(p.dout), TB::t(p.q),
                              TB::t(p.kb), TB::t(p.vb), TB::t(out), p.l(lse), p.b(), true);
  const double eps = 1e-5;
  double worst = 0;
  auto fd = [&](std::vector<double>& x, const std::vector<double>& an, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double up = p.loss(be);
      x[i] = x0 - eps;
      const double dn = p.loss(be);
      x[i] = x0;
      const double num = (up - dn) / (2 * eps), err = std::abs(num - an[i]);
      worst = std::max(worst, err);
      INFO(name << "[" << i << "]: finite difference " << num << ", backward " << an[i]);
      CHECK(err <= 1e-8);
    }
  };
  fd(p.q, dq, "dq");
  fd(p.ka, dka, "dk (full block)");
  fd(p.va, dva, "dv (full block)");
  fd(p.kb, dkb, "dk (causal block)");
  fd(p.vb, dvb, "dv (causal block)");
  std::printf("attention blocks f64: finite differences within %.3g\n", worst);
}

TEST_CASE("attention blocks: on the emulated device, the CPU's numbers bit for bit",
          "[attention][cp][emulated]") {
  EmulatedBackend emu(size_t(1) << 30);
  CpuBackend cpu;
  const Problem<double> p(2, 150, 4, 2, 8, 11);
  const Grads<double> e = by_blocks(emu, p, {50, 37, 63}, true),
                      c = by_blocks(cpu, p, {50, 37, 63}, true);
  CHECK(e.out == c.out);
  CHECK(e.dq == c.dq);
  CHECK(e.dk == c.dk);
  CHECK(e.dv == c.dv);
  expect_close(e, reference(p), 1e-12, "f64 emulated chunks 50+37+63");
  const Problem<float> pf(2, 150, 4, 2, 8, 12);
  expect_close(by_blocks(emu, pf, {70, 80}, false), reference(pf), 1e-5,
               "f32 emulated chunks 70+80");
  // Host tensors are refused, naming the op and the argument.
  std::vector<double> h(p.q.size()), l(size_t(2 * 4 * 150));
  Mem<double> m(emu);
  const Tensor q = m.put(p.q, {2, 150, 4, 8}), k = m.put(p.k, {2, 150, 2, 8}),
               v = m.put(p.v, {2, 150, 2, 8});
  CHECK_THROWS_WITH(emu.attention_block_forward(Tensor(h.data(), DType::F64, {2, 150, 4, 8}),
                                                Tensor(l.data(), DType::F64, {2, 4, 150}), q, k, v,
                                                {2, 150, 150, 4, 2, 8, BlockMask::causal}),
                    Contains("attention_block_forward's out") && Contains("host memory"));
}

TEST_CASE("attention blocks: bf16 is the fp32 op on the same values, each output rounded once",
          "[attention][cp][bf16]") {
  CpuBackend be;
  Problem<float> p(1, 70, 4, 2, 8, 21);
  auto round_all = [](std::vector<float>& x) {
    for (float& e : x) e = round_to_bf16(e);
  };
  round_all(p.q), round_all(p.k), round_all(p.v), round_all(p.dout);
  auto bf = [](const std::vector<float>& x) {
    std::vector<bf16_bits> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = float_to_bf16(x[i]);
    return r;
  };
  std::vector<bf16_bits> qb = bf(p.q), kb = bf(p.k), vb = bf(p.v), gb = bf(p.dout);
  const int64_t nq = int64_t(p.q.size()), nk = int64_t(p.k.size());
  const AttentionBlock b{1, 70, 70, 4, 2, 8, BlockMask::causal};
  auto tf = [](std::vector<float>& x) { return Tensor(x.data(), DType::F32, {int64_t(x.size())}); };
  auto tb = [](std::vector<bf16_bits>& x) {
    return Tensor(x.data(), DType::BF16, {int64_t(x.size())});
  };
  const size_t sq = size_t(nq), sk = size_t(nk), sl = 4 * 70;
  std::vector<float> of(sq), lf(sl), lb(sl), dqf(sq), dkf(sk), dvf(sk);
  std::vector<bf16_bits> ob(sq), dqb(sq), dkb(sk), dvb(sk);
  be.attention_block_forward(tf(of), tf(lf), tf(p.q), tf(p.k), tf(p.v), b);
  be.attention_block_forward(tb(ob), tf(lb), tb(qb), tb(kb), tb(vb), b);
  CHECK(lb == lf);
  CHECK(ob == bf(of));
  // The backward reads out as given: the bf16 out, rounded, in both.
  for (size_t i = 0; i < of.size(); ++i) of[i] = bf16_to_float(ob[i]);
  be.attention_block_backward(tf(dqf), tf(dkf), tf(dvf), tf(p.dout), tf(p.q), tf(p.k), tf(p.v),
                              tf(of), tf(lf), b, false);
  be.attention_block_backward(tb(dqb), tb(dkb), tb(dvb), tb(gb), tb(qb), tb(kb), tb(vb), tb(ob),
                              tf(lb), b, false);
  CHECK(dqb == bf(dqf));
  CHECK(dkb == bf(dkf));
  CHECK(dvb == bf(dvf));
}

TEST_CASE("attention blocks: preconditions name the setting", "[attention][cp]") {
  CpuBackend be;
  std::vector<double> q(2 * 6 * 4 * 4), k(2 * 6 * 2 * 4), out(q.size()), lse(2 * 4 * 6);
  std::vector<float> lse32(lse.size());
  auto t = [](auto& x, DType d) { return Tensor(x.data(), d, {int64_t(x.size())}); };
  const AttentionBlock bad_causal{2, 6, 4, 4, 2, 4, BlockMask::causal};
  CHECK_THROWS_WITH(
      be.attention_block_forward(t(out, DType::F64), t(lse, DType::F64), t(q, DType::F64),
                                 t(k, DType::F64), t(k, DType::F64), bad_causal),
      Contains("a causal block is the diagonal one: Tq=6 must equal Tk=4"));
  const AttentionBlock b{2, 6, 6, 4, 2, 4, BlockMask::full};
  CHECK_THROWS_WITH(
      be.attention_block_forward(t(out, DType::F64), t(lse32, DType::F32), t(q, DType::F64),
                                 t(k, DType::F64), t(k, DType::F64), b),
      Contains("lse") && Contains("f64"));
  CHECK_THROWS_WITH(be.attention_merge(t(out, DType::F64), t(lse, DType::F64), t(out, DType::F64),
                                       t(lse, DType::F64)),
                    Contains("lse(48) must be (B,H,Tq)"));
}
