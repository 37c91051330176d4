// bf16 mixed precision on the CPU reference backend (backend.hpp's contract):
// the conversion itself against an independent nearest-even rounding, then
// every op run twice on the same bf16-representable values — once with bf16
// tensors, once with f32 ones through the f32 path — where each bf16 output
// must equal float_to_bf16 of the f32 output bit for bit and each fp32 output
// (dw, rstd, losses, stats, saved) must equal the f32 path's exactly. Also:
// dtype misuse is refused with a named error, and the fused ops
// (residual_rmsnorm_forward, adamw_cast) equal their unfused forms bitwise.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

using F = std::vector<float>;
using H = std::vector<bf16_bits>;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Reference rounding written differently from bf16.hpp: the two bf16
// neighbours of x (truncation toward zero and the next one away from zero),
// the nearer one by exact distance in double, ties to the even mantissa.
bf16_bits ref_bf16(float x) {
  const uint32_t u = to_bits(x);
  if (std::isinf(x)) return bf16_bits(u >> 16);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // same sign, |lo| <= |x| < |hi|
  const double dx = std::fabs(double(x)), dlo = std::fabs(double(from_bits(lo)));
  // hi may be inf (x above bf16's largest finite value): it stands for 2^128 there.
  const double dhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128)
                                                        : std::fabs(double(from_bits(hi)));
  const double below = dx - dlo, above = dhi - dx;
  if (below < above) return bf16_bits(lo >> 16);
  if (above < below) return bf16_bits(hi >> 16);
  return ((lo >> 16) & 1u) ? bf16_bits(hi >> 16) : bf16_bits(lo >> 16);
}

// n normal values (times scale) rounded to bf16-representable floats.
F rnd(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  F v(n);
  for (auto& x : v) x = round_to_bf16(float(scale * r.normal()));
  return v;
}
H to_h(const F& v) {
  H h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
  return h;
}
// bf16 NaNs: what an overwritten output holds before the op.
H poison(size_t n) { return H(n, bf16_bits(0x7fc1)); }

Tensor tf(F& v, std::initializer_list<int64_t> s) { return Tensor(v.data(), DType::F32, s); }
Tensor th(H& v, std::initializer_list<int64_t> s) { return Tensor(v.data(), DType::BF16, s); }
Tensor tf(F& v) { return Tensor(v.data(), DType::F32, {int64_t(v.size())}); }
Tensor th(H& v) { return Tensor(v.data(), DType::BF16, {int64_t(v.size())}); }

// Every bf16 output element equals float_to_bf16 of the f32 path's output.
void check_rounded(const H& got, const F& ref, const char* what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, nonzero = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (got[i] != float_to_bf16(ref[i]) && bad++ == 0) first = i;
    nonzero += ref[i] != 0;
  }
  INFO(what << ": " << bad << " of " << ref.size() << " differ; first at " << first << ": bf16 0x"
            << std::hex << (bad ? got[first] : 0) << ", f32 " << std::dec
            << (bad ? ref[first] : 0.0f));
  CHECK(bad == 0);
  CHECK(nonzero > 0);  // a check on an all-zero output would prove little
}
// fp32 outputs equal the f32 path's bit for bit.
void check_same(const F& got, const F& ref, const char* what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, nonzero = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bad += to_bits(got[i]) != to_bits(ref[i]);
    nonzero += ref[i] != 0;
  }
  INFO(what << ": " << bad << " of " << ref.size() << " differ");
  CHECK(bad == 0);
  CHECK(nonzero > 0);
}
void check_same(const H& got, const H& ref, const char* what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
  INFO(what << ": " << bad << " of " << ref.size() << " differ");
  CHECK(bad == 0);
}

}  // namespace

// ---------------------------------------------------------------- conversion

