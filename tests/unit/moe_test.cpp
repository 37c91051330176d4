// The mixture-of-experts block (core/model/moe.hpp) on one rank, f64 CPU backend:
// forward against a naive implementation of the definition (router softmax,
// top-k with ties to the lower id, renormalised weights, SwiGLU experts,
// capacity drops, aux loss), every gradient against central finite
// differences of L = sum(out * R) + coef * scale * aux, hand-made capacity
// cases, the placement table's errors and the aux-loss-free bias.
#include "core/model/moe.hpp"

#include <omp.h>
#include <time.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "core/config.hpp"
#include "core/model/model.hpp"
#include "core/model/moe_replicas.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/emulated_backend.hpp"

using namespace adgt;

namespace {

using Vec = std::vector<double>;

Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  Vec v(n);
  for (auto& x : v) x = scale * r.normal();
  return v;
}
Tensor T2(double* p, int64_t r, int64_t c) { return Tensor(p, DType::F64, {r, c}); }
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// All E experts' weights, stacked: w1, w3 (E, F, C), w2 (E, C, F); gate (E, C).
struct Weights {
  int64_t E, C, F;
  Vec gate, w1, w2, w3;
  Weights(int64_t e, int64_t c, int64_t f, uint64_t seed)
      : E(e),
        C(c),
        F(f),
        gate(randn(E * C, seed, 0.8)),
        w1(randn(E * F * C, seed + 1, 0.5)),
        w2(randn(E * C * F, seed + 2, 0.5)),
        w3(randn(E * F * C, seed + 3, 0.5)) {}
  MoeParams view() {
    MoeParams p;
    p.gate = T2(gate.data(), E, C);
    for (int64_t e = 0; e < E; ++e) {
      p.w1.push_back(T2(w1.data() + e * F * C, F, C));
      p.w3.push_back(T2(w3.data() + e * F * C, F, C));
      p.w2.push_back(T2(w2.data() + e * C * F, C, F));
    }
    return p;
  }
  void zero() {
    for (Vec* v : {&gate, &w1, &w2, &w3}) std::fill(v->begin(), v->end(), 0.0);
  }
};

struct Naive {
  Vec out;
  double aux = 0;
  std::vector<int64_t> load;
  int64_t dropped = 0;
};

// Straight from the definition in core/model/moe.hpp.
Naive naive_moe(const Vec& x, int64_t N, Weights& w, const MoeOptions& o, const Vec& bias = {}) {
  const int64_t E = w.E, C = w.C, F = w.F, k = o.top_k;
  Naive r;
  r.out.assign(size_t(N * C), 0.0);
  r.load.assign(size_t(E), 0);
  Vec psum(size_t(E), 0.0);
  const int64_t seg = o.capacity_segment > 0 ? o.capacity_segment : N;
  std::vector<int64_t> used(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < N; ++t) {
    if (t % seg == 0) std::fill(used.begin(), used.end(), 0);
    const int64_t rows = std::min(seg, N - t / seg * seg);
    const double cap =
        o.capacity_factor > 0 ? std::ceil(o.capacity_factor * double(rows * k) / double(E)) : 1e300;
    Vec p(static_cast<size_t>(E));
    double z = 0;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t c = 0; c < C; ++c) l += x[size_t(t * C + c)] * w.gate[size_t(e * C + c)];
      p[size_t(e)] = std::exp(l);
      z += p[size_t(e)];
    }
    for (auto& v : p) v /= z;
    for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += p[size_t(e)];
    std::vector<int64_t> chosen;
    std::vector<char> taken(static_cast<size_t>(E), 0);
    double S = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        const double sc = p[size_t(e)] + (bias.empty() ? 0.0 : bias[size_t(e)]);
        const double bs =
            best < 0 ? 0 : p[size_t(best)] + (bias.empty() ? 0.0 : bias[size_t(best)]);
        if (!taken[size_t(e)] && (best < 0 || sc > bs)) best = e;
      }
      taken[size_t(best)] = 1;
      chosen.push_back(best);
      S += p[size_t(best)];
      ++r.load[size_t(best)];
    }
    for (int64_t e : chosen) {
      if (double(used[size_t(e)]) >= cap) {
        ++r.dropped;
        continue;
      }
      ++used[size_t(e)];
      const double wt = p[size_t(e)] / S;
      Vec h(static_cast<size_t>(F));
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < C; ++c) {
          g += w.w1[size_t((e * F + f) * C + c)] * x[size_t(t * C + c)];
          u += w.w3[size_t((e * F + f) * C + c)] * x[size_t(t * C + c)];
        }
        h[size_t(f)] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < C; ++c) {
        double y = 0;
        for (int64_t f = 0; f < F; ++f) y += w.w2[size_t((e * C + c) * F + f)] * h[size_t(f)];
        r.out[size_t(t * C + c)] += wt * y;
      }
    }
  }
  for (int64_t e = 0; e < E; ++e)
    r.aux +=
        double(E) * (double(r.load[size_t(e)]) / double(N * k)) * (psum[size_t(e)] / double(N));
  return r;
}

