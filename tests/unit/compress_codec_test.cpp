// Gradient compression's codecs (parallel/compress/, docs/compression.md):
// round-trip error bounds against the block scale computed here
// independently, exactness where the format represents the input, error
// feedback's conservation of mass (f64 bookkeeping), and PowerSGD's algebra.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/bf16.hpp"
#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/powersgd.hpp"

using namespace adgt;
using namespace adgt::compress;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

std::vector<float> round_trip(Level l, const std::vector<float>& x) {
  std::vector<uint8_t> enc(size_t(encoded_bytes(l, int64_t(x.size()))));
  encode(l, x.data(), int64_t(x.size()), enc.data());
  std::vector<float> y(x.size());
  decode(l, enc.data(), int64_t(x.size()), y.data());
  return y;
}

// The block scale computed from the inputs (independent of the codec's).
double block_scale(const std::vector<float>& x, size_t b, int qmax) {
  double amax = 0;
  for (size_t i = b * kBlock; i < std::min(x.size(), (b + 1) * size_t(kBlock)); ++i)
    amax = std::max(amax, std::fabs(double(x[i])));
  return amax / qmax;
}

// int2's block scale computed from the inputs: the rms in long double
// (times c: int3's candidate steps), rounded to bf16 to nearest, ties to
// even, by hand (not the codec's code).
double int2_scale(const std::vector<float>& x, size_t b, double c = 1.0) {
  long double sq = 0;
  size_t m = 0;
  for (size_t i = b * kBlock; i < std::min(x.size(), (b + 1) * size_t(kBlock)); ++i, ++m)
    sq += (long double)x[i] * x[i];
  const double r = double(std::sqrt(sq / (long double)m)) * c;
  if (r == 0) return 0;
  int e;
  std::frexp(r, &e);                            // r = f 2^e, f in [0.5, 1)
  const double ulp = std::ldexp(1.0, e - 8);    // bf16 keeps 8 significant bits
  const double k = r / ulp, fl = std::floor(k);
  const double q = k - fl > 0.5 || (k - fl == 0.5 && std::fmod(fl, 2.0) == 1.0) ? fl + 1 : fl;
  return q * ulp;
}

}  // namespace

TEST_CASE("compress: encoded sizes per level", "[compress]") {
  CHECK(encoded_bytes(Level::Bf16, 1000) == 2000);
  // 256-element blocks with an fp32 scale each: 4 blocks for 1000 elements.
  CHECK(encoded_bytes(Level::Int8, 1000) == 4 * 4 + 1000);
  CHECK(encoded_bytes(Level::Int4, 1000) == 4 * 4 + 500);
  CHECK(encoded_bytes(Level::Int4, 1001) == 4 * 4 + 501);
  CHECK(encoded_bytes(Level::Int8, 256 * 1024) == 1024 * 4 + 256 * 1024);  // 1.015625 B/element
  CHECK(encoded_bytes(Level::Int4, 256 * 1024) == 1024 * 4 + 128 * 1024); // 0.515625 B/element
  // int2: a bf16 scale per block, four elements per byte.
  CHECK(encoded_bytes(Level::Int2, 1000) == 4 * 2 + 250);
  CHECK(encoded_bytes(Level::Int2, 1001) == 4 * 2 + 251);
  CHECK(encoded_bytes(Level::Int2, 1) == 2 + 1);
  CHECK(encoded_bytes(Level::Int2, 256 * 1024) == 1024 * 2 + 64 * 1024);  // 0.2578125 B/element
  // int3: a bf16 step per block, 3 bits per element (8 elements in 3 bytes).
  CHECK(encoded_bytes(Level::Int3, 1000) == 4 * 2 + 375);
  CHECK(encoded_bytes(Level::Int3, 1001) == 4 * 2 + 376);  // 3003 bits
  CHECK(encoded_bytes(Level::Int3, 1) == 2 + 1);
  CHECK(encoded_bytes(Level::Int3, 256 * 1024) == 1024 * 2 + 96 * 1024);  // 0.3828125 B/element
}