TEST_CASE("bf16 conversion: known values", "[bf16]") {
  const float e8 = std::ldexp(1.0f, -8);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-1.0f) == 0xbf80);
  CHECK(float_to_bf16(0.0f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(1.0f + e8) == 0x3f80);            // tie, 1.0 is even
  CHECK(float_to_bf16(1.0f + 3 * e8) == 0x3f82);        // tie, 1 + 2^-6 is even
  CHECK(float_to_bf16(-(1.0f + 3 * e8)) == 0xbf82);
  CHECK(float_to_bf16(1.0f + e8 + std::ldexp(1.0f, -20)) == 0x3f81);  // above the tie
  CHECK(float_to_bf16(1.0f + e8 - std::ldexp(1.0f, -20)) == 0x3f80);  // below it
  CHECK(bf16_to_float(0x3f81) == 1.0f + 2 * e8);
  CHECK(float_to_bf16(3.140625f) == 0x4049);  // exactly representable
  // inf, NaN (a signalling NaN whose payload sits in the low bits would
  // otherwise truncate to inf), overflow.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_bf16(inf) == 0x7f80);
  CHECK(float_to_bf16(-inf) == 0xff80);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xff800001u)))));
  CHECK(float_to_bf16(FLT_MAX) == 0x7f80);
  CHECK(float_to_bf16(-FLT_MAX) == 0xff80);
  CHECK(float_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);  // just below the tie: bf16 max
  CHECK(float_to_bf16(from_bits(0x7f7f8000u)) == 0x7f80);  // the tie: odd max -> even inf
  // Subnormals (bf16 has them too: smallest 2^-133).
  CHECK(float_to_bf16(std::ldexp(1.0f, -133)) == 0x0001);
  CHECK(float_to_bf16(std::ldexp(3.0f, -134)) == 0x0002);  // 1.5 ulp: tie -> even
  CHECK(float_to_bf16(std::ldexp(1.0f, -134)) == 0x0000);  // half ulp: tie -> even 0
  CHECK(float_to_bf16(std::ldexp(1.0f, -140)) == 0x0000);
  CHECK(float_to_bf16(-std::ldexp(1.0f, -140)) == 0x8000);
  CHECK(float_to_bf16(std::ldexp(1.0f, -126) - std::ldexp(1.0f, -149)) == 0x0080);  // rounds up to normal
  CHECK(bf16_to_float(0x0001) == std::ldexp(1.0f, -133));
}

TEST_CASE("bf16 conversion: random sweep against an independent rounding", "[bf16]") {
  Rng r(7);
  size_t checked = 0, bad = 0;
  auto check = [&](uint32_t u) {
    const float x = from_bits(u);
    if (std::isnan(x)) {
      bad += !std::isnan(bf16_to_float(float_to_bf16(x)));
      return;
    }
    const bf16_bits h = float_to_bf16(x);
    bad += h != ref_bf16(x);
    const float y = bf16_to_float(h);
    bad += to_bits(round_to_bf16(y)) != to_bits(y);  // idempotent
    bad += (to_bits(y) & 0xffffu) != 0;
    ++checked;
  };
  for (int i = 0; i < 1000000; ++i) check(uint32_t(r.next()));
  // Every bf16 value with the low half at the tie and either side of it.
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      check((hi << 16) | lo);
  INFO(bad << " mismatches of " << checked);
  CHECK(bad == 0);
  CHECK(checked > 1000000);
}

// ---------------------------------------------------------------- ops