void check_grad(Vec& x, const std::function<double()>& loss, const Vec& analytic, const char* what,
                double h = 1e-6, double tol = 1e-6) {
  REQUIRE(analytic.size() == x.size());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + h;
    const double lp = loss();
    x[i] = old - h;
    const double lm = loss();
    x[i] = old;
    const double num = (lp - lm) / (2 * h);
    max_err = std::max(max_err, std::abs(num - analytic[i]));
    max_ref = std::max(max_ref, std::abs(num));
  }
  INFO(what << ": max |numeric - analytic| = " << max_err << ", max |numeric| = " << max_ref);
  CHECK(max_err <= tol * std::max(1.0, max_ref));
  CHECK(max_ref > 0);
}

void fd_case(const MoeOptions& o, int64_t N, uint64_t seed) {
  CpuBackend be;
  const int64_t C = 5, F = 4, E = o.n_experts;
  const double scale = 0.7;
  Weights w(E, C, F, seed);
  Vec x = randn(size_t(N * C), seed + 10), R = randn(size_t(N * C), seed + 11), out(size_t(N * C));
  MoeLayer moe(be, DType::F64, N, C, F, o);
  const int slot = moe.add_slot();
  auto loss = [&] {
    const double aux = moe.forward(slot, T2(out.data(), N, C), T2(x.data(), N, C), w.view());
    return dot(out, R) + o.aux_loss_coef * scale * aux;
  };
  loss();
  const Naive ref = naive_moe(x, N, w, o);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(ref.out[i]).margin(1e-12));
  const MoeStats& st = moe.last_stats();
  CHECK(moe.last_stats().aux_loss == Approx(ref.aux).epsilon(1e-12));
  CHECK(st.load == ref.load);
  CHECK(st.dropped == ref.dropped);
  CHECK(st.tokens == N);
  if (o.capacity_factor > 0) CHECK(st.dropped > 0);  // the case must exercise drops

  Weights g(E, C, F, 0);
  g.zero();
  Vec dx(size_t(N * C), 0.25);  // dx accumulates: start non-zero
  moe.backward(slot, T2(dx.data(), N, C), w.view(), g.view(), T2(R.data(), N, C), scale);
  for (auto& v : dx) v -= 0.25;
  check_grad(x, loss, dx, "moe dx");
  check_grad(w.gate, loss, g.gate, "moe dWg");
  check_grad(w.w1, loss, g.w1, "moe dw1");
  check_grad(w.w2, loss, g.w2, "moe dw2");
  check_grad(w.w3, loss, g.w3, "moe dw3");
}

}  // namespace

TEST_CASE("moe: forward matches the definition, gradients match finite differences", "[moe][fd][slow]") {
  MoeOptions o;
  o.n_experts = 4;
  o.top_k = 2;
  o.aux_loss_coef = 0.3;
  SECTION("dropless, top-2") { fd_case(o, 7, 100); }
  SECTION("top-1 (router gradient through the aux loss only)") {
    o.top_k = 1;
    fd_case(o, 6, 200);
  }
  SECTION("top-3 of 5, no aux loss") {
    o.n_experts = 5, o.top_k = 3, o.aux_loss_coef = 0;
    fd_case(o, 6, 300);
  }
  SECTION("capacity drops, two capacity groups") {
    o.capacity_factor = 0.5;
    o.capacity_segment = 4;
    fd_case(o, 8, 400);
  }
}

