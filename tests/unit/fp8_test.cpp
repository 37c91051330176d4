// FP8 (docs/fp8.md): the casts of kernels/common/fp8.hpp bit for bit against
// oracles that share no code with them — a table of every code's value from
// the format's definition (ldexp of sign, exponent, mantissa) searched for
// the nearest value (ties to the even code), and, where the CUDA toolkit's
// headers are found, NVIDIA's own host conversion (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE, the hardware's cvt.rn.satfinite) — on all 2^16 bf16 inputs
// and on random fp32 bit patterns; the scale exponent against a search; the
// CPU and emulated backends' FP8 ops against the scalar functions; and the
// FP8 linear layer (Fp8Linears) against a double-precision GEMM of the
// quantized operands; the MoE layer's experts in FP8 against a double
// reference of the same recipe (each expert's own operand scales).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/model/fp8_linear.hpp"
#include "core/model/moe.hpp"
#include "core/rng.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/common/fp8.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/emulated_backend.hpp"
#include "kernels/backend.hpp"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define ADGT_TEST_NV_FP8 1
#endif

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

struct Format {
  Fp8Kind kind;
  int ebits, mbits, bias;
  bool fn;  // E4M3fn: no infinities, only S.1111.111 is NaN
};
const Format kE4M3{Fp8Kind::E4M3, 4, 3, 7, true};
const Format kE5M2{Fp8Kind::E5M2, 5, 2, 15, false};

// The value of `code` from the format's definition (NaN as NaN, inf as inf).
double definition_value(const Format& f, unsigned code) {
  const int s = int(code >> 7), e = int((code >> f.mbits) & ((1u << f.ebits) - 1)),
            m = int(code & ((1u << f.mbits) - 1));
  const int emax_field = (1 << f.ebits) - 1;
  double v;
  if (f.fn && e == emax_field && m == (1 << f.mbits) - 1) return std::nan("");
  if (!f.fn && e == emax_field) return m ? std::nan("") : (s ? -INFINITY : INFINITY);
  if (e == 0)
    v = std::ldexp(double(m), 1 - f.bias - f.mbits);
  else
    v = std::ldexp(double((1 << f.mbits) + m), e - f.bias - f.mbits);
  return s ? -v : v;
}

// The oracle: the nearest finite code (ties: the even code), saturating.
struct Oracle {
  const Format& f;
  std::vector<std::pair<double, unsigned>> pos;  // finite codes with sign 0, ascending
  explicit Oracle(const Format& fmt) : f(fmt) {
    for (unsigned c = 0; c < 128; ++c) {
      const double v = definition_value(f, c);
      if (std::isfinite(v)) pos.push_back({v, c});
    }
    std::sort(pos.begin(), pos.end());
  }
  unsigned operator()(float x) const {
    if (std::isnan(x)) return 0x7f;
    const unsigned sign = std::signbit(x) ? 0x80u : 0u;
    const double a = std::fabs(double(x));
    if (a >= pos.back().first) return sign | pos.back().second;
    auto hi = std::lower_bound(pos.begin(), pos.end(), std::make_pair(a, 0u));
    if (hi->first == a) return sign | hi->second;
    auto lo = hi - 1;
    const double dl = a - lo->first, dh = hi->first - a;
    unsigned c = dl < dh ? lo->second : dh < dl ? hi->second : ((lo->second & 1u) ? hi->second : lo->second);
    return sign | c;
  }
};

unsigned ours(float x, Fp8Kind k) { return float_to_fp8(x, k); }

#ifdef ADGT_TEST_NV_FP8
unsigned nvidia(float x, Fp8Kind k) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, k == Fp8Kind::E4M3 ? __NV_E4M3 : __NV_E5M2);
}
#endif

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("fp8: every code decodes to its defined value and encodes back", "[fp8]") {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (unsigned c = 0; c < 256; ++c) {
      const double want = definition_value(*f, c);
      const float got = fp8_to_float(uint8_t(c), f->kind);
      INFO("format " << (f->fn ? "e4m3" : "e5m2") << " code " << c);
      if (std::isnan(want)) {
        CHECK(std::isnan(got));
        continue;
      }
      CHECK(double(got) == want);
      if (std::isfinite(want)) CHECK(ours(got, f->kind) == c);
    }
  }
  CHECK(fp8_max(Fp8Kind::E4M3) == 448.0f);
  CHECK(fp8_max(Fp8Kind::E5M2) == 57344.0f);
}

TEST_CASE("fp8: the cast rounds every bf16 value as the oracle does", "[fp8]") {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    const Oracle oracle(*f);
    int64_t bad = 0, bad_nv = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const float x = bf16_to_float(bf16_bits(h));
      const unsigned want = oracle(x), got = ours(x, f->kind);
      if (got != want && bad++ < 5)
        FAIL_CHECK("bf16 0x" << std::hex << h << " (" << x << "): got 0x" << got << ", want 0x" << want);
#ifdef ADGT_TEST_NV_FP8
      if (nvidia(x, f->kind) != got && bad_nv++ < 5)
        FAIL_CHECK("bf16 0x" << std::hex << h << ": ours 0x" << got << ", NVIDIA's 0x" << nvidia(x, f->kind));
#endif
    }
    CHECK(bad == 0);
    CHECK(bad_nv == 0);
  }
}

