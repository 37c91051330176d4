// The codecs' speed on this CPU (hidden: run by scripts/bench_compression.sh,
// or `adgt_unit_tests "[.compressbench]"`): per codec, encode + decode time per
// MB of fp32 gradient (one thread, the median of 7 runs over 16 MiB), the
// bytes ratio against fp32, and the round trip's relative error, checked
// against the codec's bound in the same run (docs/compression.md quotes it).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/powersgd.hpp"

using namespace adgt;
using namespace adgt::compress;

namespace {
template <class F>
double median_seconds(F&& f, int reps) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

TEST_CASE("compress benchmark: codec time per MB and bytes ratio", "[.compressbench]") {
  const int64_t n = int64_t(4) << 20;  // 16 MiB of fp32
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  for (float& v : x) v = d(g);
  const double mb = double(n) * 4 / 1e6;
  std::printf("%-9s %12s %12s %10s %10s %12s\n", "codec", "encode us/MB", "decode us/MB", "B/element",
              "vs fp32", "rel. error");
  for (Level l : kQuantizedLevels) {
    std::vector<uint8_t> enc(size_t(encoded_bytes(l, n)));
    const double te = median_seconds([&] { encode(l, x.data(), n, enc.data()); }, 7);
    const double td = median_seconds([&] { decode(l, enc.data(), n, y.data()); }, 7);
    double e = 0, nn = 0;
    for (int64_t i = 0; i < n; ++i) {
      e += std::pow(double(y[size_t(i)]) - x[size_t(i)], 2);
      nn += double(x[size_t(i)]) * x[size_t(i)];
    }
    const double bpe = double(enc.size()) / double(n), rel = std::sqrt(e / nn);
    std::printf("%-9s %12.0f %12.0f %10.4f %9.2fx %12.2e\n", level_name(l), te / mb * 1e6, td / mb * 1e6, bpe,
                4.0 / bpe, rel);
    // int3: sqrt(0.037) = 0.19, int2: sqrt(0.117) = 0.34 on Gaussian data (compress_codec_test).
    CHECK(rel < (l == Level::Bf16 ? 3e-3 : l == Level::Int8 ? 2e-2 : l == Level::Int4 ? 0.3
                 : l == Level::Int3 ? 0.2 : 0.36));
  }
  // PowerSGD rank 4 on a 1024 x 1024 matrix (4 MB): P = MQ, orthonormalize,
  // Q = MᵀP, and P Qᵀ (the all-reduces excluded).
  const int64_t m = 1024, k = 1024;
  const int r = 4;
  std::vector<float> Q(size_t(k * r)), P(size_t(m * r)), Q2(size_t(k * r)), out(size_t(m * k));
  init_q(Q.data(), k, r, 1, "w");
  const double tp = median_seconds(
      [&] {
        mat_mq(x.data(), m, k, Q.data(), r, P.data());
        orthonormalize(P.data(), m, r);
        mat_mtp(x.data(), m, k, P.data(), r, Q2.data());
        mat_pqt(P.data(), Q2.data(), m, k, r, out.data(), false);
      },
      5);
  const double bpe = double((m + k) * r * 4) / double(m * k);
  std::printf("%-9s %12.0f %12s %10.4f %9.2fx %12s\n", "powersgd", tp / (double(m * k) * 4 / 1e6) * 1e6,
              "(in enc.)", bpe, 4.0 / bpe, "rank 4");
}