namespace {
// Relative squared error of a round trip.
double rel_sq_error(Level l, const std::vector<float>& g) {
  const std::vector<float> h = round_trip(l, g);
  double e = 0, n = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    e += std::pow(double(h[i]) - g[i], 2);
    n += double(g[i]) * g[i];
  }
  return e / n;
}
}  // namespace

TEST_CASE("compress: int3 decodes to (q + 1/2) s with s the step its block's shape picks", "[compress]") {
  // Blocks of very different magnitudes and shapes (Gaussian, Laplacian,
  // heavy-tailed), and a short last block (1357 elements: codes straddle
  // bytes, the payload ends mid-byte).
  std::vector<float> x = randn(256 * 5 + 77, 15);
  std::mt19937 rng(18);
  std::exponential_distribution<float> ex(1.0f);
  for (size_t i = 256; i < 512; ++i) x[i] = x[i] > 0 ? ex(rng) : -ex(rng);  // Laplacian
  for (size_t i = 512; i < 768; i += 16) x[i] *= 30;                          // heavy tails
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, float(int(i / 256) - 2));
  const std::vector<float> y = round_trip(Level::Int3, x);
  const double cs[3] = {75.0 / 128.0, 0.75, 1.0};
  // The quantizer of step s written out here: floor(x / s) clamped to [-4, 3], + 1/2.
  auto q3 = [](double xi, double s) { return (std::min(3.0, std::max(-4.0, std::floor(xi / s))) + 0.5) * s; };
  std::vector<int> chosen(3, 0);
  for (size_t b = 0; b * 256 < x.size(); ++b) {
    const size_t lo = b * 256, hi = std::min(x.size(), lo + 256);
    long double sq = 0, ab = 0;
    for (size_t i = lo; i < hi; ++i) sq += (long double)x[i] * x[i], ab += std::fabs((long double)x[i]);
    const double kappa = double(ab / (hi - lo) / std::sqrt(sq / (hi - lo)));
    const int k = kappa >= 0.75 ? 0 : kappa >= 0.66 ? 1 : 2;
    ++chosen[size_t(k)];
    const double s = int2_scale(x, b, cs[k]);
    REQUIRE(s > 0);
    for (size_t i = lo; i < hi; ++i) {
      const double xi = x[i], yi = y[i];
      CHECK(yi == q3(xi, s));
      const double q = yi / s - 0.5;
      CHECK(q == std::floor(q));
      CHECK((q >= -4 && q <= 3));
      if (std::fabs(xi) <= 4 * s) CHECK(std::fabs(yi - xi) <= s / 2);
    }
  }
  // The Gaussian blocks take 75/128, the Laplacian one 3/4, the heavy-tailed one 1.
  CHECK(chosen[0] == 4);
  CHECK(chosen[1] == 1);
  CHECK(chosen[2] == 1);
  // Gaussian blocks: 0.0374 for the best uniform 8-level quantizer of N(0, 1)
  // (Max 1960); between int4's and int2's error on the same data.
  const std::vector<float> g = randn(256 * 400, 16, 1e-3f);
  const double e3 = rel_sq_error(Level::Int3, g);
  CHECK(e3 > 0.034);
  CHECK(e3 < 0.040);
  CHECK(rel_sq_error(Level::Int4, g) < e3);
  CHECK(e3 < rel_sq_error(Level::Int2, g));
  // Laplacian blocks (heavier tails): 0.070 in a numpy model of the codec,
  // where the Gaussian step alone gives 0.080.
  rng.seed(17);
  std::exponential_distribution<float> ex3(1000.0f);
  std::vector<float> lap(256 * 400);
  for (size_t i = 0; i < lap.size(); ++i) lap[i] = (i * 2654435761u >> 9) & 1 ? ex3(rng) : -ex3(rng);
  const double el = rel_sq_error(Level::Int3, lap);
  CHECK(el > 0.06);
  CHECK(el < 0.075);
}