TEST_CASE("fp8: the cast rounds random fp32 values as the oracle does", "[fp8]") {
  Rng rng(11);
  for (const Format* f : {&kE4M3, &kE5M2}) {
    const Oracle oracle(*f);
    int64_t bad = 0;
    for (int i = 0; i < 400000; ++i) {
      // Half: any bit pattern; half: the fp8 range and its ties (a value
      // halfway between two codes, then nudged by one fp32 ulp either way).
      float x;
      if (i % 2 == 0) {
        x = float_of_bits(uint32_t(rng.next()));
      } else {
        const unsigned c = unsigned(rng.next() % 256);
        const float a = fp8_to_float(uint8_t(c), f->kind), b = fp8_to_float(uint8_t(c + 1), f->kind);
        if (!std::isfinite(a) || !std::isfinite(b) || (c & 0x7f) == 0x7f) continue;
        x = float((double(a) + double(b)) / 2);
        const int nudge = int(rng.next() % 3) - 1;
        if (nudge) x = std::nextafter(x, nudge > 0 ? INFINITY : -INFINITY);
      }
      const unsigned want = oracle(x), got = ours(x, f->kind);
      if (got != want && bad++ < 5)
        FAIL_CHECK("fp32 " << x << ": got 0x" << std::hex << got << ", want 0x" << want);
#ifdef ADGT_TEST_NV_FP8
      if (nvidia(x, f->kind) != got && bad++ < 5)
        FAIL_CHECK("fp32 " << x << ": ours 0x" << std::hex << got << ", NVIDIA's 0x" << nvidia(x, f->kind));
#endif
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("fp8: saturation, infinities, NaN and signed zero", "[fp8]") {
  CHECK(float_to_e4m3(448.0f) == 0x7e);
  CHECK(float_to_e4m3(463.9f) == 0x7e);
  CHECK(float_to_e4m3(1e30f) == 0x7e);
  CHECK(float_to_e4m3(-INFINITY) == 0xfe);
  CHECK(float_to_e4m3(std::nanf("")) == 0x7f);
  CHECK(float_to_e4m3(-std::nanf("")) == 0x7f);
  CHECK(float_to_e5m2(INFINITY) == 0x7b);
  CHECK(float_to_e5m2(-65536.0f) == 0xfb);
  CHECK(float_to_e5m2(std::nanf("")) == 0x7f);
  CHECK(float_to_e4m3(-0.0f) == 0x80);
  CHECK(float_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);   // half the smallest subnormal: even
  CHECK(float_to_e4m3(std::ldexp(1.5f, -10)) == 0x01);
  CHECK(float_to_e5m2(std::ldexp(1.0f, -17)) == 0x00);
  CHECK(float_to_e5m2(std::ldexp(3.0f, -17)) == 0x02);   // 1.5 units: to even (2)
  CHECK(std::isinf(e5m2_to_float(0x7c)));
  CHECK(std::isnan(e5m2_to_float(0x7d)));
  CHECK(std::isnan(e4m3_to_float(0xff)));
}

TEST_CASE("fp8: the scale exponent is the largest that keeps amax in range", "[fp8]") {
  Rng rng(5);
  for (Fp8Kind k : {Fp8Kind::E4M3, Fp8Kind::E5M2}) {
    const double mx = fp8_max(k);
    for (int i = 0; i < 20000; ++i) {
      const float amax = float(std::ldexp(0.5 + rng.uniform(), int(rng.next() % 80) - 40));
      const int margin = int(rng.next() % 3);
      int want = -200;
      for (int n = -100; n <= 100; ++n)
        if (std::ldexp(double(amax), n) <= mx) want = n;
      want -= margin;
      INFO("amax " << amax << " margin " << margin);
      REQUIRE(fp8_scale_exponent(amax, k, margin) == want);
    }
    // Exactly the largest value, and one ulp above it.
    CHECK(fp8_scale_exponent(float(mx), k, 0) == 0);
    CHECK(fp8_scale_exponent(std::nextafter(float(mx), INFINITY), k, 0) == -1);
    CHECK(fp8_scale_exponent(0.0f, k, 0) == 0);
    CHECK(fp8_scale_exponent(INFINITY, k, 0) == 0);
    CHECK(fp8_scale_exponent(std::nanf(""), k, 0) == 0);
  }
}

namespace {
// The backend FP8 ops on `be` (device memory on the emulated device) for x
// (R, C) bf16: amax, scale, q, qt and the dequantized values, on the host.
struct OpsOut {
  float amax = 0, scale = 0;
  std::vector<uint8_t> q, qt;
  std::vector<float> deq;
};
OpsOut run_ops(Backend& be, const std::vector<bf16_bits>& x, int64_t R, int64_t C, DType qdt) {
  Buffer bx(be, x.size() * 2), ba(be, 4), bs(be, 4), bq(be, x.size()), bqt(be, x.size()),
      bd(be, x.size() * 4);
  be.to_device(bx.data(), x.data(), x.size() * 2);
  const Tensor tx(bx.data(), DType::BF16, {R, C}), ta(ba.data(), DType::F32, {1}),
      ts(bs.data(), DType::F32, {1}), tq(bq.data(), qdt, {R, C}), tqt(bqt.data(), qdt, {C, R}),
      td(bd.data(), DType::F32, {R, C});
  be.fp8_amax(ta, tx, false);
  be.fp8_scale(ts, ta, qdt == DType::E4M3 ? Fp8Kind::E4M3 : Fp8Kind::E5M2, 1);
  be.fp8_quantize(tq, tqt, tx, ts);
  be.fp8_dequantize(td, tq, ts);
  OpsOut o;
  o.q.resize(x.size());
  o.qt.resize(x.size());
  o.deq.resize(x.size());
  be.to_host(&o.amax, ba.data(), 4);
  be.to_host(&o.scale, bs.data(), 4);
  be.to_host(o.q.data(), bq.data(), x.size());
  be.to_host(o.qt.data(), bqt.data(), x.size());
  be.to_host(o.deq.data(), bd.data(), x.size() * 4);
  return o;
}
}  // namespace

TEST_CASE("fp8: backend ops equal the scalar casts (CPU and emulated device)", "[fp8]") {
  const int64_t R = 37, C = 53;
  Rng rng(3);
  std::vector<bf16_bits> x(size_t(R * C));
  float amax = 0;
  for (auto& v : x) {
    v = float_to_bf16(float(rng.normal() * 0.03));
    amax = std::max(amax, std::fabs(bf16_to_float(v)));
  }
  CpuBackend cpu;
  EmulatedBackend emu(size_t(1) << 26);
  for (DType qdt : {DType::E4M3, DType::E5M2}) {
    const Fp8Kind k = qdt == DType::E4M3 ? Fp8Kind::E4M3 : Fp8Kind::E5M2;
    const OpsOut c = run_ops(cpu, x, R, C, qdt), e = run_ops(emu, x, R, C, qdt);
    CHECK(c.amax == amax);
    CHECK(c.scale == pow2f(fp8_scale_exponent(amax, k, 1)));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < C; ++j) {
        const size_t i = size_t(r * C + j);
        const uint8_t want = float_to_fp8(bf16_to_float(x[i]) * c.scale, k);
        REQUIRE(c.q[i] == want);
        REQUIRE(c.qt[size_t(j * R + r)] == want);
        REQUIRE(c.deq[i] == fp8_to_float(want, k) / c.scale);
      }
    CHECK(e.amax == c.amax);
    CHECK(e.scale == c.scale);
    CHECK(e.q == c.q);
    CHECK(e.qt == c.qt);
    CHECK(std::memcmp(e.deq.data(), c.deq.data(), c.deq.size() * 4) == 0);
  }
  // Accumulating amax keeps the larger; a NaN wins.
  float big = 100.0f, host[2] = {0, 0};
  Buffer ba(cpu, 4);
  std::memcpy(ba.data(), &big, 4);
  std::vector<bf16_bits> y = {float_to_bf16(1.0f), float_to_bf16(-2.0f)};
  cpu.fp8_amax(Tensor(ba.data(), DType::F32, {1}), Tensor(y.data(), DType::BF16, {2}), true);
  std::memcpy(host, ba.data(), 4);
  CHECK(host[0] == 100.0f);
  y[1] = float_to_bf16(std::nanf(""));
  cpu.fp8_amax(Tensor(ba.data(), DType::F32, {1}), Tensor(y.data(), DType::BF16, {2}), true);
  std::memcpy(host, ba.data(), 4);
  CHECK(std::isnan(host[0]));
  // A wrong dtype is named.
  CHECK_THROWS_WITH(cpu.fp8_quantize(Tensor(y.data(), DType::BF16, {2}), Tensor(),
                                     Tensor(y.data(), DType::BF16, {2}),
                                     Tensor(ba.data(), DType::F32, {1})),
                    Contains("not e4m3 or e5m2"));
}

TEST_CASE("fp8: an FP8 linear layer is the fp32 GEMM of its quantized operands", "[fp8]") {
  const int64_t N = 24, I = 40, O = 16;
  Rng rng(9);
  auto fill = [&](int64_t n, double sd) {
    std::vector<bf16_bits> v{}; v.resize(size_t(n));
    for (auto& e : v) e = float_to_bf16(float(rng.normal() * sd));
    return v;
  };
  const std::vector<bf16_bits> x = fill(N * I, 1.0), w = fill(O * I, 0.05), dy = fill(N * O, 1e-3);
  // The reference: per-tensor power-of-two scales from the amax, then doubles.
  auto q = [](const std::vector<bf16_bits>& t, Fp8Kind k) {
    float a = 0;
    for (auto e : t) a = std::max(a, std::fabs(bf16_to_float(e)));
    const float s = pow2f(fp8_scale_exponent(a, k, 0));
    std::vector<double> r(t.size());
    for (size_t i = 0; i < t.size(); ++i)
      r[i] = double(fp8_to_float(float_to_fp8(bf16_to_float(t[i]) * s, k), k)) / double(s);
    return r;
  };
  for (const char* fmt : {"hybrid", "e4m3"}) {
    TrainConfig tc;
    tc.dtype = "fp8";
    tc.fp8_format = fmt;
    const Fp8Options o = fp8_options(tc);
    const std::vector<double> xq = q(x, Fp8Kind::E4M3), wq = q(w, Fp8Kind::E4M3),
                              dyq = q(dy, o.grad_kind);
    CpuBackend be;
    Fp8Linears lin(be, o, nullptr, nullptr);
    const int site = lin.add_site(3, O, I);
    std::vector<bf16_bits> y(size_t(N * O)), dx(size_t(N * I));
    std::vector<float> dw(size_t(O * I), 0.0f);
    lin.forward(site, Tensor(y.data(), DType::BF16, {N, O}),
                Tensor(const_cast<bf16_bits*>(x.data()), DType::BF16, {N, I}),
                Tensor(const_cast<bf16_bits*>(w.data()), DType::BF16, {O, I}));
    lin.backward(site, Tensor(dx.data(), DType::BF16, {N, I}), Tensor(dw.data(), DType::F32, {O, I}),
                 Tensor(const_cast<bf16_bits*>(dy.data()), DType::BF16, {N, O}),
                 Tensor(const_cast<bf16_bits*>(x.data()), DType::BF16, {N, I}),
                 Tensor(const_cast<bf16_bits*>(w.data()), DType::BF16, {O, I}), false);
    // Outputs: bf16 (y, dx) of an fp32 sum of exact products; within one
    // bf16 rounding plus fp32 summation of the double reference.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < O; ++j) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < I; ++i) {
          ref += xq[size_t(n * I + i)] * wq[size_t(j * I + i)];
          mag += std::fabs(xq[size_t(n * I + i)] * wq[size_t(j * I + i)]);
        }
        REQUIRE(std::fabs(double(bf16_to_float(y[size_t(n * O + j)])) - ref) <=
                std::fabs(ref) * 0x1p-8 + mag * 1e-6);
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < I; ++i) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < O; ++j) {
          ref += dyq[size_t(n * O + j)] * wq[size_t(j * I + i)];
          mag += std::fabs(dyq[size_t(n * O + j)] * wq[size_t(j * I + i)]);
        }
        REQUIRE(std::fabs(double(bf16_to_float(dx[size_t(n * I + i)])) - ref) <=
                std::fabs(ref) * 0x1p-8 + mag * 1e-6);
      }
    for (int64_t j = 0; j < O; ++j)
      for (int64_t i = 0; i < I; ++i) {
        double ref = 0, mag = 0;
        for (int64_t n = 0; n < N; ++n) {
          ref += dyq[size_t(n * O + j)] * xq[size_t(n * I + i)];
          mag += std::fabs(dyq[size_t(n * O + j)] * xq[size_t(n * I + i)]);
        }
        REQUIRE(std::fabs(double(dw[size_t(j * I + i)]) - ref) <= mag * 1e-6);
      }
    // Not the bf16 GEMM: FP8 rounding shows (a test that cannot tell would pass both).
    std::vector<bf16_bits> yb(size_t(N * O));
    be.linear_forward(Tensor(yb.data(), DType::BF16, {N, O}),
                      Tensor(const_cast<bf16_bits*>(x.data()), DType::BF16, {N, I}),
                      Tensor(const_cast<bf16_bits*>(w.data()), DType::BF16, {O, I}));
    CHECK(yb != y);
  }
}

