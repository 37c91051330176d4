// The compression level choice (parallel/compress/choice.hpp):
// the link fit through the cluster model, and choose_levels on fixed inputs.
#include <catch2/catch.hpp>

#include <random>

#include "parallel/compress/choice.hpp"

using namespace adgt;
using namespace adgt::compress;
using cluster::Collective;

namespace {

// 4 dp ranks, 3 buckets of 32k elements (all compressible matrices 128 x 256),
// a link of `Bps` bytes/s and 50 us latency, 20 ms of compute, noisy gradients.
Signals fixed(double Bps, int64_t step = 100) {
  Signals s;
  s.step = step;
  s.warmup_steps = 20;
  s.ranks = 4;
  s.all_reduce = {50e-6, Bps};
  s.all_to_all = {50e-6, Bps};
  s.codec_s_per_elem = {0, 1e-9, 3e-9, 8e-9, 2e-8, 1e-8, 1.2e-8};  // by enum value: ..., powersgd, int2, int3
  s.noise_share = 0.9;
  const int64_t n = 32768;
  for (int i = 0; i < 3; ++i) {
    BucketSignals b;
    b.n = n;
    b.compressible = n;
    b.buf = {4.0 * n, 2.0 * n, 1.0156 * n, 0.5156 * n, 4.0 * 128 * 4, 0.2578 * n, 0.3828 * n};
    b.buf_q = 4.0 * 256 * 4;
    b.compute_share_s = 0.02 / 3;
    b.hide_s = 2.0 / 3.0 * 0.02 * (2 - i) / 3;
    b.rel_change = 0.1;
    s.buckets.push_back(b);
  }
  return s;
}

}  // namespace

TEST_CASE("compress controller: the link fit inverts the cluster model", "[compress][controller]") {
  for (Collective c : {Collective::AllReduce, Collective::AllToAll}) {
    const LinkFit truth{2e-4, 6.25e6};
    const double ts = link_time(c, 4, truth, 16), tb = link_time(c, 4, truth, 65536);
    const LinkFit f = fit_link(c, 4, 16, ts, 65536, tb);
    // The small probe carries a few bytes of transfer: alpha within 1%.
    CHECK(f.alpha == Approx(truth.alpha).epsilon(0.01));
    CHECK(link_time(c, 4, f, 65536) == Approx(tb).epsilon(1e-6));
    CHECK(f.beta == Approx(truth.beta).epsilon(0.02));
  }
}

TEST_CASE("compress controller: slow link compresses, fast link stays off", "[compress][controller]") {
  // 50 Mbit/s: fp32 takes 2*3/4*128 KiB / 6.25 MB/s = 31 ms per bucket.
  for (const Choice& c : choose_levels(fixed(6.25e6))) {
    CHECK(level_order(c.level) >= level_order(Level::Int4));
    CHECK(c.predicted[size_t(c.level)] < 0.25 * c.predicted[0]);
  }
  // 100 Gbit/s: fp32 takes 10 us, hidden under the compute but for the last bucket.
  for (const Choice& c : choose_levels(fixed(12.5e9))) CHECK(level_order(c.level) <= level_order(Level::Bf16));
}

TEST_CASE("compress controller: the level order puts int3 and int2 between int4 and PowerSGD",
          "[compress][controller]") {
  const Level want[] = {Level::None, Level::Bf16, Level::Int8, Level::Int4,
                        Level::Int3, Level::Int2, Level::PowerSgd};
  for (int i = 0; i < kLevels; ++i) {
    CHECK(level_at(i) == want[i]);
    CHECK(level_order(want[i]) == i);
    CHECK(parse_level(level_name(want[i])) == want[i]);
  }
  // The enum values checkpoints store did not move.
  CHECK(int(Level::PowerSgd) == 4);
  CHECK(int(Level::Int2) == 5);
  CHECK(int(Level::Int3) == 6);
  CHECK(error_prior(Level::Int4) < error_prior(Level::Int3));
  CHECK(error_prior(Level::Int3) < error_prior(Level::Int2));
  CHECK(error_prior(Level::Int2) < error_prior(Level::PowerSgd));
}