TEST_CASE("compress: int3 blocks of its levels are exact; zero blocks stay zero", "[compress]") {
  // Blocks of the levels (q + 1/2) c whose step bf16(factor x rms) is c
  // (found by a search over the counts): 213 at +-3c/2 and 43 at +-5c/2
  // (mean |x| / rms >= 0.75: factor 75/128), then 174 at +-c/2, 58 at
  // +-3c/2, 2 at +-5c/2 and 22 at +-7c/2 (0.66 <= mean |x| / rms < 0.75:
  // factor 3/4), shuffled, signs random; then 40 zeros.
  const float c = std::ldexp(1.0f, -9);
  std::vector<float> x;
  std::mt19937 g(21);
  for (const std::vector<std::pair<int, float>>& counts :
       {std::vector<std::pair<int, float>>{{213, 1.5f}, {43, 2.5f}},
        std::vector<std::pair<int, float>>{{174, 0.5f}, {58, 1.5f}, {2, 2.5f}, {22, 3.5f}}}) {
    std::vector<float> blk;
    for (auto [n, l] : counts)
      for (int i = 0; i < n; ++i) blk.push_back((g() & 1 ? l : -l) * c);
    std::shuffle(blk.begin(), blk.end(), g);
    REQUIRE(blk.size() == 256);
    x.insert(x.end(), blk.begin(), blk.end());
  }
  x.resize(x.size() + 40, 0.0f);
  CHECK(round_trip(Level::Int3, x) == x);
  const std::vector<float> z(301, 0.0f);
  CHECK(round_trip(Level::Int3, z) == z);
}

TEST_CASE("compress: int2 decodes to (q + 1/2) s, within s/2 where |x| <= 2s", "[compress]") {
  // Blocks of very different magnitudes, heavy tails, and a short last block.
  std::vector<float> x = randn(256 * 5 + 77, 13);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, float(int(i / 256) - 2));
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 8;
  const std::vector<float> y = round_trip(Level::Int2, x);
  int64_t beyond = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = int2_scale(x, i / 256), xi = x[i], yi = y[i];
    REQUIRE(s > 0);
    // One of the four levels -3s/2, -s/2, s/2, 3s/2, exactly.
    const double q = yi / s;
    CHECK((q == -1.5 || q == -0.5 || q == 0.5 || q == 1.5));
    if (std::fabs(xi) <= 2 * s) {
      CHECK(std::fabs(yi - xi) <= s / 2);
      // The level of floor(x / s): the one below x (or x itself) + s/2.
      CHECK(yi - s / 2 <= xi);
      CHECK(xi < yi + s / 2 + 1e-12 * s);
    } else {
      CHECK(yi == (xi > 0 ? 1.5 * s : -1.5 * s));
      ++beyond;
    }
  }
  // s is the rms: at most a quarter of a block lies beyond 2s.
  CHECK(beyond <= 6 * 64);
  // Gaussian blocks: the relative squared error of a 4-level quantizer with
  // step sigma (0.1188 for a uniform 4-level quantizer of N(0, 1), Max 1960).
  const std::vector<float> g = randn(256 * 400, 14, 1e-3f);
  const std::vector<float> h = round_trip(Level::Int2, g);
  double e = 0, n = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    e += std::pow(double(h[i]) - g[i], 2);
    n += double(g[i]) * g[i];
  }
  CHECK(e / n > 0.10);
  CHECK(e / n < 0.13);
}

TEST_CASE("compress: int2 blocks of the four levels are exact; zero blocks stay zero", "[compress]") {
  // rms = c when 3/8 of the elements are +-3c/2 and 5/8 are +-c/2
  // (3/8 x 9/4 + 5/8 x 1/4 = 1): c = 2^-7 here, and blocks of 8k elements.
  const float c = std::ldexp(1.0f, -7);
  std::vector<float> x(256 * 2 + 40);
  for (size_t i = 0; i < x.size(); ++i) {
    const float mag = i % 8 < 3 ? 1.5f * c : 0.5f * c;
    x[i] = (i * 2654435761u >> 7) & 1 ? mag : -mag;
  }
  CHECK(round_trip(Level::Int2, x) == x);
  const std::vector<float> z(300, 0.0f);
  CHECK(round_trip(Level::Int2, z) == z);
}