namespace {
using Vd = std::vector<double>;
double bf(double v) { return double(bf16_to_float(float_to_bf16(float(v)))); }
// v's values after the per-tensor power-of-two cast (or unchanged: !on).
Vd fq(const Vd& v, Fp8Kind k, bool on) {
  if (!on) return v;
  float a = 0;
  for (double e : v) a = std::max(a, std::fabs(float(e)));
  const float sc = pow2f(fp8_scale_exponent(a, k, 0));
  Vd r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = double(fp8_to_float(float_to_fp8(float(v[i]) * sc, k), k)) / double(sc);
  return r;
}
// (n, o) = a (n, i) b (o, i)^T, each result rounded to bf16 when `round`.
Vd mm_t(const Vd& a, const Vd& b, int64_t n, int64_t i, int64_t o, bool round) {
  Vd r(size_t(n * o), 0.0);
  for (int64_t x = 0; x < n; ++x)
    for (int64_t y = 0; y < o; ++y) {
      double s = 0;
      for (int64_t z = 0; z < i; ++z) s += a[size_t(x * i + z)] * b[size_t(y * i + z)];
      r[size_t(x * o + y)] = round ? bf(s) : s;
    }
  return r;
}
Vd transpose(const Vd& a, int64_t r, int64_t c) {
  Vd t(a.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t[size_t(j * r + i)] = a[size_t(i * c + j)];
  return t;
}
double rel_err(const Vd& a, const Vd& ref) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) n += (a[i] - ref[i]) * (a[i] - ref[i]), d += ref[i] * ref[i];
  return std::sqrt(n / d);
}
Vd slice(const Vd& v, int64_t off, int64_t n) {
  return Vd(v.begin() + std::ptrdiff_t(off), v.begin() + std::ptrdiff_t(off + n));
}
}  // namespace