TEST_CASE("compress controller: int3 where the link is slow and the noise allows it", "[compress][controller]") {
  Signals s = fixed(6.25e6);
  for (BucketSignals& b : s.buckets) b.buf[size_t(Level::PowerSgd)] = 0;  // no PowerSGD
  // rho 0.9 >= 2 x 0.037 (two quantizations): int3, a quarter fewer bytes
  // than int4 (the latency and codec terms are the same).
  for (const Choice& c : choose_levels(s)) {
    CHECK(c.level == Level::Int3);
    CHECK(c.predicted[size_t(Level::Int3)] < 0.9 * c.predicted[size_t(Level::Int4)]);
  }
  s.noise_share = 0.05;  // 0.074 > 0.05 >= int4's 0.034: int4
  for (const Choice& c : choose_levels(s)) CHECK(c.level == Level::Int4);
  s.noise_share = 0.9;
  s.buckets[0].rel_change = 0.8;  // critical: 0.9 / 4 >= 0.074 still
  CHECK(choose_levels(s)[0].level == Level::Int3);
  s.noise_share = 0.2;  // critical: 0.2 / 4 < 0.074: int4 there, int3 elsewhere
  const auto cs = choose_levels(s);
  CHECK(cs[0].level == Level::Int4);
  CHECK(cs[1].level == Level::Int3);
  // A fast link: never int3.
  for (const Choice& c : choose_levels(fixed(12.5e9))) CHECK(c.level != Level::Int3);
}

TEST_CASE("compress controller: int2 where the link is slow and the noise allows it", "[compress][controller]") {
  Signals s = fixed(6.25e6);
  for (BucketSignals& b : s.buckets) b.buf[size_t(Level::PowerSgd)] = 0;  // no PowerSGD
  // auto leaves int2 alone unless told (the trainer never tells it: its loss cost).
  for (const Choice& c : choose_levels(s)) CHECK(c.level == Level::Int3);
  s.auto_int2 = true;
  // rho 0.9 >= 2 x 0.12 (two quantizations): int2 halves int4's bytes on a slow link.
  for (const Choice& c : choose_levels(s)) {
    CHECK(c.level == Level::Int2);
    CHECK(c.predicted[size_t(Level::Int2)] < 0.6 * c.predicted[size_t(Level::Int4)]);
  }
  s.noise_share = 0.2;  // 0.24 > 0.2: int3
  for (const Choice& c : choose_levels(s)) CHECK(c.level == Level::Int3);
  s.noise_share = 0.9;
  s.buckets[0].rel_change = 0.8;  // critical: 0.9 / 4 < 0.24
  const auto cs = choose_levels(s);
  CHECK(cs[0].level == Level::Int3);
  CHECK(cs[1].level == Level::Int2);
  // The EF guard steps an int2 bucket down.
  s.buckets[1].current = Level::Int2;
  s.buckets[1].ef_ratio = 50;
  CHECK(level_order(choose_levels(s)[1].level) < level_order(Level::Int2));
  // A fast link: never int2.
  Signals f = fixed(12.5e9);
  f.auto_int2 = true;
  for (const Choice& c : choose_levels(f)) CHECK(level_order(c.level) <= level_order(Level::Bf16));
}