TEST_CASE("compress: bf16 is exact for bf16 values, else within half an ulp (ties to even)", "[compress]") {
  std::vector<float> x = randn(3000, 1);
  for (float& v : x) v = round_to_bf16(v);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(INFINITY);
  const std::vector<float> y = round_trip(Level::Bf16, x);
  REQUIRE(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  const std::vector<float> z = randn(3000, 2);
  const std::vector<float> w = round_trip(Level::Bf16, z);
  for (size_t i = 0; i < z.size(); ++i) CHECK(std::fabs(w[i] - z[i]) <= std::fabs(z[i]) * std::ldexp(1.0, -8));
  // A tie goes to the even mantissa: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  CHECK(round_trip(Level::Bf16, {1.0f + std::ldexp(1.0f, -8)})[0] == 1.0f);
  CHECK(round_trip(Level::Bf16, {1.0f + 3 * std::ldexp(1.0f, -8)})[0] == 1.0f + std::ldexp(1.0f, -6));
}

TEST_CASE("compress: int8 and int4 round trips stay within half a block scale", "[compress]") {
  for (auto [l, qmax] : {std::pair<Level, int>{Level::Int8, 127}, {Level::Int4, 7}}) {
    INFO(level_name(l));
    // Blocks of very different magnitudes, and a short last block.
    std::vector<float> x = randn(256 * 5 + 77, 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, float(int(i / 256) - 2));
    const std::vector<float> y = round_trip(l, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = block_scale(x, i / 256, qmax);
      CHECK(std::fabs(double(y[i]) - double(x[i])) <= s / 2 * (1 + 1e-6));
      // The decoded value is an integer multiple of the scale, within the range.
      CHECK(std::fabs(double(y[i])) <= s * qmax * (1 + 1e-6));
    }
  }
}

TEST_CASE("compress: integer blocks with absmax qmax are exact; zero blocks stay zero", "[compress]") {
  std::vector<float> x(600);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 37 % 255) - 127);
  x[0] = 127;
  x[256] = -127;
  x[512] = 127;
  CHECK(round_trip(Level::Int8, x) == x);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 5 % 15) - 7);
  x[0] = 7;
  x[256] = -7;
  x[512] = 7;
  CHECK(round_trip(Level::Int4, x) == x);
  const std::vector<float> z(300, 0.0f);
  CHECK(round_trip(Level::Int8, z) == z);
  CHECK(round_trip(Level::Int4, z) == z);
}

TEST_CASE("compress: a non-finite element makes its block decode to NaN", "[compress]") {
  std::vector<float> x = randn(600, 4);
  x[300] = NAN;
  for (Level l : {Level::Int8, Level::Int4, Level::Int3, Level::Int2}) {
    INFO(level_name(l));
    const std::vector<float> y = round_trip(l, x);
    CHECK(std::isnan(y[256]));
    CHECK(std::isnan(y[511]));
    CHECK(std::isfinite(y[0]));
    CHECK(std::isfinite(y[512]));
  }
}

