// Every op's backward against central finite differences, in double precision
// on the CPU backend. For an op y = f(x), the test scalar is L = sum(y * R) for
// a fixed random R; the analytic gradient comes from the op's backward with
// dy = R, the numeric one from (L(x+h) - L(x-h)) / 2h.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;

namespace {

using Vec = std::vector<double>;

Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  Vec v(n);
  for (auto& x : v) x = scale * r.normal();
  return v;
}
Tensor T2(Vec& v, int64_t r, int64_t c) { return Tensor(v.data(), DType::F64, {r, c}); }
Tensor T1(Vec& v) { return Tensor(v.data(), DType::F64, {int64_t(v.size())}); }
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks d(loss)/d(x) == analytic for every element of x.
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
  CHECK(max_ref > 0);  // the check must see a non-trivial gradient
}

}  // namespace

TEST_CASE("linear backward matches finite differences", "[ops][fd]") {
  CpuBackend be;
  const int64_t N = 5, I = 7, O = 4;
  Vec x = randn(N * I, 1), w = randn(O * I, 2), R = randn(N * O, 3), y(N * O);
  auto loss = [&] {
    be.linear_forward(T2(y, N, O), T2(x, N, I), T2(w, O, I));
    return dot(y, R);
  };
  Vec dx(N * I, 0.5), dw(O * I, 0.0);  // dx starts non-zero: accumulate=false must overwrite
  be.linear_backward(T2(dx, N, I), T2(dw, O, I), T2(R, N, O), T2(x, N, I), T2(w, O, I), false);
  check_grad(x, loss, dx, "linear dx");
  check_grad(w, loss, dw, "linear dw");
  // accumulate=true adds.
  Vec dx2 = dx, dw2(O * I, 0.0);
  be.linear_backward(T2(dx2, N, I), T2(dw2, O, I), T2(R, N, O), T2(x, N, I), T2(w, O, I), true);
  for (size_t i = 0; i < dx.size(); ++i) REQUIRE(dx2[i] == Approx(2 * dx[i]).epsilon(1e-12));
}

TEST_CASE("embedding backward matches finite differences", "[ops][fd]") {
  CpuBackend be;
  const int64_t V = 6, C = 5, N = 8;
  std::vector<int32_t> tok = {1, 3, 3, 0, 5, 1, 1, 2};
  Vec table = randn(V * C, 4), R = randn(N * C, 5), y(N * C);
  Tensor tt(tok.data(), DType::I32, {N});
  auto loss = [&] {
    be.embedding_forward(T2(y, N, C), T2(table, V, C), tt, 0);
    return dot(y, R);
  };
  Vec dt(V * C, 0.0);
  be.embedding_backward(T2(dt, V, C), T2(R, N, C), tt, 0);
  check_grad(table, loss, dt, "embedding dtable");
}

TEST_CASE("rmsnorm backward matches finite differences", "[ops][fd]") {
  CpuBackend be;
  const int64_t N = 4, C = 9;
  Vec x = randn(N * C, 6), w = randn(C, 7), R = randn(N * C, 8), y(N * C), rstd(N);
  auto loss = [&] {
    be.rmsnorm_forward(T2(y, N, C), T1(rstd), T2(x, N, C), T1(w), 1e-5);
    return dot(y, R);
  };
  loss();
  Vec dx(N * C, 0.0), dw(C, 0.0);
  be.rmsnorm_backward(T2(dx, N, C), T1(dw), T2(R, N, C), T2(x, N, C), T1(w), T1(rstd));
  check_grad(x, loss, dx, "rmsnorm dx");
  check_grad(w, loss, dw, "rmsnorm dw");
}

TEST_CASE("rope backward matches finite differences and HF's rotate-half", "[ops][fd]") {
  CpuBackend be;
  const int64_t B = 2, T = 3, H = 2, hd = 4, half = hd / 2;
  Vec cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = t * std::pow(10000.0, -2.0 * i / hd);
      cs[t * half + i] = std::cos(a);
      sn[t * half + i] = std::sin(a);
    }
  Vec x = randn(B * T * H * hd, 9), R = randn(x.size(), 10);
  // Independent formula: out = x*cos(emb) + rotate_half(x)*sin(emb), emb = cat(freqs, freqs).
  Vec y = x;
  be.rope_forward(Tensor(y.data(), DType::F64, {B * T, H, hd}), T2(cs, T, half), T2(sn, T, half),
                  T);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < hd; ++j) {
        const int64_t t = r % T, i = j % half;
        const double* xr = &x[(r * H + h) * hd];
        const double rot = j < half ? -xr[j + half] : xr[j - half];
        const double ref = xr[j] * cs[t * half + i] + rot * sn[t * half + i];
        REQUIRE(y[(r * H + h) * hd + j] == Approx(ref).margin(1e-12));
      }
  auto loss = [&] {
    Vec z = x;
    be.rope_forward(Tensor(z.data(), DType::F64, {B * T, H, hd}), T2(cs, T, half), T2(sn, T, half),
                    T);
    return dot(z, R);
  };
  Vec dx = R;
  be.rope_backward(Tensor(dx.data(), DType::F64, {B * T, H, hd}), T2(cs, T, half), T2(sn, T, half),
                   T);
  check_grad(x, loss, dx, "rope dx");
}