// Two experts, top-2 of 2 and a zero router (every token to both experts with
// weight 1/2, no router gradient into dx), expert 1's weights 8x expert 0's
// (a scale shared between experts would saturate one or flush the other):
// the layer's output, dx and every expert's dw1, dw3, dw2 against a double
// reference that casts each expert's operands at their own amax (x, w1, w3
// or the fused w13, w2 and h in E4M3; the output gradients dy and the
// SwiGLU's dg, du in E5M2) and rounds the GEMM outputs to bf16; the same
// reference without the casts is far off (the test can tell FP8 from bf16).
TEST_CASE("fp8: the MoE experts' GEMMs cast each expert's operands at their own scales", "[fp8][moe]") {
  const int64_t N = 13, C = 32, F = 16, E = 2;
  Rng rng(21);
  for (const bool fused : {false, true}) {
    INFO("fused gate/up " << fused);
    // Weights, bf16: w13 (E, 2F, C) = w1 rows then w3 rows, w2 (E, C, F).
    Vd x(size_t(N * C)), w13(size_t(E * 2 * F * C)), w2(size_t(E * C * F)), dout(size_t(N * C));
    for (auto& v : x) v = bf(rng.normal());
    for (int64_t e = 0; e < E; ++e) {
      const double s = e ? 0.8 : 0.1;
      for (int64_t i = 0; i < 2 * F * C; ++i) w13[size_t(e * 2 * F * C + i)] = bf(s * rng.normal());
      for (int64_t i = 0; i < C * F; ++i) w2[size_t(e * C * F + i)] = bf(s * rng.normal());
    }
    for (auto& v : dout) v = bf(1e-2 * rng.normal());
    auto to_bf = [](const Vd& v) {
      std::vector<bf16_bits> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(float(v[i]));
      return b;
    };
    TrainConfig tc;
    tc.dtype = "fp8";
    const Fp8Options o = fp8_options(tc);
    struct Got {
      std::vector<bf16_bits> out, dx;
      std::vector<float> g13, g2;
    };
    // rows: a multiple rows are padded to (16: as on CUDA, N = 13 rows padded).
    auto run = [&](int64_t rows) {
      std::vector<bf16_bits> xb = to_bf(x), w13b = to_bf(w13), w2b = to_bf(w2), db = to_bf(dout),
                             gate(size_t(E * C), 0);
      Got r{std::vector<bf16_bits>(size_t(N * C)), std::vector<bf16_bits>(size_t(N * C), 0),
            std::vector<float>(w13.size(), 0.0f), std::vector<float>(w2.size(), 0.0f)};
      std::vector<float> ggate(size_t(E * C), 0.0f);
      MoeParams p, g;
      p.gate = Tensor(gate.data(), DType::BF16, {E, C});
      g.gate = Tensor(ggate.data(), DType::F32, {E, C});
      for (int64_t e = 0; e < E; ++e) {
        bf16_bits* w = w13b.data() + e * 2 * F * C;
        float* gw = r.g13.data() + e * 2 * F * C;
        p.w1.push_back(Tensor(w, DType::BF16, {F, C}));
        p.w3.push_back(Tensor(w + F * C, DType::BF16, {F, C}));
        p.w2.push_back(Tensor(w2b.data() + e * C * F, DType::BF16, {C, F}));
        g.w1.push_back(Tensor(gw, DType::F32, {F, C}));
        g.w3.push_back(Tensor(gw + F * C, DType::F32, {F, C}));
        g.w2.push_back(Tensor(r.g2.data() + e * C * F, DType::F32, {C, F}));
        if (fused) {
          p.w13.push_back(Tensor(w, DType::BF16, {2 * F, C}));
          g.w13.push_back(Tensor(gw, DType::F32, {2 * F, C}));
        }
      }
      CpuBackend be;
      Fp8Linears lin(be, o, nullptr, nullptr);
      lin.set_row_multiple(rows);
      MoeLayer moe(be, DType::BF16, N, C, F, MoeOptions{.n_experts = E, .top_k = 2, .aux_loss_coef = 0});
      std::vector<int> sites(size_t(3 * E), -1);
      for (int64_t e = 0; e < E; ++e) {
        sites[size_t(3 * e)] = lin.add_site(-1 - 3 * e, fused ? 2 * F : F, C, false);
        if (!fused) sites[size_t(3 * e + 1)] = lin.add_site(-2 - 3 * e, F, C, false);
        sites[size_t(3 * e + 2)] = lin.add_site(-3 - 3 * e, C, F, false);
      }
      moe.set_fp8(&lin, sites);
      const int slot = moe.add_slot();
      moe.forward(slot, Tensor(r.out.data(), DType::BF16, {N, C}), Tensor(xb.data(), DType::BF16, {N, C}), p);
      moe.backward(slot, Tensor(r.dx.data(), DType::BF16, {N, C}), p, g,
                   Tensor(db.data(), DType::BF16, {N, C}), 1.0);
      return r;
    };
    const Got got = run(1), padded = run(16);
    // Padding the rows to 16 (zero rows in copies) changes no output row (y,
    // dx bit for bit); dw sums over the rows, where the zero rows change
    // only the GEMM's blocking, so fp32 summation order (BLAS kernels for
    // K = 13 and K = 16 differ).
    CHECK(padded.out == got.out);
    CHECK(padded.dx == got.dx);
    auto rel32 = [](const std::vector<float>& a, const std::vector<float>& b) {
      double n = 0, d = 0;
      for (size_t i = 0; i < a.size(); ++i) n += double(a[i] - b[i]) * (a[i] - b[i]), d += double(b[i]) * b[i];
      return std::sqrt(n / d);
    };
    CHECK(rel32(padded.g13, got.g13) <= 1e-6);
    CHECK(rel32(padded.g2, got.g2) <= 1e-6);
    auto from_bf = [](const std::vector<bf16_bits>& b) {
      Vd v(b.size());
      for (size_t i = 0; i < b.size(); ++i) v[i] = double(bf16_to_float(b[i]));
      return v;
    };
    const Vd got_out = from_bf(got.out), got_dx = from_bf(got.dx);
    const std::vector<float>& g13 = got.g13;
    const std::vector<float>& g2 = got.g2;

    struct Ref {
      Vd out, dx, dw13, dw2;
    };
    auto reference = [&](bool q) {
      const Fp8Kind G = o.grad_kind, K = Fp8Kind::E4M3;
      Ref r;
      r.out.assign(size_t(N * C), 0.0);
      r.dx.assign(size_t(N * C), 0.0);
      r.dw13.assign(w13.size(), 0.0);
      r.dw2.assign(w2.size(), 0.0);
      const Vd xq = fq(x, K, q), dy = [&] {  // the combine's backward: dout / 2 per expert
        Vd d(dout.size());
        for (size_t i = 0; i < d.size(); ++i) d[i] = bf(0.5 * dout[i]);
        return d;
      }();
      const Vd dyq = fq(dy, G, q);
      Vd dxs(size_t(N * C), 0.0);
      for (int64_t e = 0; e < E; ++e) {
        const Vd w13e = slice(w13, e * 2 * F * C, 2 * F * C), w2q = fq(slice(w2, e * C * F, C * F), K, q);
        Vd w1q, w3q;
        if (fused) {
          const Vd w = fq(w13e, K, q);
          w1q = slice(w, 0, F * C), w3q = slice(w, F * C, F * C);
        } else {
          w1q = fq(slice(w13e, 0, F * C), K, q), w3q = fq(slice(w13e, F * C, F * C), K, q);
        }
        const Vd gg = mm_t(xq, w1q, N, C, F, true), uu = mm_t(xq, w3q, N, C, F, true);
        Vd h(size_t(N * F)), sg(size_t(N * F));
        for (size_t i = 0; i < h.size(); ++i) {
          sg[i] = 1.0 / (1.0 + std::exp(-gg[i]));
          h[i] = bf(gg[i] * sg[i] * uu[i]);
        }
        const Vd hq = fq(h, K, q), y = mm_t(hq, w2q, N, F, C, true);
        for (size_t i = 0; i < y.size(); ++i) r.out[i] += 0.5 * y[i];
        // Backward: dh = dy w2, dw2 = dy^T h; the SwiGLU; dx = dg w1 + du w3.
        const Vd dh = mm_t(dyq, transpose(w2q, C, F), N, C, F, true);
        const Vd dw2 = mm_t(transpose(dyq, N, C), transpose(hq, N, F), C, N, F, false);
        std::copy(dw2.begin(), dw2.end(), r.dw2.begin() + std::ptrdiff_t(e * C * F));
        Vd dg(h.size()), du(h.size());
        for (size_t i = 0; i < h.size(); ++i) {
          dg[i] = bf(dh[i] * uu[i] * sg[i] * (1.0 + gg[i] * (1.0 - sg[i])));
          du[i] = bf(dh[i] * gg[i] * sg[i]);
        }
        Vd dgq, duq;
        if (fused) {  // one cast of the packed (N, 2F) gradient
          Vd pk(size_t(N * 2 * F));
          for (int64_t n = 0; n < N; ++n)
            for (int64_t f = 0; f < F; ++f) {
              pk[size_t(n * 2 * F + f)] = dg[size_t(n * F + f)];
              pk[size_t(n * 2 * F + F + f)] = du[size_t(n * F + f)];
            }
          pk = fq(pk, G, q);
          dgq.resize(dg.size()), duq.resize(du.size());
          for (int64_t n = 0; n < N; ++n)
            for (int64_t f = 0; f < F; ++f) {
              dgq[size_t(n * F + f)] = pk[size_t(n * 2 * F + f)];
              duq[size_t(n * F + f)] = pk[size_t(n * 2 * F + F + f)];
            }
        } else {
          dgq = fq(dg, G, q), duq = fq(du, G, q);
        }
        const Vd dx1 = mm_t(dgq, transpose(w1q, F, C), N, F, C, true),
                 dx3 = mm_t(duq, transpose(w3q, F, C), N, F, C, true);
        for (size_t i = 0; i < dxs.size(); ++i) r.dx[i] += bf(dx1[i] + dx3[i]);
        const Vd dw1 = mm_t(transpose(dgq, N, F), transpose(xq, N, C), F, N, C, false),
                 dw3 = mm_t(transpose(duq, N, F), transpose(xq, N, C), F, N, C, false);
        std::copy(dw1.begin(), dw1.end(), r.dw13.begin() + std::ptrdiff_t(e * 2 * F * C));
        std::copy(dw3.begin(), dw3.end(), r.dw13.begin() + std::ptrdiff_t(e * 2 * F * C + F * C));
      }
      return r;
    };
    const Ref ref = reference(true), plain = reference(false);
    const Vd got_dw13(g13.begin(), g13.end()), got_dw2(g2.begin(), g2.end());
    struct Item {
      const char* what;
      Vd got, ref, plain;
    };
    std::vector<Item> items = {{"out", got_out, ref.out, plain.out}, {"dx", got_dx, ref.dx, plain.dx}};
    for (int64_t e = 0; e < E; ++e) {
      items.push_back({e ? "expert 1 dw1" : "expert 0 dw1", slice(got_dw13, e * 2 * F * C, F * C),
                       slice(ref.dw13, e * 2 * F * C, F * C), slice(plain.dw13, e * 2 * F * C, F * C)});
      items.push_back({e ? "expert 1 dw3" : "expert 0 dw3", slice(got_dw13, e * 2 * F * C + F * C, F * C),
                       slice(ref.dw13, e * 2 * F * C + F * C, F * C),
                       slice(plain.dw13, e * 2 * F * C + F * C, F * C)});
      items.push_back({e ? "expert 1 dw2" : "expert 0 dw2", slice(got_dw2, e * C * F, C * F),
                       slice(ref.dw2, e * C * F, C * F), slice(plain.dw2, e * C * F, C * F)});
    }
    for (const Item& it : items) {
      const double err = rel_err(it.got, it.ref), far = rel_err(it.got, it.plain);
      INFO(it.what << ": against the FP8 reference " << err << ", against the reference without casts "
                   << far);
      // y, dx: one bf16 rounding more or less of an operand (the reference
      // rounds where the backend does, but sums in another order) can move
      // its FP8 code; dw is the fp32 sum of exact products of the same codes.
      const bool dw = std::strstr(it.what, "dw") != nullptr;
      CHECK(err < (dw ? 1e-6 : 8e-3));
      CHECK(far > 4 * err);
      CHECK(far > 1e-2);
    }
  }
}