TEST_CASE("compress: chunk layout sends 1-D and small tensors exact", "[compress]") {
  std::vector<ParamSpec> t(4);
  t[0].shape = {64, 64}, t[0].numel = 4096, t[0].offset = 0;     // compressed
  t[1].shape = {64}, t[1].numel = 64, t[1].offset = 4096;        // 1-D: exact
  t[2].shape = {8, 8}, t[2].numel = 64, t[2].offset = 4160;      // small: exact
  t[3].shape = {100, 50}, t[3].numel = 5000, t[3].offset = 4224; // compressed
  const ChunkLayout c = chunk_layout(t, 1000, 5000, 4096);
  REQUIRE(c.exact.size() == 1);
  CHECK(c.exact[0] == std::pair<int64_t, int64_t>{3096, 3224});
  CHECK(c.exact_n == 128);
  CHECK(chunk_words(Level::Int8, c) == (128 * 4 + encoded_bytes(Level::Int8, 4000 - 128) + 3) / 4);
  // Encoded and decoded: exact elements bit for bit, the others within int8's bound.
  std::vector<float> v = randn(4000, 5);
  std::vector<uint8_t> enc(size_t(4 * chunk_words(Level::Int8, c)));
  std::vector<float> r(4000, 7.0f), y(4000);
  encode_chunk(Level::Int8, c, v.data(), enc.data(), r.data());
  decode_chunk(Level::Int8, c, enc.data(), y.data(), false);
  for (int64_t i = 3096; i < 3224; ++i) {
    CHECK(y[size_t(i)] == v[size_t(i)]);
    CHECK(r[size_t(i)] == 0.0f);
  }
  for (size_t i = 0; i < v.size(); ++i) CHECK(r[i] == v[i] - y[i]);
  // int2 and int3 send them as bf16, with error feedback: within half a bf16 ulp.
  CHECK(exact_elem_bytes(Level::Int2) == 2);
  CHECK(exact_elem_bytes(Level::Int3) == 2);
  CHECK(exact_elem_bytes(Level::Int4) == 4);
  CHECK(chunk_words(Level::Int2, c) == (128 * 2 + encoded_bytes(Level::Int2, 4000 - 128) + 3) / 4);
  std::vector<uint8_t> enc2(size_t(4 * chunk_words(Level::Int2, c)));
  encode_chunk(Level::Int2, c, v.data(), enc2.data(), r.data());
  decode_chunk(Level::Int2, c, enc2.data(), y.data(), false);
  for (int64_t i = 3096; i < 3224; ++i) {
    const float vi = v[size_t(i)], yi = y[size_t(i)];
    CHECK(std::fabs(yi - vi) <= std::fabs(vi) * std::ldexp(1.0, -8));
    CHECK(yi == round_to_bf16(vi));
  }
  for (size_t i = 0; i < v.size(); ++i) CHECK(r[i] == v[i] - y[i]);
}

TEST_CASE("compress: error feedback conserves mass over many steps (f64 bookkeeping)", "[compress]") {
  // sum of what was sent + the final residual = sum of the gradients.
  ChunkLayout c;
  c.n = 1000;
  ChunkLayout mixed = c;  // int2 again, with exact elements (bf16 with error feedback)
  mixed.exact = {{0, 40}, {500, 532}};
  mixed.exact_n = 72;
  for (auto [l, cl] : {std::pair<Level, ChunkLayout>{Level::Bf16, c}, {Level::Int8, c}, {Level::Int4, c},
                       {Level::Int3, c}, {Level::Int3, mixed}, {Level::Int2, c}, {Level::Int2, mixed}}) {
    INFO(level_name(l) << ", " << cl.exact_n << " exact elements");
    std::vector<float> res(1000, 0.0f), v(1000), dec(1000);
    std::vector<double> sent(1000, 0.0), total(1000, 0.0);
    std::vector<uint8_t> enc(size_t(4 * chunk_words(l, cl)));
    for (int step = 0; step < 300; ++step) {
      const std::vector<float> g = randn(1000, 100 + step, 1e-3f, 2e-4f);
      for (size_t i = 0; i < 1000; ++i) {
        total[i] += g[i];
        v[i] = g[i] + res[i];
      }
      encode_chunk(l, cl, v.data(), enc.data(), res.data());
      decode_chunk(l, cl, enc.data(), dec.data(), false);
      for (size_t i = 0; i < 1000; ++i) sent[i] += dec[i];
    }
    double err = 0, norm = 0, rnorm = 0;
    for (size_t i = 0; i < 1000; ++i) {
      err += std::pow(sent[i] + res[i] - total[i], 2);
      norm += total[i] * total[i];
      rnorm += double(res[i]) * res[i];
    }
    CHECK(std::sqrt(err / norm) < 1e-6);
    // And the residual stays bounded (it does not accumulate the gradients).
    CHECK(std::sqrt(rnorm / norm) < 0.05);
  }
}