TEST_CASE("compress controller: warm-up, no compressible tensor, unknown noise", "[compress][controller]") {
  for (const Choice& c : choose_levels(fixed(6.25e6, 19))) {  // step 20 is still warm-up
    CHECK(c.level == Level::None);
    CHECK(c.reason == "warm-up");
  }
  for (const Choice& c : choose_levels(fixed(6.25e6, 20))) CHECK(c.level != Level::None);  // step 21 is not
  Signals s = fixed(6.25e6);
  s.buckets[1].compressible = 0;
  const auto cs = choose_levels(s);
  CHECK(cs[1].level == Level::None);
  CHECK(cs[1].reason == "no compressible tensor");
  s.noise_share = -1;  // no noise estimate yet: at most bf16
  for (const Choice& c : choose_levels(s)) CHECK(level_order(c.level) <= level_order(Level::Bf16));
}

TEST_CASE("compress controller: the error budget caps the level", "[compress][controller]") {
  Signals s = fixed(6.25e6);
  s.noise_share = 0.02;  // a clean gradient: int4 (2 x 1.7e-2) and PowerSGD exceed the budget
  for (const Choice& c : choose_levels(s)) CHECK(c.level == Level::Int8);
  s.noise_share = 0.9;
  s.buckets[0].rel_change = 0.8;  // critical regime: a quarter of the budget
  s.buckets[1].rel_change = -1;   // unknown: treated as critical
  const auto cs = choose_levels(s);
  CHECK(level_order(cs[0].level) >= level_order(Level::Int4));  // 0.25 <= 0.9/4
  s.noise_share = 0.5;
  // Int2 priced out (the five levels before it came): bucket 2 takes PowerSGD.
  Signals no_int2 = s;
  no_int2.codec_s_per_elem[size_t(Level::Int2)] = 1;
  const auto cs2 = choose_levels(no_int2);
  CHECK(cs2[0].level == Level::Int3);  // PowerSGD's 0.25 > 0.5/4 >= int3's 2 x 0.037
  CHECK(cs2[2].level == Level::PowerSgd);
  // With int2 at its price, within 5% of PowerSGD here: the less compressed
  // int2 when auto may choose it; PowerSGD when not (the trainer's default).
  CHECK(choose_levels(s)[2].level == Level::PowerSgd);
  s.auto_int2 = true;
  const auto cs3 = choose_levels(s);
  CHECK(cs3[0].level == Level::Int3);  // int2's 2 x 0.12 > 0.5/4 too
  CHECK(cs3[2].level == Level::Int2);
  CHECK(cs3[2].predicted[size_t(Level::PowerSgd)] < cs3[2].predicted[size_t(Level::Int2)]);
  // EF residual far above the gradient: the bucket steps down.
  s.buckets[2].current = Level::PowerSgd;
  s.buckets[2].ef_ratio = 50;
  CHECK(level_order(choose_levels(s)[2].level) < level_order(Level::PowerSgd));
}

TEST_CASE("compress controller: hysteresis, no flapping at the boundary", "[compress][controller]") {
  // Find the bandwidth where int8 and off cost the same for the last bucket
  // (no compute hides it): the boundary.
  Signals s = fixed(1e9);
  s.noise_share = 0.05;  // int8 allowed, int4 and PowerSGD not
  s.buckets.resize(1);
  s.buckets[0].hide_s = 0;
  s.hysteresis = 0;  // the boundary of the plain rule
  double lo = 1e6, hi = 1e12;
  for (int i = 0; i < 100; ++i) {
    const double mid = std::sqrt(lo * hi);
    s.all_reduce.beta = s.all_to_all.beta = mid;
    (choose_levels(s)[0].level == Level::None ? hi : lo) = mid;
  }
  const double edge = std::sqrt(lo * hi);
  s.hysteresis = 0.1;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> noise(0.97, 1.03);  // +-3% measurement noise
  Level cur = Level::None;
  int changes = 0;
  for (int k = 0; k < 200; ++k) {
    s.all_reduce.beta = s.all_to_all.beta = edge * noise(rng);
    s.buckets[0].current = cur;
    const Level next = choose_levels(s)[0].level;
    changes += next != cur;
    cur = next;
  }
  CHECK(changes <= 1);
  // The same noisy inputs straddle the plain rule's boundary: judged from
  // off each time without hysteresis, many go either way.
  s.hysteresis = 0;
  int compressed = 0;
  rng.seed(3);
  for (int k = 0; k < 200; ++k) {
    s.all_reduce.beta = s.all_to_all.beta = edge * noise(rng);
    s.buckets[0].current = Level::None;
    compressed += choose_levels(s)[0].level != Level::None;
  }
  CHECK(compressed > 20);
  CHECK(compressed < 180);
}