TEST_CASE("moe: capacity drops in token order, counted, weights not renormalised", "[moe]") {
  CpuBackend be;
  const int64_t N = 4, C = 2, F = 3, E = 2;
  // Every token prefers expert 0 (logits x . gate = [1, 0]).
  Weights w(E, C, F, 7);
  w.gate = {1, 0, 0, 0};
  Vec x = {1, 0, 1, 0, 1, 0, 1, 0}, out(size_t(N * C));
  for (int64_t seg : {int64_t(0), int64_t(2)}) {
    MoeOptions o;
    o.n_experts = E, o.top_k = 1, o.capacity_factor = 1.0, o.capacity_segment = seg;
    MoeLayer moe(be, DType::F64, N, C, F, o);
    moe.add_slot();
    moe.forward(0, T2(out.data(), N, C), T2(x.data(), N, C), w.view());
    // cap = ceil(1 * rows * 1 / 2): 2 of 4 rows (tokens 0, 1 kept) or 1 per group of 2 (0, 2 kept).
    const Naive ref = naive_moe(x, N, w, o);
    const std::vector<int> kept = seg ? std::vector<int>{0, 2} : std::vector<int>{0, 1};
    CHECK(moe.last_stats().dropped == 2);
    CHECK(moe.last_stats().dropped_local == 2);
    CHECK(moe.last_stats().load == std::vector<int64_t>{4, 0});
    CHECK(moe.last_stats().imbalance == Approx(2.0));
    for (int64_t t = 0; t < N; ++t) {
      const bool k = std::find(kept.begin(), kept.end(), int(t)) != kept.end();
      for (int64_t c = 0; c < C; ++c) {
        CHECK(out[size_t(t * C + c)] == Approx(ref.out[size_t(t * C + c)]).margin(1e-14));
        if (!k) CHECK(out[size_t(t * C + c)] == 0.0);
        if (k) CHECK(out[size_t(t * C + c)] != 0.0);
      }
    }
  }
  // Top-2 of 3, capacity ceil(0.5 * 3 * 2 / 3) = 1 per expert. Choices:
  // token 0 {0, 1}, token 1 {1, 0}, token 2 {0, 2}. Token 0 keeps both, token 1
  // loses both (outputs 0), token 2 loses expert 0 and keeps expert 2 with
  // weight p_2 / (p_0 + p_2): not renormalised to 1.
  {
    MoeOptions o;
    o.n_experts = 3, o.top_k = 2, o.capacity_factor = 0.5;
    Weights w3(3, C, F, 8);
    w3.gate = {1, 0, 0, 1, 0, 0};
    Vec x3 = {1, 0.5, 0.5, 1, 1, -1}, out3(6);
    MoeLayer moe(be, DType::F64, 3, C, F, o);
    moe.add_slot();
    moe.forward(0, T2(out3.data(), 3, C), T2(x3.data(), 3, C), w3.view());
    const Naive ref = naive_moe(x3, 3, w3, o);
    CHECK(moe.last_stats().dropped == 3);
    CHECK(ref.dropped == 3);
    CHECK(moe.last_stats().load == std::vector<int64_t>{3, 2, 1});
    for (size_t i = 0; i < 6; ++i) CHECK(out3[i] == Approx(ref.out[i]).margin(1e-14));
    CHECK(out3[2] == 0.0);
    CHECK(out3[3] == 0.0);
    // Token 2 alone, dropless: expert 2's share is renormalised over {0, 2}; the
    // dropped run keeps exactly that share of expert 2's output.
    MoeOptions od = o;
    od.capacity_factor = 0;
    Weights only2 = w3;  // zero expert 0's output so the dropless output is expert 2's share
    std::fill(only2.w2.begin(), only2.w2.begin() + C * F, 0.0);
    const Naive ref2 = naive_moe(Vec{1, -1}, 1, only2, od);
    CHECK(out3[4] == Approx(ref2.out[0]).epsilon(1e-12));
    CHECK(out3[5] == Approx(ref2.out[1]).epsilon(1e-12));
  }
}