// ZeRO-3 (Fp8Options::cache_weights false) casts the weights at every use
// into one scratch: the same codes as the cached cast, so the same numbers,
// with two sites sharing the scratch and after the weights change.
TEST_CASE("fp8: uncached weight codes (ZeRO-3) give the cached numbers", "[fp8]") {
  const int64_t N = 16, I = 24, O = 8;
  Rng rng(5);
  auto fill = [&](int64_t n, double sd) {
    std::vector<bf16_bits> v(static_cast<size_t>(n));
    for (auto& e : v) e = float_to_bf16(float(rng.normal() * sd));
    return v;
  };
  std::vector<bf16_bits> x = fill(N * I, 1.0), w = fill(O * I, 0.05), w2 = fill(O * I, 3.0),
                         dy = fill(N * O, 1e-3);
  auto run = [&](bool cache) {
    TrainConfig tc;
    tc.dtype = "fp8";
    Fp8Options o = fp8_options(tc);
    o.cache_weights = cache;
    CpuBackend be;
    Fp8Linears lin(be, o, nullptr, nullptr);
    const int a = lin.add_site(0, O, I), b = lin.add_site(1, O, I);
    std::vector<bf16_bits> y(size_t(4 * N * O)), dx(size_t(2 * N * I));
    std::vector<float> dw(size_t(O * I), 0.0f);
    auto T = [](void* p, int64_t r, int64_t c, DType d) { return Tensor(p, d, {r, c}); };
    for (int pass = 0; pass < 2; ++pass) {  // the second after the weights changed
      std::vector<bf16_bits>& wa = pass ? w2 : w;
      lin.invalidate_weights();
      lin.forward(a, T(y.data() + pass * 2 * N * O, N, O, DType::BF16), T(x.data(), N, I, DType::BF16),
                  T(wa.data(), O, I, DType::BF16));
      lin.forward(b, T(y.data() + (pass * 2 + 1) * N * O, N, O, DType::BF16),
                  T(x.data(), N, I, DType::BF16), T(w.data(), O, I, DType::BF16));
      lin.backward(a, T(dx.data() + pass * N * I, N, I, DType::BF16), T(dw.data(), O, I, DType::F32),
                   T(dy.data(), N, O, DType::BF16), T(x.data(), N, I, DType::BF16),
                   T(wa.data(), O, I, DType::BF16), false);
    }
    return std::make_tuple(y, dx, dw);
  };
  const auto cached = run(true), uncached = run(false);
  CHECK(std::get<0>(uncached) == std::get<0>(cached));
  CHECK(std::get<1>(uncached) == std::get<1>(cached));
  CHECK(std::get<2>(uncached) == std::get<2>(cached));
  // The weights' change shows in the outputs (the check is not vacuous).
  CHECK(!std::equal(std::get<0>(cached).begin(), std::get<0>(cached).begin() + N * O,
                    std::get<0>(cached).begin() + 2 * N * O));
}