TEST_CASE("compress controller: a batch shares its collectives' latency", "[compress][controller]") {
  // A link with no bandwidth cost: a compressed bucket's time is its share of the latency.
  Signals s = fixed(1e15);
  s.codec_s_per_elem = {0, 0, 0, 0, 0};
  const double three = predict_seconds(s, s.buckets[0], Level::Int4);
  const double psgd3 = predict_seconds(s, s.buckets[0], Level::PowerSgd);
  s.buckets[1].compressible = 0;  // two buckets can compress
  const double two = predict_seconds(s, s.buckets[0], Level::Int4);
  s.buckets.resize(1);
  const double one = predict_seconds(s, s.buckets[0], Level::Int4);
  const double psgd1 = predict_seconds(s, s.buckets[0], Level::PowerSgd);
  CHECK(one == Approx(2 * link_time(Collective::AllToAll, 4, s.all_to_all, 0)));
  CHECK(two == Approx(one / 2));
  CHECK(three == Approx(one / 3));
  // PowerSGD's two ring all-reduces: 2 x 2(D-1) latencies, shared likewise.
  CHECK(psgd1 == Approx(2 * link_time(Collective::AllReduce, 4, s.all_reduce, 0)));
  CHECK(psgd3 == Approx(psgd1 / 3));
}

TEST_CASE("compress controller: signals round-trip through JSON", "[compress][controller]") {
  Signals s = fixed(6.25e6);
  s.buckets[1].current = Level::Int4;
  const Signals t = signals_from_json(nlohmann::json::parse(to_json(s).dump()));
  CHECK(to_json(t) == to_json(s));
  const auto a = choose_levels(s), b = choose_levels(t);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].level == b[i].level);
}

// A dp group of 8 over 2 sites of 4 (parallel.site_reduce: hierarchical):
// `fixed`'s buckets, the cross-site links at `wan_Bps`, the site's at `site_Bps`.
Signals over_sites(double wan_Bps, double site_Bps, double wan_latency = 5e-3) {
  Signals s = fixed(wan_Bps);
  s.ranks = 8;
  s.sites = 2;
  s.site_ranks = 4;
  s.all_reduce = {wan_latency, wan_Bps};
  s.all_to_all = {wan_latency, wan_Bps};
  s.site_link = {5e-6, site_Bps};
  return s;
}