TEST_CASE("bf16 linear forward/backward equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t N = 37, I = 53, O = 29;
  F x = rnd(N * I, 1), w = rnd(O * I, 2), dy = rnd(N * O, 3);
  H xh = to_h(x), wh = to_h(w), dyh = to_h(dy);

  F y(N * O);
  H yh = poison(N * O);
  be.linear_forward(tf(y, {N, O}), tf(x, {N, I}), tf(w, {O, I}));
  be.linear_forward(th(yh, {N, O}), th(xh, {N, I}), th(wh, {O, I}));
  check_rounded(yh, y, "linear_forward y");

  for (bool acc : {false, true}) {
    INFO("accumulate_dx " << acc);
    F dx = acc ? rnd(N * I, 4) : F(N * I), dw = rnd(O * I, 5);
    H dxh = acc ? to_h(dx) : poison(N * I);
    F dwh = dw;  // fp32 in both runs
    be.linear_backward(tf(dx, {N, I}), tf(dw, {O, I}), tf(dy, {N, O}), tf(x, {N, I}),
                       tf(w, {O, I}), acc);
    be.linear_backward(th(dxh, {N, I}), tf(dwh, {O, I}), th(dyh, {N, O}), th(xh, {N, I}),
                       th(wh, {O, I}), acc);
    check_rounded(dxh, dx, "linear_backward dx");
    check_same(dwh, dw, "linear_backward dw");
  }
  // Split backward: dx only, then dw only.
  F dx(N * I), dw = rnd(O * I, 6), dwh = dw;
  H dxh = poison(N * I);
  be.linear_backward(tf(dx, {N, I}), Tensor(), tf(dy, {N, O}), tf(x, {N, I}), tf(w, {O, I}), false);
  be.linear_backward(th(dxh, {N, I}), Tensor(), th(dyh, {N, O}), th(xh, {N, I}), th(wh, {O, I}),
                     false);
  check_rounded(dxh, dx, "linear_backward dx only");
  be.linear_backward(Tensor(), tf(dw, {O, I}), tf(dy, {N, O}), tf(x, {N, I}), tf(w, {O, I}), false);
  be.linear_backward(Tensor(), tf(dwh, {O, I}), th(dyh, {N, O}), th(xh, {N, I}), th(wh, {O, I}),
                     false);
  check_same(dwh, dw, "linear_backward dw only");
}

TEST_CASE("bf16 embedding forward/backward equal the f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t N = 41, V = 50, C = 24, start = 5;
  std::vector<int32_t> tok(N);
  for (int64_t i = 0; i < N; ++i) tok[size_t(i)] = int32_t((i * 7) % 60);  // some outside the shard
  Tensor tk(tok.data(), DType::I32, {N});
  F table = rnd(V * C, 11), dout = rnd(N * C, 12), out(N * C);
  H tableh = to_h(table), douth = to_h(dout), outh = poison(N * C);
  be.embedding_forward(tf(out, {N, C}), tf(table, {V, C}), tk, start);
  be.embedding_forward(th(outh, {N, C}), th(tableh, {V, C}), tk, start);
  check_rounded(outh, out, "embedding_forward out");

  F dt = rnd(V * C, 13), dth = dt;
  be.embedding_backward(tf(dt, {V, C}), tf(dout, {N, C}), tk, start);
  be.embedding_backward(tf(dth, {V, C}), th(douth, {N, C}), tk, start);
  check_same(dth, dt, "embedding_backward dtable");
}

TEST_CASE("bf16 rmsnorm forward/backward equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t N = 37, C = 77;
  F x = rnd(N * C, 21, 2.0), w = rnd(C, 22), dout = rnd(N * C, 23);
  H xh = to_h(x), wh = to_h(w), douth = to_h(dout);
  F out(N * C), rstd(N), rstdh(N);
  H outh = poison(N * C);
  be.rmsnorm_forward(tf(out, {N, C}), tf(rstd), tf(x, {N, C}), tf(w), 1e-5);
  be.rmsnorm_forward(th(outh, {N, C}), tf(rstdh), th(xh, {N, C}), th(wh), 1e-5);
  check_rounded(outh, out, "rmsnorm_forward out");
  check_same(rstdh, rstd, "rmsnorm_forward rstd");

  F dx = rnd(N * C, 24), dw = rnd(C, 25), dwh = dw;  // both +=
  H dxh = to_h(dx);
  be.rmsnorm_backward(tf(dx, {N, C}), tf(dw), tf(dout, {N, C}), tf(x, {N, C}), tf(w), tf(rstd));
  be.rmsnorm_backward(th(dxh, {N, C}), tf(dwh), th(douth, {N, C}), th(xh, {N, C}), th(wh),
                      tf(rstdh));
  check_rounded(dxh, dx, "rmsnorm_backward dx (+=)");
  check_same(dwh, dw, "rmsnorm_backward dw (+=)");
}