TEST_CASE("fp8: delayed scaling takes the largest amax of the history", "[fp8]") {
  CpuBackend be;
  TrainConfig tc;
  tc.dtype = "fp8";
  tc.fp8_recipe = "delayed";
  tc.fp8_amax_history = 3;
  Fp8Linears lin(be, fp8_options(tc), nullptr, nullptr);
  const int site = lin.add_site(0, 2, 2);
  const int idle = lin.add_site(8, 2, 2);  // no GEMM until the end (an expert no token reached)
  std::vector<bf16_bits> w = {float_to_bf16(1), float_to_bf16(0), float_to_bf16(0), float_to_bf16(1)};
  std::vector<bf16_bits> y(4);
  auto step = [&](float xval) {
    std::vector<bf16_bits> x = {float_to_bf16(xval), 0, 0, float_to_bf16(xval / 8)};
    lin.invalidate_weights();
    lin.begin_step();
    lin.forward(site, Tensor(y.data(), DType::BF16, {2, 2}), Tensor(x.data(), DType::BF16, {2, 2}),
                Tensor(w.data(), DType::BF16, {2, 2}));
    lin.end_step({});
  };
  // Step 1 (no history): current scaling. Then amaxes 1, 100, 2, 3: the
  // history holds the last three.
  step(1.0f);
  CHECK(lin.history_steps() == 1);
  step(100.0f);
  step(2.0f);
  step(3.0f);
  std::vector<double> h = lin.history();  // (1 site, 2, 3), oldest first
  CHECK(h[0] == 100.0);
  CHECK(h[1] == 2.0);
  CHECK(h[2] == 3.0);
  // The next step's input scale comes from 100 (2^2 * 100 <= 448): a value
  // of 0.3 at that scale is 1.2 -> E4M3 1.25 -> 0.3125, not the 0.3 that
  // current scaling (2^10) would nearly keep.
  lin.invalidate_weights();
  lin.begin_step();
  std::vector<bf16_bits> x = {float_to_bf16(0.3f), 0, 0, 0};
  lin.forward(site, Tensor(y.data(), DType::BF16, {2, 2}), Tensor(x.data(), DType::BF16, {2, 2}),
              Tensor(w.data(), DType::BF16, {2, 2}));
  CHECK(bf16_to_float(y[0]) == 0.3125f);
  // A non-finite step leaves the history as it was.
  lin.end_step({});
  x[0] = float_to_bf16(INFINITY);
  lin.begin_step();
  lin.forward(site, Tensor(y.data(), DType::BF16, {2, 2}), Tensor(x.data(), DType::BF16, {2, 2}),
              Tensor(w.data(), DType::BF16, {2, 2}));
  const int64_t before = lin.history_steps();
  lin.end_step({});
  CHECK(lin.history_steps() == before);
  // A site whose window holds no amax scales from the current one: 1000 at
  // 2^-2 is 250 -> E4M3 256 -> 1024 (from the empty history's scale 1 it
  // would saturate to 448).
  lin.begin_step();
  x = {float_to_bf16(1000.0f), 0, 0, 0};
  lin.forward(idle, Tensor(y.data(), DType::BF16, {2, 2}), Tensor(x.data(), DType::BF16, {2, 2}),
              Tensor(w.data(), DType::BF16, {2, 2}));
  CHECK(bf16_to_float(y[0]) == 1024.0f);
  lin.end_step({});
  // set_history round-trips.
  Fp8Linears other(be, fp8_options(tc), nullptr, nullptr);
  other.add_site(0, 2, 2);
  other.add_site(8, 2, 2);
  other.set_history(lin.history(), lin.history_steps());
  CHECK(other.history() == lin.history());
}