TEST_CASE("compress controller over sites: a level prices the cross-site exchange alone",
          "[compress][controller][sites]") {
  // Inside the sites the reduction is fp32 at every level: a slower site
  // link adds the same time to every quantized level (its reduce-scatter and
  // all-gather of the whole bucket) and nothing to the cross-site part.
  const Signals fast = over_sites(2.5e6, 1e10), slow = over_sites(2.5e6, 1e8);
  const BucketSignals& b = fast.buckets[0];
  const double inside_fast = link_time(Collective::ReduceScatter, 4, fast.site_link, b.buf[0]) +
                             link_time(Collective::AllGather, 4, fast.site_link, b.buf[0]);
  const double inside_slow = link_time(Collective::ReduceScatter, 4, slow.site_link, b.buf[0]) +
                             link_time(Collective::AllGather, 4, slow.site_link, b.buf[0]);
  REQUIRE(inside_slow > 10 * inside_fast);
  for (Level l : {Level::Bf16, Level::Int8, Level::Int4})
    CHECK(predict_seconds(slow, b, l) - predict_seconds(fast, b, l) == Approx(inside_slow - inside_fast));
  // The cross-site part of a quantized level: each member's 1/4 shard, the
  // all-to-all of its encoded chunks and the owners' all-gather over the 2
  // sites (3 buckets share each call's latency; the codec on the shard).
  Signals nocodec = fast;
  nocodec.codec_s_per_elem = {0, 0, 0, 0, 0, 0, 0};
  const double lat = link_time(Collective::AllToAll, 2, fast.all_to_all, 0);
  const double cross = 2 * (link_time(Collective::AllToAll, 2, fast.all_to_all, b.buf[size_t(Level::Int8)] / 4) -
                            lat + lat / 3);
  CHECK(predict_seconds(nocodec, b, Level::Int8) == Approx(inside_fast + cross));
  // Off: SiteComm's all-reduce, the shard's fp32 all-reduce across, less what
  // the compute after the bucket hides.
  BucketSignals bare = b;
  bare.hide_s = 0;
  CHECK(predict_seconds(fast, bare, Level::None) ==
        Approx(inside_fast + link_time(Collective::AllReduce, 2, fast.all_reduce, b.buf[0] / 4)));
}

TEST_CASE("compress controller over sites: compress where the WAN is slow, not where the site is",
          "[compress][controller][sites]") {
  // A slow WAN (20 Mbit/s) and fast sites: the cross-site exchange dominates
  // and a quantized level pays.
  for (const Choice& c : choose_levels(over_sites(2.5e6, 1e10)))
    CHECK(level_order(c.level) >= level_order(Level::Int8));
  // A fast WAN and slow sites (0.1 GB/s): the time is inside the sites, which
  // no quantized level shrinks, so every bucket stays off. (The noise allows
  // int3 but not PowerSGD, which would shrink the traffic inside the sites
  // too: its P and Q go through the phases.)
  Signals s = over_sites(1e11, 1e8, 5e-6);
  s.noise_share = 0.1;
  for (const Choice& c : choose_levels(s)) CHECK(c.level == Level::None);
  // Priced flat instead, with the group's link fitted to the whole
  // hierarchical all-reduce (what a probe of the group measures), the same
  // step would compress its exposed bucket (bf16: half the bytes, a saving
  // that inside the sites does not exist): the site-blind price this rule
  // replaces.
  Signals flat = s;
  flat.sites = flat.site_ranks = 0;
  const BucketSignals& b = s.buckets[0];
  BucketSignals bare = b;
  bare.hide_s = 0;
  const double whole_small = predict_seconds(s, BucketSignals{.buf = {4.0 * 8}}, Level::None);
  const double whole_big = predict_seconds(s, bare, Level::None);
  flat.all_reduce = fit_link(Collective::AllReduce, 8, 4.0 * 8, whole_small, b.buf[0], whole_big);
  flat.all_to_all = flat.all_reduce;
  int compressed = 0;
  for (const Choice& c : choose_levels(flat)) compressed += c.level != Level::None;
  CHECK(compressed > 0);
}

TEST_CASE("compress controller over sites: the site fields round-trip through JSON",
          "[compress][controller][sites]") {
  const Signals s = over_sites(2.5e6, 1e9);
  const Signals t = signals_from_json(nlohmann::json::parse(to_json(s).dump()));
  CHECK(t.sites == 2);
  CHECK(t.site_ranks == 4);
  CHECK(t.site_link.beta == Approx(1e9));
  CHECK(to_json(t) == to_json(s));
  const auto a = choose_levels(s), c = choose_levels(t);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].level == c[i].level);
  // A flat group's JSON has no site fields (the decision logs stay as they were).
  CHECK_FALSE(to_json(fixed(6.25e6)).contains("sites"));
}

#include "parallel/sim/dry_run.hpp"

using Catch::Matchers::Contains;