TEST_CASE("moe: expert placement tables are validated with named errors", "[moe]") {
  using Catch::Matchers::Contains;
  CHECK(ExpertPlacement(4, 2, {}).table() == std::vector<int>{0, 0, 1, 1});
  const ExpertPlacement p(4, 2, {1, 0, 0, 1});
  CHECK(p.local_experts(0) == std::vector<int64_t>{1, 2});
  CHECK(p.local_experts(1) == std::vector<int64_t>{0, 3});
  CHECK(p.local_index(3) == 1);
  CHECK_THROWS_WITH(ExpertPlacement(4, 2, {0, 0, 0, 1}),
                    Contains("gives ep rank 0 3 experts; every rank needs n_experts/ep = 2"));
  CHECK_THROWS_WITH(ExpertPlacement(4, 2, {0, 1, 2, 0}),
                    Contains("puts expert 2 on rank 2, outside the ep group [0, 2)"));
  CHECK_THROWS_WITH(ExpertPlacement(4, 2, {0, 1, 0}),
                    Contains("has 3 entries; it needs one per expert (4)"));
  CHECK_THROWS_WITH(ExpertPlacement(6, 4, {}), Contains("ep=4 does not divide n_experts=6"));
  CpuBackend be;
  MoeOptions o;
  o.n_experts = 4, o.top_k = 5;
  CHECK_THROWS_WITH(MoeLayer(be, DType::F64, 8, 4, 4, o),
                    Contains("top_k=5 must be in [1, n_experts=4]"));
  o.top_k = 2;
  MoeLayer moe(be, DType::F64, 8, 4, 4, o);
  moe.add_slot();
  Weights w(4, 4, 4, 1);
  MoeParams bad = w.view();
  bad.w2.pop_back();
  Vec x(8 * 4), out(8 * 4);
  CHECK_THROWS_WITH(moe.forward(0, T2(out.data(), 8, 4), T2(x.data(), 8, 4), bad),
                    Contains("holds 4/3/4 w1/w2/w3 tensors; this ep rank holds 4 experts"));
  bad = w.view();
  bad.w2[1] = T2(w.w2.data(), 4, 3);
  CHECK_THROWS_WITH(moe.forward(0, T2(out.data(), 8, 4), T2(x.data(), 8, 4), bad),
                    Contains("w2[1](4,3) f64, expected (4,4) f64"));
  Vec x9(9 * 4), out9(9 * 4);
  CHECK_THROWS_WITH(moe.forward(0, T2(out9.data(), 9, 4), T2(x9.data(), 9, 4), w.view()),
                    Contains("9 token rows exceed max_tokens=8"));
  Vec dx(8 * 4);
  CHECK_THROWS_WITH(
      moe.backward(0, T2(dx.data(), 8, 4), w.view(), w.view(), T2(dx.data(), 8, 4), 1),
      Contains("backward of slot 0, which holds no forward"));
}

TEST_CASE("moe: aux-loss-free bias steers selection, not weights, and follows the load", "[moe]") {
  CpuBackend be;
  const int64_t N = 5, C = 4, F = 3, E = 4;
  MoeOptions o;
  o.n_experts = E, o.top_k = 2, o.aux_free = true, o.bias_rate = 0.25;
  MoeLayer moe(be, DType::F64, N, C, F, o);
  moe.add_slot();
  CHECK(moe.bias() == Vec(4, 0.0));
  moe.update_bias({10, 2, 6, 6});  // mean 6
  CHECK(moe.bias() == Vec{-0.25, 0.25, 0.0, 0.0});
  moe.update_bias({1, 1, 1, 1});
  CHECK(moe.bias() == Vec{-0.25, 0.25, 0.0, 0.0});
  CHECK_THROWS(moe.update_bias({1, 2}));
  // A large bias on expert 3 puts it in every token's choice; weights stay probs / sum.
  const Vec bias = {0.0, 0.0, 0.0, 5.0};
  moe.set_bias(bias);
  Weights w(E, C, F, 55);
  Vec x = randn(size_t(N * C), 56), out(size_t(N * C));
  moe.forward(0, T2(out.data(), N, C), T2(x.data(), N, C), w.view());
  const Naive ref = naive_moe(x, N, w, o, bias);
  CHECK(moe.last_stats().load[3] == N);
  CHECK(ref.load[3] == N);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == Approx(ref.out[i]).margin(1e-12));
  // Without the bias the selection differs (so the case means something).
  const Naive plain = naive_moe(x, N, w, o);
  CHECK(plain.load[3] < N);
}