TEST_CASE("cuda: FP8 ops against the CPU (casts bitwise, GEMMs to fp32 summation; rows padded)", "[cuda][fp8]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device visible: CUDA FP8 ops skipped");
    return;
  }
  auto gpu = make_backend("cuda");
  if (!gpu->fp8_unsupported().empty()) {
    WARN(gpu->fp8_unsupported());
    return;
  }
  CpuBackend cpu;
  const int64_t I = 96, O = 48;
  Rng rng(21);
  // 13 rows: padded to 16 for cuBLASLt (an expert's GEMM), not on the CPU.
  for (const int64_t N : {int64_t(64), int64_t(13)}) {
  INFO(N << " rows");
  auto host = [&](int64_t n, double sd) {
    std::vector<bf16_bits> v{};
    v.resize(size_t(n));
    for (auto& e : v) e = float_to_bf16(float(rng.normal() * sd));
    return v;
  };
  const std::vector<bf16_bits> x = host(N * I, 1.0), w = host(O * I, 0.05), dy = host(N * O, 1e-3);
  // The same Fp8Linears on both backends: forward, backward (dx, dw).
  struct Out {
    std::vector<bf16_bits> y, dx;
    std::vector<float> dw;
  };
  auto run = [&](Backend& be) {
    auto dev = [&](const std::vector<bf16_bits>& h, Buffer& b) {
      b = Buffer(be, h.size() * 2);
      be.to_device(b.data(), h.data(), h.size() * 2);
      return b.data();
    };
    Buffer bx, bw, bdy, by(be, size_t(N * O) * 2), bdx(be, size_t(N * I) * 2), bdw(be, size_t(O * I) * 4);
    be.zero(Tensor(bdw.data(), DType::F32, {O * I}));
    const Tensor tx(dev(x, bx), DType::BF16, {N, I}), tw(dev(w, bw), DType::BF16, {O, I}),
        tdy(dev(dy, bdy), DType::BF16, {N, O});
    TrainConfig tc;
    tc.dtype = "fp8";
    Fp8Linears lin(be, fp8_options(tc), nullptr, nullptr);
    const int site = lin.add_site(0, O, I);
    lin.forward(site, Tensor(by.data(), DType::BF16, {N, O}), tx, tw);
    lin.backward(site, Tensor(bdx.data(), DType::BF16, {N, I}), Tensor(bdw.data(), DType::F32, {O, I}),
                 tdy, tx, tw, false);
    Out o;
    o.y.resize(size_t(N * O));
    o.dx.resize(size_t(N * I));
    o.dw.resize(size_t(O * I));
    be.to_host(o.y.data(), by.data(), o.y.size() * 2);
    be.to_host(o.dx.data(), bdx.data(), o.dx.size() * 2);
    be.to_host(o.dw.data(), bdw.data(), o.dw.size() * 4);
    return o;
  };
  const Out c = run(cpu), g = run(*gpu);
  // bf16 outputs of fp32 sums in another order: at most one bf16 ulp apart.
  auto close16 = [](const std::vector<bf16_bits>& a, const std::vector<bf16_bits>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      const float u = bf16_to_float(a[i]), v = bf16_to_float(b[i]);
      if (std::fabs(u - v) > std::fabs(v) * 0x1p-7 + 1e-30f) return false;
    }
    return true;
  };
  CHECK(close16(g.y, c.y));
  CHECK(close16(g.dx, c.dx));
  double num = 0, den = 0;
  for (size_t i = 0; i < c.dw.size(); ++i) {
    num += double(g.dw[i] - c.dw[i]) * double(g.dw[i] - c.dw[i]);
    den += double(c.dw[i]) * double(c.dw[i]);
  }
  // Hopper's FP8 tensor cores accumulate in limited precision between
  // cuBLASLt's fp32 promotions (fast accumulation is off): a bound well above
  // fp32 summation order (~1e-7 here), well below an FP8 step (2^-4).
  std::printf("cuda fp8 GEMM vs cpu emulation, %lld rows: dw relative error %.3e\n", (long long)N,
              std::sqrt(num / den));
  CHECK(std::sqrt(num / den) <= 1e-3);
  }
}