namespace {
// Naive causal GQA attention, straight from the definition.
Vec naive_attention(const Vec& q, const Vec& k, const Vec& v, const AttentionShape& s) {
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, T = s.T;
  Vec out(q.size(), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        Vec sc(size_t(i + 1));
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c)
            d += q[((b * T + i) * H + h) * hd + c] * k[((b * T + j) * KV + kh) * hd + c];
          sc[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, sc[j]);
        }
        for (auto& x : sc) z += (x = std::exp(x - mx));
        for (int64_t c = 0; c < hd; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += sc[j] / z * v[((b * T + j) * KV + kh) * hd + c];
          out[((b * T + i) * H + h) * hd + c] = o;
        }
      }
    }
  return out;
}

void check_attention(const AttentionShape& s, uint64_t seed) {
  CpuBackend be;
  const int64_t nq = s.B * s.T * s.n_heads * s.head_dim, nk = s.B * s.T * s.n_kv_heads * s.head_dim;
  Vec q = randn(nq, seed), k = randn(nk, seed + 1), v = randn(nk, seed + 2),
      R = randn(nq, seed + 3), out(nq);
  Vec saved(size_t(be.attention_saved_elems(s)));
  auto loss = [&] {
    be.attention_forward(T1(out), T1(saved), T1(q), T1(k), T1(v), s);
    return dot(out, R);
  };
  loss();
  const Vec ref = naive_attention(q, k, v, s);
  for (size_t i = 0; i < ref.size(); ++i) REQUIRE(out[i] == Approx(ref[i]).margin(1e-12));
  // Causality: output at position t must not depend on later keys/values.
  {
    Vec out0 = out, k2 = k;
    k[size_t((s.T - 1) * s.n_kv_heads * s.head_dim)] += 1.0;  // batch 0, last position
    loss();
    for (int64_t i = 0; i < (s.T - 1) * s.n_heads * s.head_dim; ++i) REQUIRE(out[i] == out0[i]);
    k = k2;
    loss();
  }
  Vec dq(nq, 7.0), dk(nk, 7.0), dv(nk, 7.0);  // poisoned: must be overwritten
  be.attention_backward(T1(dq), T1(dk), T1(dv), T1(R), T1(q), T1(k), T1(v), T1(out), T1(saved), s);
  check_grad(q, loss, dq, "attention dq");
  check_grad(k, loss, dk, "attention dk");
  check_grad(v, loss, dv, "attention dv");
}
}  // namespace

TEST_CASE("grouped-query causal attention matches the definition and finite differences",
          "[ops][fd]") {
  check_attention({2, 5, 4, 2, 3}, 11);  // B, T, H, KV, hd: one query block
}

TEST_CASE("attention over several query blocks (T=130) matches finite differences", "[ops][fd][slow]") {
  check_attention({1, 130, 2, 1, 4}, 21);  // 64 + 64 + 2 query rows
}

TEST_CASE("swiglu backward matches finite differences", "[ops][fd]") {
  CpuBackend be;
  const int64_t n = 17;
  Vec g = randn(n, 15, 2.0), u = randn(n, 16), R = randn(n, 17), h(n);
  auto loss = [&] {
    be.swiglu_forward(T1(h), T1(g), T1(u));
    return dot(h, R);
  };
  loss();
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(h[i] == Approx(g[i] / (1 + std::exp(-g[i])) * u[i]).epsilon(1e-12));
  Vec dg(n), du(n);
  be.swiglu_backward(T1(dg), T1(du), T1(R), T1(g), T1(u));
  check_grad(g, loss, dg, "swiglu dgate");
  check_grad(u, loss, du, "swiglu dup");
}