TEST_CASE("moe: slots keep micro-batches apart", "[moe]") {
  CpuBackend be;
  const int64_t N = 6, C = 4, F = 3, E = 4;
  MoeOptions o;
  o.n_experts = E, o.top_k = 2;
  Weights w(E, C, F, 77);
  Vec xa = randn(size_t(N * C), 78), xb = randn(size_t(4 * C), 79), Ra = randn(size_t(N * C), 80),
      Rb = randn(size_t(4 * C), 81);
  auto run = [&](bool interleave) {
    MoeLayer moe(be, DType::F64, N, C, F, o);
    moe.add_slot();
    moe.add_slot();
    Weights g(E, C, F, 0);
    g.zero();
    Vec oa(xa.size()), ob(xb.size()), da(xa.size(), 0.0), db(xb.size(), 0.0);
    auto fa = [&] { moe.forward(0, T2(oa.data(), N, C), T2(xa.data(), N, C), w.view()); };
    auto fb = [&] { moe.forward(1, T2(ob.data(), 4, C), T2(xb.data(), 4, C), w.view()); };
    auto ba = [&] {
      moe.backward(0, T2(da.data(), N, C), w.view(), g.view(), T2(Ra.data(), N, C), 1);
    };
    auto bb = [&] {
      moe.backward(1, T2(db.data(), 4, C), w.view(), g.view(), T2(Rb.data(), 4, C), 1);
    };
    if (interleave) {
      fa(), fb(), bb(), ba();
    } else {
      fb(), bb(), fa(), ba();
    }
    Vec all = da;
    for (Vec* v : {&db, &oa, &ob, &g.gate, &g.w1, &g.w2, &g.w3})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const Vec a = run(false), b = run(true);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-13));
}

TEST_CASE("moe: combine_rows and its backward (f64 finite differences, f32 agrees)",
          "[moe][ops][fd]") {
  CpuBackend be;
  const int64_t N = 4, k = 2, M = 6, C = 3;
  std::vector<int32_t> pos = {0, 5, -1, 2, 4, -1, 1, 3};  // every row of y once, two dropped
  Tensor pt(pos.data(), DType::I32, {N, k});
  Vec y = randn(size_t(M * C), 90), w = randn(size_t(N * k), 91), R = randn(size_t(N * C), 92),
      out(size_t(N * C));
  auto loss = [&] {
    be.combine_rows(T2(out.data(), N, C), T2(y.data(), M, C), pt, T2(w.data(), N, k), false);
    return dot(out, R);
  };
  loss();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j)
        if (pos[size_t(t * k + j)] >= 0)
          ref += w[size_t(t * k + j)] * y[size_t(pos[size_t(t * k + j)] * C + c)];
      CHECK(out[size_t(t * C + c)] == Approx(ref).margin(1e-14));
    }
  Vec dy(y.size(), 9.0), dw(w.size(), 9.0);
  be.combine_rows_backward(T2(dy.data(), M, C), T2(dw.data(), N, k), T2(R.data(), N, C),
                           T2(y.data(), M, C), pt, T2(w.data(), N, k));
  CHECK(dw[2] == 0.0);  // pos -1: zero weight gradient
  check_grad(y, loss, dy, "combine_rows dy");
  check_grad(w, loss, dw, "combine_rows dw");
  // Weights omitted = 1, accumulate adds; f32 gives the same within rounding.
  Vec acc(out.size(), 1.0);
  be.combine_rows(T2(acc.data(), N, C), T2(y.data(), M, C), pt, Tensor(), true);
  std::vector<float> yf(y.begin(), y.end()), wf(w.begin(), w.end()), of(out.size());
  be.combine_rows(Tensor(of.data(), DType::F32, {N, C}), Tensor(yf.data(), DType::F32, {M, C}), pt,
                  Tensor(wf.data(), DType::F32, {N, k}), false);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double ref = 1.0;
      for (int64_t j = 0; j < k; ++j)
        if (pos[size_t(t * k + j)] >= 0) ref += y[size_t(pos[size_t(t * k + j)] * C + c)];
      CHECK(acc[size_t(t * C + c)] == Approx(ref).margin(1e-14));
      CHECK(of[size_t(t * C + c)] == Approx(out[size_t(t * C + c)]).margin(1e-5));
    }
  std::vector<int32_t> bad = {0, 6, 1, 2, 3, 4, 5, -1};
  CHECK_THROWS_WITH(
      be.combine_rows(T2(out.data(), N, C), T2(y.data(), M, C),
                      Tensor(bad.data(), DType::I32, {N, k}), T2(w.data(), N, k), false),
      Catch::Matchers::Contains("pos[1] = 6 outside y(6,3)"));
}