TEST_CASE("residual_rmsnorm_forward equals add_inplace then rmsnorm_forward", "[bf16]") {
  CpuBackend be;
  const int64_t N = 29, C = 96;
  const double eps = 1e-6;
  F x = rnd(N * C, 31), y = rnd(N * C, 32), w = rnd(C, 33);
  SECTION("f32") {
    F x1 = x, x2 = x, o1(N * C), o2(N * C), r1(N), r2(N);
    be.residual_rmsnorm_forward(tf(x1, {N, C}), tf(y, {N, C}), tf(o1, {N, C}), tf(r1), tf(w), eps);
    be.add_inplace(tf(x2, {N, C}), tf(y, {N, C}));
    be.rmsnorm_forward(tf(o2, {N, C}), tf(r2), tf(x2, {N, C}), tf(w), eps);
    check_same(x1, x2, "x");
    check_same(o1, o2, "out");
    check_same(r1, r2, "rstd");
  }
  SECTION("f64") {
    std::vector<double> xd(x.begin(), x.end()), yd(y.begin(), y.end()), wd(w.begin(), w.end());
    const size_t n = size_t(N * C);
    std::vector<double> x1 = xd, x2 = xd, o1(n), o2(n), r1(xd.size() / C), r2(xd.size() / C);
    auto t = [](std::vector<double>& v) {
      return Tensor(v.data(), DType::F64, {int64_t(v.size())});
    };
    be.residual_rmsnorm_forward(t(x1), t(yd), t(o1), t(r1), t(wd), eps);
    be.add_inplace(t(x2), t(yd));
    be.rmsnorm_forward(t(o2), t(r2), t(x2), t(wd), eps);
    CHECK(std::memcmp(x1.data(), x2.data(), x1.size() * 8) == 0);
    CHECK(std::memcmp(o1.data(), o2.data(), o1.size() * 8) == 0);
    CHECK(std::memcmp(r1.data(), r2.data(), r1.size() * 8) == 0);
  }
  SECTION("bf16") {
    H x1 = to_h(x), x2 = x1, yh = to_h(y), wh = to_h(w), o1 = poison(N * C), o2 = poison(N * C);
    F r1(N), r2(N);
    be.residual_rmsnorm_forward(th(x1, {N, C}), th(yh, {N, C}), th(o1, {N, C}), tf(r1), th(wh),
                                eps);
    be.add_inplace(th(x2, {N, C}), th(yh, {N, C}));
    be.rmsnorm_forward(th(o2, {N, C}), tf(r2), th(x2, {N, C}), th(wh), eps);
    check_same(x1, x2, "x");
    check_same(o1, o2, "out");
    check_same(r1, r2, "rstd");
    // And x really is the rounded f32 sum (the add is not done in bf16 arithmetic).
    F xs = x;
    be.add_inplace(tf(xs), tf(y));
    check_rounded(x1, xs, "x = bf16(x + y)");
  }
}

TEST_CASE("bf16 rope forward/backward equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t B = 2, T = 9, Hh = 3, hd = 8;
  F cs(T * hd / 2), sn(T * hd / 2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double ang = double(t) * std::pow(10000.0, -2.0 * double(i) / double(hd));
      cs[size_t(t * hd / 2 + i)] = float(std::cos(ang));  // fp32 tables, not rounded
      sn[size_t(t * hd / 2 + i)] = float(std::sin(ang));
    }
  Tensor ct = tf(cs, {T, hd / 2}), st = tf(sn, {T, hd / 2});
  F x = rnd(B * T * Hh * hd, 41);
  H xh = to_h(x);
  be.rope_forward(tf(x, {B * T, Hh, hd}), ct, st, T);
  be.rope_forward(th(xh, {B * T, Hh, hd}), ct, st, T);
  check_rounded(xh, x, "rope_forward");
  F d = rnd(B * T * Hh * hd, 42);
  H dh = to_h(d);
  be.rope_backward(tf(d, {B * T, Hh, hd}), ct, st, T);
  be.rope_backward(th(dh, {B * T, Hh, hd}), ct, st, T);
  check_rounded(dh, d, "rope_backward");
}