TEST_CASE("cross-entropy gradient matches finite differences", "[ops][fd]") {
  CpuBackend be;
  const int64_t N = 4, V = 7;
  std::vector<int32_t> tg = {3, 0, -1, 6};  // row 2 is ignored
  Tensor tt(tg.data(), DType::I32, {N});
  Vec logits = randn(N * V, 18, 3.0), losses(N);
  auto loss = [&] {
    Vec z = logits;
    be.cross_entropy(T2(z, N, V), T1(losses), tt, 1.0);
    return losses[0] + losses[1] + losses[2] + losses[3];
  };
  // Independent check of the loss value: log-sum-exp minus the target logit.
  loss();
  for (int64_t i = 0; i < N; ++i) {
    if (tg[i] < 0) {
      REQUIRE(losses[i] == 0.0);
      continue;
    }
    double se = 0;
    for (int64_t j = 0; j < V; ++j) se += std::exp(logits[i * V + j]);
    REQUIRE(losses[i] == Approx(std::log(se) - logits[i * V + tg[i]]).epsilon(1e-12));
  }
  Vec d = logits;
  be.cross_entropy(T2(d, N, V), T1(losses), tt, 1.0);
  check_grad(logits, loss, d, "cross-entropy dlogits");
}

TEST_CASE("sum_squares is exact on integers and independent of chunking", "[ops]") {
  CpuBackend be;
  std::vector<float> x(100003);
  double ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float(int(i % 7) - 3);
    ref += double(x[i]) * x[i];
  }
  REQUIRE(be.sum_squares(Tensor(x.data(), DType::F32, {int64_t(x.size())})) == ref);
}

TEST_CASE("vocab-parallel cross-entropy over padded shards equals the fused one", "[ops]") {
  CpuBackend be;
  const int64_t N = 5, V = 10, R = 3, Vl = 4;  // vocabulary padded to 12: the last shard has 2 real columns
  std::vector<int32_t> tg = {0, 9, -1, 4, 7};
  Tensor tt(tg.data(), DType::I32, {N});
  Vec logits = randn(N * V, 31, 2.0), ref = logits, ref_loss(N);
  be.cross_entropy(T2(ref, N, V), T1(ref_loss), tt, 0.5);
  Vec gathered(size_t(R * N * 3)), shards(size_t(R * N * Vl), 99.0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t valid = std::min(Vl, V - r * Vl);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < valid; ++j)
        shards[size_t((r * N + i) * Vl + j)] = logits[size_t(i * V + r * Vl + j)];
    Vec st(size_t(N * 3));
    Tensor sh(shards.data() + r * N * Vl, DType::F64, {N, Vl});
    be.ce_partial_stats(T2(st, N, 3), sh, tt, r * Vl, valid);
    std::copy(st.begin(), st.end(), gathered.begin() + r * N * 3);
  }
  Vec comb(size_t(N * 3));
  be.ce_combine(T2(comb, N, 3), Tensor(gathered.data(), DType::F64, {R, N, 3}));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t valid = std::min(Vl, V - r * Vl);
    Vec loss(N);
    Tensor sh(shards.data() + r * N * Vl, DType::F64, {N, Vl});
    be.ce_finish(sh, T1(loss), T2(comb, N, 3), tt, r * Vl, valid, 0.5);
    for (int64_t i = 0; i < N; ++i) {
      REQUIRE(loss[i] == Approx(ref_loss[i]).margin(1e-12));
      for (int64_t j = 0; j < Vl; ++j) {
        const double got = shards[size_t((r * N + i) * Vl + j)];
        if (j < valid)
          REQUIRE(got == Approx(ref[size_t(i * V + r * Vl + j)]).margin(1e-12));
        else
          REQUIRE(got == 0.0);  // padding columns carry no gradient
      }
    }
  }
}

TEST_CASE("vocab-parallel embedding shards sum to the full lookup", "[ops]") {
  CpuBackend be;
  const int64_t V = 7, C = 3, N = 6, Vl = 4;
  std::vector<int32_t> tok = {0, 6, 3, 4, 4, 1};
  Tensor tt(tok.data(), DType::I32, {N});
  Vec table = randn(V * C, 41), full(N * C), sum(N * C, 0.0);
  be.embedding_forward(T2(full, N, C), T2(table, V, C), tt, 0);
  for (int64_t r = 0; r < 2; ++r) {
    Vec shard(size_t(Vl * C), 0.0), out(N * C, 5.0);
    for (int64_t v = r * Vl; v < std::min(V, (r + 1) * Vl); ++v)
      for (int64_t c = 0; c < C; ++c) shard[size_t((v - r * Vl) * C + c)] = table[size_t(v * C + c)];
    be.embedding_forward(T2(out, N, C), T2(shard, Vl, C), tt, r * Vl);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
  }
  for (size_t i = 0; i < sum.size(); ++i) REQUIRE(sum[i] == full[i]);
}