TEST_CASE("moe replicas: validation, text and the split rule", "[moe]") {
  const ExpertPlacement pl = ExpertPlacement::contiguous(8, 4);  // rank r: experts 2r, 2r+1
  const std::string text = "0:0=0.5,1=0.25,3=0.25;7:3=0.4,2=0.6";
  const ExpertReplicas r = ExpertReplicas::parse(pl, text, 3);
  CHECK(r.any());
  CHECK(r.describe() == text);
  CHECK(r.holders(0) == std::vector<int>{0, 1, 3});
  CHECK(r.holders(3) == std::vector<int>{1});
  // Shadows by (owner, expert).
  CHECK(r.shadows(1) == std::vector<int64_t>{0});
  CHECK(r.shadows(3) == std::vector<int64_t>{0});
  CHECK(r.shadows(2) == std::vector<int64_t>{7});
  CHECK(r.shadows(0).empty());
  // The split covers 0..n once, in holder order, close to the shares.
  for (int64_t n : {0, 1, 2, 3, 7, 100, 1001}) {
    int64_t at = 0;
    for (size_t j = 0; j < 3; ++j) {
      int64_t b = 0, e = 0;
      r.split(0, j, n, b, e);
      CHECK(b == at);
      CHECK(e >= b);
      CHECK(std::abs(double(e - b) - n * r.shares(0)[j]) <= 1.0);
      at = e;
    }
    CHECK(at == n);
  }
  CHECK(ExpertReplicas::parse(pl, "", 2).any() == false);
  auto refused = [&](const std::string& t, const std::string& why, int slots = 3) {
    INFO(t);
    CHECK_THROWS_WITH(ExpertReplicas::parse(pl, t, slots), Catch::Contains(why));
  };
  refused("0:1=1", "first holder is ep rank 1, not its owner 0");
  refused("0:0=0.5,0=0.5", "lists ep rank 0 twice");
  refused("0:0=0.5,4=0.5", "outside [0, 4)");
  refused("0:0=0.5,1=0.4", "sum to 0.9");
  refused("0:0=1.5,1=-0.5", "shares must be >= 0");
  refused("0:0=0.5,1=0.5;2:1=0.5,0=0.5", "more than parallel.expert_slots=2", 2);
  refused("x:0=1", "does not start with an expert id");
  refused("9:0=1", "names no expert");
  refused("0:0", "without '=share'");
  refused("0:0=a", "malformed holder");
  refused("0;1", "has no ':'");
}