TEST_CASE("bf16 attention forward/backward equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  struct Case { int64_t B, T, H, KV, hd; };
  for (const Case c : {Case{2, 70, 4, 2, 8}, Case{1, 33, 4, 1, 16}, Case{2, 17, 2, 2, 8}}) {
    INFO("B=" << c.B << " T=" << c.T << " H=" << c.H << " KV=" << c.KV << " hd=" << c.hd);
    const AttentionShape s{c.B, c.T, c.H, c.KV, c.hd};
    const size_t nq = size_t(c.B * c.T * c.H * c.hd), nk = size_t(c.B * c.T * c.KV * c.hd);
    const size_t ns = size_t(be.attention_saved_elems(s));
    F q = rnd(nq, 51), k = rnd(nk, 52), v = rnd(nk, 53), dout = rnd(nq, 54);
    H qh = to_h(q), kh = to_h(k), vh = to_h(v), douth = to_h(dout);
    F out(nq), saved(ns), savedh(ns);
    H outh = poison(nq);
    be.attention_forward(tf(out), tf(saved), tf(q), tf(k), tf(v), s);
    be.attention_forward(th(outh), tf(savedh), th(qh), th(kh), th(vh), s);
    check_rounded(outh, out, "attention_forward out");
    check_same(savedh, saved, "attention_forward saved (fp32 probabilities)");

    F dq(nq), dk(nk), dv(nk);
    H dqh = poison(nq), dkh = poison(nk), dvh = poison(nk);
    be.attention_backward(tf(dq), tf(dk), tf(dv), tf(dout), tf(q), tf(k), tf(v), tf(out), tf(saved),
                          s);
    be.attention_backward(th(dqh), th(dkh), th(dvh), th(douth), th(qh), th(kh), th(vh), th(outh),
                          tf(savedh), s);
    check_rounded(dqh, dq, "attention_backward dq");
    check_rounded(dkh, dk, "attention_backward dk");
    check_rounded(dvh, dv, "attention_backward dv");
  }
}

TEST_CASE("bf16 swiglu and elementwise ops equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  const size_t n = 1999;
  F g = rnd(n, 61, 3.0), u = rnd(n, 62), dh = rnd(n, 63);
  H gh = to_h(g), uh = to_h(u), dhh = to_h(dh);
  F h(n);
  H hh = poison(n);
  be.swiglu_forward(tf(h), tf(g), tf(u));
  be.swiglu_forward(th(hh), th(gh), th(uh));
  check_rounded(hh, h, "swiglu_forward");
  F dg(n), du(n);
  H dgh = poison(n), duh = poison(n);
  be.swiglu_backward(tf(dg), tf(du), tf(dh), tf(g), tf(u));
  be.swiglu_backward(th(dgh), th(duh), th(dhh), th(gh), th(uh));
  check_rounded(dgh, dg, "swiglu_backward dgate");
  check_rounded(duh, du, "swiglu_backward dup");

  F a = rnd(n, 64), b = rnd(n, 65, 0.01);  // small b: many sums need rounding
  H ah = to_h(a), bh = to_h(b);
  be.add_inplace(tf(a), tf(b));
  be.add_inplace(th(ah), th(bh));
  check_rounded(ah, a, "add_inplace");
  F sa = rnd(n, 66);
  H sah = to_h(sa);
  be.scale_inplace(tf(sa), 0.3);
  be.scale_inplace(th(sah), 0.3);
  check_rounded(sah, sa, "scale_inplace");
  H ch = poison(n);
  be.copy(th(ch), th(sah));
  check_same(ch, sah, "copy");
}

