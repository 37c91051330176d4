// Blends of token files (core/data/blend.hpp): the shorthand's parse and
// errors, exact shares per period, the order a pure function of the global
// index (so a resume or another layout continues it), each source read in
// its own sampler's order, and one source equal to the plain Sampler.
#include <catch2/catch.hpp>

#include <filesystem>
#include <numeric>
#include <vector>

#include "core/data/blend.hpp"
#include "core/data/sampler.hpp"
#include "core/data/token_shard.hpp"

namespace fs = std::filesystem;
using adgt::BlendSampler;
using adgt::kBlendPeriod;

namespace {

std::string shard(const std::string& name, int64_t n, int32_t base) {
  const fs::path d = fs::path(ADGT_BINARY_DIR) / "tmp" / "blend_test";
  fs::create_directories(d);
  std::vector<int32_t> t(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = base + int32_t(i % 97);
  const std::string p = (d / name).string();
  adgt::write_token_shard(p, t, 1024);
  return p;
}

}  // namespace

TEST_CASE("blend: data.train's shorthand and its errors", "[data]") {
  const auto one = adgt::parse_blend("a.bin", "data.train");
  REQUIRE(one.size() == 1);
  CHECK(one[0].path == "a.bin");
  CHECK(one[0].weight == 1.0);
  const auto two = adgt::parse_blend("0.7 a.bin  3e-1 dir/b", "data.train");
  REQUIRE(two.size() == 2);
  CHECK(two[1].path == "dir/b");
  CHECK(two[0].weight == Approx(0.7));
  CHECK(two[1].weight == Approx(0.3));
  const auto weights = adgt::parse_blend("2 a 6 b", "data.train");
  CHECK(weights[0].weight == 0.25);
  const auto error_of = [](const std::string& v) {
    try {
      adgt::parse_blend(v, "data.train");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of("0.7 a 0.3").find("weights and token files in turn") != std::string::npos);
  CHECK(error_of("x a 0.3 b").find("'x' before a is not a positive weight") != std::string::npos);
  CHECK(error_of("0 a 1 b").find("'0' before a is not a positive weight") != std::string::npos);
  CHECK(error_of("0.5 a 0.5 a").find("a is named twice") != std::string::npos);
  CHECK(error_of("").find("one token file") != std::string::npos);
}

TEST_CASE("blend: exact shares per period, the order a function of the index", "[data]") {
  const std::string a = shard("a.bin", 5000, 0), b = shard("b.bin", 3000, 500), c = shard("c.bin", 800, 900);
  const adgt::TokenShard sa(a), sb(b), sc(c);
  const BlendSampler blend({&sa, &sb}, {0.7, 0.3}, 16, 1234);
  // Per period: 0.7 * 4096 = 2867.2 -> 2867, 0.3 * 4096 = 1228.8 -> 1229 (largest remainder).
  CHECK(blend.per_period() == std::vector<int64_t>{2867, 1229});
  // 1000 steps of a global batch of 8: the first source's share of the samples.
  const int64_t n = 1000 * 8;
  int64_t from_a = 0;
  for (int64_t i = 0; i < n; ++i) from_a += blend.source_of(i) == 0;
  CHECK(from_a == blend.consumed(0, n));
  CHECK(double(from_a) / double(n) == Approx(0.7).margin(0.001));
  // consumed() in closed form against counting, across period boundaries.
  for (int64_t m : {int64_t(0), int64_t(1), kBlendPeriod - 1, kBlendPeriod, kBlendPeriod + 5, 3 * kBlendPeriod + 77}) {
    int64_t count = 0;
    for (int64_t i = 0; i < m; ++i) count += blend.source_of(i) == 1;
    CHECK(blend.consumed(1, m) == count);
  }
  // The interleaving never runs far from the weights inside a period.
  int64_t have = 0;
  for (int64_t j = 0; j < kBlendPeriod; ++j) {
    have += blend.source_of(j) == 0;
    CHECK(std::abs(double(have) - 2867.0 * double(j + 1) / double(kBlendPeriod)) <= 1.0);
  }
  // Source s's k-th sample is its own sampler's sample k.
  const adgt::Sampler own_b(sb, 16, 1234 + 0x9E3779B97F4A7C15ull);
  std::vector<int32_t> got(17), want(17);
  int64_t k = 0;
  for (int64_t i = 0; i < 3 * kBlendPeriod; ++i) {
    if (blend.source_of(i) != 1) continue;
    blend.sample(i, got.data());
    own_b.sample(k++, want.data());
    REQUIRE(got == want);
  }
  // A second sampler over the same files (a resume, another layout) reads the same.
  const BlendSampler again({&sa, &sb}, {0.7, 0.3}, 16, 1234);
  std::vector<int32_t> x(17), y(17);
  for (int64_t i = 0; i < 2 * kBlendPeriod; i += 7) {
    blend.sample(i, x.data());
    again.sample(i, y.data());
    REQUIRE(x == y);
  }
  // Three sources, shares exact per period.
  const BlendSampler three({&sa, &sb, &sc}, {0.5, 0.25, 0.25}, 16, 7);
  CHECK(three.per_period() == std::vector<int64_t>{2048, 1024, 1024});
  CHECK(three.consumed(2, 10 * kBlendPeriod) == 10240);
}

TEST_CASE("blend: one source is the plain sampler", "[data]") {
  const adgt::TokenShard sa(shard("solo.bin", 4000, 3));
  const BlendSampler blend({&sa}, {1.0}, 32, 99);
  const adgt::Sampler plain(sa, 32, 99);
  std::vector<int32_t> x(33), y(33);
  for (int64_t i = 0; i < 3 * kBlendPeriod; i += 5) {
    blend.sample(i, x.data());
    plain.sample(i, y.data());
    REQUIRE(x == y);
  }
}