TEST_CASE("moe: model.moe_bias_init_zipf's selection bias makes first choices Zipf(s) under Gumbel noise",
          "[moe][config]") {
  // The formula's premise, checked by Monte Carlo: a probability deviating
  // from 1/E by Gumbel noise of scale beta, plus the bias, is argmax'd; the
  // first choices then fall on expert e with probability (e+1)^-s / H(E, s).
  const int64_t E = 64, C = 48;
  const double std0 = 0.02, s = 1.2;
  const std::vector<double> b = zipf_selection_bias(E, C, std0, s);
  REQUIRE(int64_t(b.size()) == E);
  const double pi = 3.14159265358979323846;
  const double beta = std0 * std::sqrt(double(C)) * std::sqrt(6.0) / (pi * double(E));
  CHECK(b[0] == 0.0);
  CHECK(b[9] == Approx(-s * beta * std::log(10.0)));
  for (int64_t e = 1; e < E; ++e) CHECK(b[size_t(e)] < b[size_t(e - 1)]);
  Rng rng(5);
  const int n = 200000;
  std::vector<double> count(size_t(E), 0.0);
  for (int i = 0; i < n; ++i) {
    int64_t best = 0;
    double top = -1e300;
    for (int64_t e = 0; e < E; ++e) {
      const double u = (double(rng.next() >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
      const double v = 1.0 / double(E) - beta * std::log(-std::log(u)) + b[size_t(e)];
      if (v > top) top = v, best = e;
    }
    count[size_t(best)] += 1;
  }
  double h = 0;
  for (int64_t e = 0; e < E; ++e) h += std::pow(double(e + 1), -s);
  for (int64_t e : {0, 1, 3, 15}) {
    INFO("expert " << e);
    CHECK(count[size_t(e)] / n == Approx(std::pow(double(e + 1), -s) / h).epsilon(0.05));
  }
  // The least-squares exponent over log-log counts.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int k = 0;
  for (int64_t e = 0; e < 32; ++e) {
    const double x = std::log(double(e + 1)), y = std::log(count[size_t(e)] / n);
    sx += x, sy += y, sxx += x * x, sxy += x * y, ++k;
  }
  const double slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
  CHECK(-slope == Approx(s).margin(0.05));
  CHECK(zipf_selection_bias(E, C, std0, 0.0) == std::vector<double>(size_t(E), 0.0));
}

TEST_CASE("moe: model.moe_bias_init_zipf sets every MoE layer's initial selection bias; its rules",
          "[moe][config]") {
  RunConfig cfg = load_config_text(
      "model:\n  vocab_size: 64\n  d_model: 32\n  n_layers: 2\n  n_heads: 2\n  n_kv_heads: 2\n"
      "  ffn_hidden: 32\n  seq_len: 8\n  n_experts: 8\n  moe_top_k: 2\n  moe_aux_free: true\n"
      "  moe_bias_rate: 0\n  moe_bias_init_zipf: 1.2\n",
      "zipf.yaml");
  CpuBackend be;
  Model model(cfg.model, be, DType::F32, 2, 8);
  const std::vector<double> b = zipf_selection_bias(8, 32, cfg.model.init_std, 1.2);
  const std::vector<double> t = model.moe_bias_table();
  REQUIRE(t.size() == 16);
  for (int l = 0; l < 2; ++l)
    CHECK(std::vector<double>(t.begin() + l * 8, t.begin() + (l + 1) * 8) == b);
  CHECK_THROWS_WITH(load_config_text("model:\n  n_experts: 8\n  moe_bias_init_zipf: 1.2\n", "a.yaml"),
                    Catch::Contains("model.moe_bias_init_zipf=1.2") &&
                        Catch::Contains("set model.moe_aux_free: true"));
  CHECK_THROWS_WITH(load_config_text("model:\n  moe_bias_init_zipf: 1.2\n", "b.yaml"),
                    Catch::Contains("model.moe_bias_init_zipf is set but model.n_experts=0"));
}

namespace {

// The calling thread's CPU seconds (an independent reading of the clock the
// CPU backends' spans use).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// omp_set_num_threads(n) for a scope.
struct OmpThreads {
  int was = omp_get_max_threads();
  explicit OmpThreads(int n) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(was); }
};

}  // namespace

TEST_CASE("backend spans: the thread's CPU time of a span, read after it; named errors", "[moe]") {
  OmpThreads one(1);
  for (int emulated = 0; emulated < 2; ++emulated) {
    std::unique_ptr<Backend> be;
    if (emulated)
      be = std::make_unique<EmulatedBackend>(size_t(1) << 24);
    else
      be = std::make_unique<CpuBackend>();
    INFO(be->name());
    // A busy span of ~30 ms and an empty one inside it.
    const double t0 = thread_cpu_s();
    const int outer = be->span_begin();
    const int inner = be->span_begin();
    be->span_end(inner);
    volatile double sink = 0;
    while (thread_cpu_s() - t0 < 0.03) sink = sink + 1;
    CHECK_THROWS_WITH(be->span_seconds(outer), Catch::Matchers::Contains("no such closed span"));
    be->span_end(outer);
    const double t1 = thread_cpu_s();
    CHECK_THROWS_WITH(be->span_end(outer), Catch::Matchers::Contains("no such open span"));
    CHECK(outer == 0);
    CHECK(inner == 1);
    const double s_outer = be->span_seconds(outer), s_inner = be->span_seconds(inner);
    CHECK(s_outer >= 0.03);
    CHECK(s_outer <= t1 - t0);
    CHECK(s_inner >= 0);
    CHECK(s_inner < 0.005);
    CHECK(be->span_seconds(-1) == -1);
    be->span_end(-1);  // not measured: nothing to close
    be->clear_spans();
    CHECK_THROWS_WITH(be->span_seconds(outer), Catch::Matchers::Contains("no such closed span"));
    CHECK(be->span_begin() == 0);  // ids start again
  }
  OmpThreads two(2);  // the kernels' other threads are not this thread's clock
  CpuBackend be;
  CHECK(be.span_begin() == -1);
}

TEST_CASE("moe: the model's expert and dense times from backend spans, on the CPU and the emulated device",
          "[moe]") {
  ModelConfig m;
  m.vocab_size = 13;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 64;
  m.seq_len = 16;
  m.init_std = 0.3;
  m.n_experts = 4;
  m.moe_top_k = 2;
  m.moe_every = 2;  // layer 1: experts
  const int64_t B = 4, T = 16;
  std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
  Rng r(3);
  for (auto& x : in) x = int32_t(r.next() % uint64_t(m.vocab_size));
  for (auto& x : tg) x = int32_t(r.next() % uint64_t(m.vocab_size));
  for (int emulated = 0; emulated < 2; ++emulated) {
    OmpThreads one(1);
    std::unique_ptr<Backend> be;
    if (emulated)
      be = std::make_unique<EmulatedBackend>(size_t(1) << 26);
    else
      be = std::make_unique<CpuBackend>();
    INFO(be->name());
    Model model(m, *be, DType::F32, B, T);
    model.init_weights(5);
    model.reset_moe_stats();
    REQUIRE(model.moe_times().size() == 1);
    CHECK(model.moe_times()[0].expert_s == 0);  // nothing ran yet
    // Two micro-batches' forward and backward, timed around them on the
    // thread's own clock: the layer's parts lie inside it.
    const double t0 = thread_cpu_s();
    for (int mb = 0; mb < 2; ++mb) {
      model.forward(in.data(), tg.data(), 1.0);
      model.backward();
    }
    const double total = thread_cpu_s() - t0;
    const MoeLayerTimes t = model.moe_times()[0];
    CHECK(t.expert_s > 0);
    CHECK(t.dense_s > 0);
    CHECK(t.expert_s + t.dense_s <= total);
    CHECK(model.moe_stats()[0].expert_rows > 0);
    model.reset_moe_stats();
    CHECK(model.moe_times()[0].expert_s == 0);
    CHECK(model.moe_times()[0].dense_s == 0);
  }
  // Several threads per rank: not measured.
  OmpThreads two(2);
  CpuBackend be;
  Model model(m, be, DType::F32, B, T);
  model.init_weights(5);
  model.reset_moe_stats();
  model.forward(in.data(), tg.data(), 1.0);
  model.backward();
  CHECK(model.moe_times()[0].expert_s == -1);
  CHECK(model.moe_times()[0].dense_s == -1);
}