TEST_CASE("cast between float dtypes rounds once", "[bf16]") {
  CpuBackend be;
  const size_t n = 3001;
  Rng r(71);
  F x(n);
  for (auto& v : x) v = float(r.normal() * std::exp(8 * r.normal()));  // not bf16-representable
  H h = poison(n);
  be.cast(th(h), tf(x));
  H want = to_h(x);
  check_same(h, want, "f32 -> bf16");
  F back(n);
  be.cast(tf(back), th(h));
  for (size_t i = 0; i < n; ++i) REQUIRE(to_bits(back[i]) == uint32_t(h[i]) << 16);
  std::vector<double> d(n);
  be.cast(Tensor(d.data(), DType::F64, {int64_t(n)}), th(h));
  for (size_t i = 0; i < n; ++i) REQUIRE(d[i] == double(bf16_to_float(h[i])));
  // f64 -> bf16: one rounding. 1 + 2^-8 + 2^-30 is above the tie, so it rounds up;
  // through f32 it would first lose 2^-30, land on the tie and round down to 1.
  std::vector<double> dd = {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30),
                            -(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)),
                            1.0 + std::ldexp(1.0, -8),  // exact tie -> even
                            1.0 + 3 * std::ldexp(1.0, -8) - std::ldexp(1.0, -40),
                            1e300, -1e-300, 0.0, 3.0};
  H hd = poison(dd.size());
  be.cast(th(hd), Tensor(dd.data(), DType::F64, {int64_t(dd.size())}));
  CHECK(hd[0] == 0x3f81);
  CHECK(hd[1] == 0xbf81);
  CHECK(hd[2] == 0x3f80);
  CHECK(hd[3] == 0x3f81);
  CHECK(hd[4] == 0x7f80);
  CHECK(hd[5] == 0x8000);
  CHECK(hd[6] == 0x0000);
  CHECK(hd[7] == 0x4040);
}

TEST_CASE("bf16 cross-entropy and the vocab-parallel pieces equal the f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t N = 23, V = 131, Vl = 66;
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[size_t(i)] = i % 9 == 3 ? -1 : int32_t((i * 13) % V);
  Tensor tgt(tg.data(), DType::I32, {N});
  const F logits = rnd(N * V, 81, 3.0);

  F lg = logits, loss(N), lossh(N);
  H lgh = to_h(logits);
  be.cross_entropy(tf(lg, {N, V}), tf(loss), tgt, 0.25);
  be.cross_entropy(th(lgh, {N, V}), tf(lossh), tgt, 0.25);
  check_rounded(lgh, lg, "cross_entropy dlogits");
  check_same(lossh, loss, "cross_entropy losses");

  // Two vocabulary shards of Vl columns (the second padded: V - Vl valid).
  F sh[2];
  H shh[2];
  F gath(2 * N * 3), gathh(2 * N * 3);
  for (int r = 0; r < 2; ++r) {
    sh[r].assign(size_t(N * Vl), 0.0f);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < Vl && r * Vl + j < V; ++j)
        sh[r][size_t(i * Vl + j)] = logits[size_t(i * V + r * Vl + j)];
    shh[r] = to_h(sh[r]);
    const int64_t valid = r ? V - Vl : Vl;
    Tensor st(gath.data() + r * N * 3, DType::F32, {N, 3});
    Tensor sth(gathh.data() + r * N * 3, DType::F32, {N, 3});
    be.ce_partial_stats(st, tf(sh[r], {N, Vl}), tgt, r * Vl, valid);
    be.ce_partial_stats(sth, th(shh[r], {N, Vl}), tgt, r * Vl, valid);
  }
  check_same(gathh, gath, "ce_partial_stats");
  F comb(N * 3), combh(N * 3);
  be.ce_combine(tf(comb), tf(gath));
  be.ce_combine(tf(combh), tf(gathh));
  check_same(combh, comb, "ce_combine");
  for (int r = 0; r < 2; ++r) {
    const int64_t valid = r ? V - Vl : Vl;
    F l(N), lh(N);
    be.ce_finish(tf(sh[r], {N, Vl}), tf(l), tf(comb), tgt, r * Vl, valid, 0.7);
    be.ce_finish(th(shh[r], {N, Vl}), tf(lh), tf(combh), tgt, r * Vl, valid, 0.7);
    check_rounded(shh[r], sh[r], "ce_finish dlogits");
    check_same(lh, l, "ce_finish losses");
  }
}