TEST_CASE("compress: PowerSGD reconstructs a rank-r matrix exactly", "[compress]") {
  const int64_t m = 64, k = 48;
  const int r = 4;
  const std::vector<float> A = randn(size_t(m * r), 6), B = randn(size_t(k * r), 7);
  std::vector<float> M(size_t(m * k), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int c = 0; c < r; ++c) s += double(A[size_t(i * r + c)]) * B[size_t(j * r + c)];
      M[size_t(i * k + j)] = float(s);
    }
  std::vector<float> Q(size_t(k * r)), P(size_t(m * r)), Q2(size_t(k * r)), out(size_t(m * k));
  init_q(Q.data(), k, r, 42, "w");
  mat_mq(M.data(), m, k, Q.data(), r, P.data());
  orthonormalize(P.data(), m, r);
  mat_mtp(M.data(), m, k, P.data(), r, Q2.data());
  mat_pqt(P.data(), Q2.data(), m, k, r, out.data(), false);
  double err = 0, norm = 0;
  for (size_t i = 0; i < M.size(); ++i) {
    err += std::pow(double(out[i]) - M[i], 2);
    norm += double(M[i]) * M[i];
  }
  CHECK(std::sqrt(err / norm) < 1e-5);
  // Error feedback: residual = M - P Q'ᵀ is ~0 here; for a full-rank matrix it
  // is what the factors missed, and factors + residual give M back.
  const std::vector<float> F = randn(size_t(m * k), 8);
  mat_mq(F.data(), m, k, Q.data(), r, P.data());
  orthonormalize(P.data(), m, r);
  mat_mtp(F.data(), m, k, P.data(), r, Q2.data());
  std::vector<float> R = F;
  mat_pqt(P.data(), Q2.data(), m, k, r, R.data(), true);
  mat_pqt(P.data(), Q2.data(), m, k, r, out.data(), false);
  double lost = 0;
  for (size_t i = 0; i < F.size(); ++i) lost = std::max(lost, std::fabs(double(out[i]) + R[i] - F[i]));
  CHECK(lost < 1e-5);
}

TEST_CASE("compress: orthonormalisation is deterministic and orthonormal; zero columns stay zero", "[compress]") {
  const int64_t m = 200;
  const int r = 5;
  std::vector<float> P = randn(size_t(m * r), 9), P2 = P;
  for (int64_t i = 0; i < m; ++i) P[size_t(i * r + 3)] = 0.0f;  // a zero column
  P2 = P;
  orthonormalize(P.data(), m, r);
  orthonormalize(P2.data(), m, r);
  REQUIRE(std::memcmp(P.data(), P2.data(), P.size() * 4) == 0);
  for (int a = 0; a < r; ++a)
    for (int b = 0; b < r; ++b) {
      double d = 0;
      for (int64_t i = 0; i < m; ++i) d += double(P[size_t(i * r + a)]) * P[size_t(i * r + b)];
      const double want = a == b && a != 3 ? 1.0 : 0.0;
      CHECK(std::fabs(d - want) < 1e-5);
    }
  // The initial Q: the same draws for the same (seed, name), others elsewhere.
  std::vector<float> q1(40), q2(40), q3(40);
  init_q(q1.data(), 10, 4, 7, "a.weight");
  init_q(q2.data(), 10, 4, 7, "a.weight");
  init_q(q3.data(), 10, 4, 8, "a.weight");
  CHECK(q1 == q2);
  CHECK(q1 != q3);
}