// --dry-run's expected levels (docs/compression.md): the controller's rule on
// the cluster model's links. The 50 Mbit/s node of the slow-link ctest
// compresses; the 100 Gbit/s one stays at off or bf16; off without auto or dp.
TEST_CASE("compress: --dry-run's expected levels follow the cluster's link", "[compress][dryrun]") {
  const std::string dir = std::string(ADGT_SOURCE_DIR) + "/tests/compress/";
  RunConfig cfg = load_config(dir + "model.yaml", {"parallel.dp=4", "parallel.grad_compression=auto"});
  auto expect = [&](const char* file) {
    return sim::expected_compression(cfg, cluster::load_cluster(dir + file), 0.005, true);
  };
  const sim::ExpectedCompression slow = expect("slow_link.yaml"), fast = expect("fast_link.yaml");
  REQUIRE(!slow.levels.empty());
  CHECK(slow.levels.size() == fast.levels.size());
  // The fitted link is the file's (6.25 MB/s and 12.5 GB/s per direction).
  CHECK(slow.link_Bps == Approx(6.25e6).epsilon(0.05));
  CHECK(fast.link_Bps == Approx(12.5e9).epsilon(0.05));
  int compressed = 0;
  for (const std::string& l : slow.levels)
    compressed += l == "int8" || l == "int4" || l == "int3" || l == "int2" || l == "powersgd";
  CHECK(compressed > 0);
  for (const std::string& l : fast.levels) CHECK((l == "off" || l == "bf16"));
  CHECK_THAT(slow.line, Contains("grad compression: auto expects") &&
                            Contains("dp buckets after warm-up (dp=4 link"));
  cfg.parallel.grad_compression = "off";
  CHECK(expect("slow_link.yaml").line.empty());
}

// Over sites: dp 8 on tests/compress/two_sites_slow_wan.yaml (ranks 0-3 on
// site 0, 4-7 on site 1), reduced hierarchically: the dry run fits the
// cross-site link (the WAN, shared by the 4 places' exchanges at once) and
// the site's apart, as the controller probes them, and names both; flat, it
// fits the whole group's ring.
TEST_CASE("compress: --dry-run's expected levels over sites", "[compress][dryrun][sites]") {
  const std::string dir = std::string(ADGT_SOURCE_DIR) + "/tests/compress/";
  const cluster::Cluster cl = cluster::load_cluster(dir + "two_sites_slow_wan.yaml");
  RunConfig cfg = load_config(dir + "model.yaml", {"parallel.dp=8", "parallel.grad_compression=auto"});
  const sim::ExpectedCompression hier = sim::expected_compression(cfg, cl, 0.005, true);
  std::vector<int> cross = {0, 4};
  // One place's exchange: cross_site_time with the site's 2 nodes sharing the WAN.
  const double t_big = cluster::cross_site_time(cl, Collective::AllReduce, cross, 4.0 * 4096 * 2, 2);
  const double t_small = cluster::cross_site_time(cl, Collective::AllReduce, cross, 4.0 * 2, 2);
  const LinkFit want = fit_link(Collective::AllReduce, 2, 4.0 * 2, t_small, 4.0 * 4096 * 2, t_big);
  CHECK(hier.link_Bps == Approx(want.beta).epsilon(1e-6));
  CHECK(hier.link_Bps < 0.00625e9);  // shared: below the WAN's own bandwidth
  CHECK_THAT(hier.line, Contains("(dp=8 over 2 sites of 4, compressed across only: cross-site link") &&
                            Contains(", inside a site "));
  int compressed = 0;
  for (const std::string& l : hier.levels) compressed += l != "off" && l != "bf16";
  CHECK(compressed > 0);
  cfg.parallel.site_reduce = "flat";
  const sim::ExpectedCompression flat = sim::expected_compression(cfg, cl, 0.005, true);
  CHECK_THAT(flat.line, !Contains("sites"));
  CHECK(flat.link_Bps != Approx(hier.link_Bps).epsilon(0.01));
}