TEST_CASE("bf16 sum_squares equals the f32 sum; adamw_cast equals adamw then cast", "[bf16]") {
  CpuBackend be;
  F x = rnd(40000, 91, 5.0);  // more than one chunk
  H xh = to_h(x);
  CHECK(be.sum_squares(th(xh)) == be.sum_squares(tf(x)));
  CHECK(be.sum_squares(th(xh)) > 0);

  const size_t n = 5003;
  Rng r(92);
  F p(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = float(r.normal());
    g[i] = float(r.normal());
    m[i] = float(0.1 * r.normal());
    v[i] = float(0.01 * r.normal() * r.normal());
  }
  AdamWHyper hp;
  hp.lr = 3e-3;
  hp.weight_decay = 0.1;
  hp.step = 4;
  F p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
  H low1 = poison(n), low2 = poison(n);
  for (int step = 0; step < 3; ++step) {
    be.adamw_cast(tf(p1), tf(g), tf(m1), tf(v1), th(low1), hp);
    be.adamw(tf(p2), tf(g), tf(m2), tf(v2), hp);
    be.cast(th(low2), tf(p2));
    ++hp.step;
  }
  check_same(p1, p2, "adamw_cast param");
  check_same(m1, m2, "adamw_cast m");
  check_same(v1, v2, "adamw_cast v");
  check_same(low1, low2, "adamw_cast lowp");
  check_rounded(low1, p1, "adamw_cast lowp = bf16(param)");
}

TEST_CASE("bf16 dtype misuse is refused with the op and dtypes named", "[bf16]") {
  CpuBackend be;
  const int64_t N = 4, I = 6, O = 5, C = 8;
  H xh(N * I, 0x3f80), wh(O * I, 0x3f80), dyh(N * O, 0x3f80), dxh(N * I), bad_dw(O * I);
  F dw(O * I), wf(O * I), yf(N * O);
  REQUIRE_THROWS_WITH(be.linear_backward(th(dxh, {N, I}), th(bad_dw, {O, I}), th(dyh, {N, O}),
                                         th(xh, {N, I}), th(wh, {O, I}), false),
                      Contains("linear_backward: dw bf16, expected f32 with bf16 inputs"));
  REQUIRE_THROWS_WITH(be.linear_forward(th(dyh, {N, O}), th(xh, {N, I}), tf(wf, {O, I})),
                      Contains("linear_forward: w f32, expected bf16"));
  REQUIRE_THROWS_WITH(be.linear_forward(tf(yf, {N, O}), th(xh, {N, I}), th(wh, {O, I})),
                      Contains("linear_forward: y f32, expected bf16"));
  // f32 inputs with a bf16 parameter gradient are refused too.
  F xf(N * I), dyf(N * O), dxf(N * I);
  REQUIRE_THROWS_WITH(be.linear_backward(tf(dxf, {N, I}), th(bad_dw, {O, I}), tf(dyf, {N, O}),
                                         tf(xf, {N, I}), tf(wf, {O, I}), false),
                      Contains("dw bf16, expected f32 with f32 inputs"));

  H x(N * C, 0x3f80), w(C, 0x3f80), out(N * C), rstd_bad(N);
  REQUIRE_THROWS_WITH(be.rmsnorm_forward(th(out, {N, C}), th(rstd_bad), th(x, {N, C}), th(w), 1e-5),
                      Contains("rmsnorm_forward: rstd bf16, expected f32"));
  F rstd(N);
  REQUIRE_THROWS_WITH(be.rmsnorm_backward(th(out, {N, C}), th(w), th(x, {N, C}), th(x, {N, C}),
                                          th(w), tf(rstd)),
                      Contains("rmsnorm_backward: dw bf16, expected f32"));

  const AttentionShape s{1, 4, 2, 1, 4};
  H q(32, 0x3f80), k(16, 0x3f80), o(32), saved_bad(static_cast<size_t>(be.attention_saved_elems(s)));
  REQUIRE_THROWS_WITH(be.attention_forward(th(o), th(saved_bad), th(q), th(k), th(k), s),
                      Contains("attention_forward: saved bf16, expected f32"));

  H lg(N * 3, 0x3f80), loss_bad(N);
  std::vector<int32_t> tg(N, 1);
  Tensor tgt(tg.data(), DType::I32, {N});
  REQUIRE_THROWS_WITH(be.cross_entropy(th(lg, {N, 3}), th(loss_bad), tgt, 1.0),
                      Contains("cross_entropy: losses bf16, expected f32"));

  H p(16), g(16);
  REQUIRE_THROWS_WITH(be.adamw(th(p), th(g), th(p), th(p), AdamWHyper{}),
                      Contains("adamw: param bf16"));

  std::vector<int32_t> pos(N, 0);
  Tensor post(pos.data(), DType::I32, {N, 1});
  H yrows(N * C), orows(N * C);
  F wrong_w(N);  // combine weights come in the rows' dtype
  REQUIRE_THROWS_WITH(be.combine_rows(th(orows, {N, C}), th(yrows, {N, C}), post,
                                      tf(wrong_w, {N, 1}), false),
                      Contains("combine_rows: weights"));
}

TEST_CASE("bf16 combine_rows and its backward equal the rounded f32 path", "[bf16]") {
  CpuBackend be;
  const int64_t N = 37, k = 2, M = 50, C = 24;
  F y = rnd(size_t(M * C), 71), w = rnd(size_t(N * k), 72, 0.5), dout = rnd(size_t(N * C), 73);
  std::vector<int32_t> pos(size_t(N * k));
  for (int64_t i = 0; i < N * k; ++i) pos[size_t(i)] = i % 7 == 3 ? -1 : int32_t((i * 13) % M);
  H yh = to_h(y), wh = to_h(w), douth = to_h(dout);
  const Tensor tp(pos.data(), DType::I32, {N, k});
  // Overwrite, then accumulate onto the result (read, add in fp32, round).
  F out(size_t(N * C));
  H outh = poison(size_t(N * C));
  be.combine_rows(tf(out, {N, C}), tf(y, {M, C}), tp, tf(w, {N, k}), false);
  be.combine_rows(th(outh, {N, C}), th(yh, {M, C}), tp, th(wh, {N, k}), false);
  check_rounded(outh, out, "combine_rows");
  F acc(out.size());
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = bf16_to_float(outh[i]);
  be.combine_rows(tf(acc, {N, C}), tf(y, {M, C}), tp, Tensor(), true);
  be.combine_rows(th(outh, {N, C}), th(yh, {M, C}), tp, Tensor(), true);
  check_rounded(outh, acc, "combine_rows accumulate");
  // Backward: dy rows (each named at most once, as the contract asks: row i
  // for assignment i) rounded, dw fp32.
  const int64_t Mb = N * k;
  for (int64_t i = 0; i < N * k; ++i) pos[size_t(i)] = i % 7 == 3 ? -1 : int32_t(i);
  F yb = rnd(size_t(Mb * C), 74);
  H ybh = to_h(yb);
  F dy(size_t(Mb * C), 0.0f), dw(size_t(N * k)), dwh(size_t(N * k));
  H dyh(size_t(Mb * C), float_to_bf16(0.0f));
  be.combine_rows_backward(tf(dy, {Mb, C}), tf(dw, {N, k}), tf(dout, {N, C}), tf(yb, {Mb, C}), tp,
                           tf(w, {N, k}));
  be.combine_rows_backward(th(dyh, {Mb, C}), tf(dwh, {N, k}), th(douth, {N, C}), th(ybh, {Mb, C}),
                           tp, th(wh, {N, k}));
  check_rounded(dyh, dy, "combine_rows_backward dy");
  check_same(dwh, dw, "combine_rows_backward dw (fp32)");
  // dw in bf16 is refused: the router's gradient stays fp32.
  H dwbad(size_t(N * k));
  CHECK_THROWS_WITH(be.combine_rows_backward(Tensor(), th(dwbad, {N, k}), th(douth, {N, C}),
                                             th(ybh, {Mb, C}), tp, th(wh, {N, k})),
                    Contains("f32 with bf16 rows"));
}
