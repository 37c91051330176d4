#include "parallel/compress/choice.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "kernels/check.hpp"
#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/powersgd.hpp"

namespace adgt::compress {

namespace {

cluster::Cluster one_node(int ranks, const LinkFit& l) {
  cluster::Cluster c;
  c.name = "measured";
  c.nodes = 1;
  c.devices_per_node = std::max(ranks, 1);
  c.intra.bandwidth = l.beta;
  c.intra.latency = l.alpha;
  c.intra.efficiency = 1;
  return c;
}

std::vector<int> members(int ranks) {
  std::vector<int> m(size_t(std::max(ranks, 1)));
  for (size_t i = 0; i < m.size(); ++i) m[i] = int(i);
  return m;
}

}  // namespace

double link_time(cluster::Collective c, int ranks, const LinkFit& l, double bytes) {
  if (ranks <= 1) return 0;
  return cluster::collective_time(one_node(ranks, l), c, members(ranks), bytes);
}

LinkFit fit_link(cluster::Collective c, int ranks, double small_bytes, double t_small,
                 double big_bytes, double t_big) {
  LinkFit f;
  if (ranks <= 1) return f;
  // alpha: the small message is latency-bound (bandwidth taken as unlimited).
  const double unit = link_time(c, ranks, LinkFit{1.0, 1e30}, small_bytes);
  f.alpha = unit > 0 ? std::max(0.0, t_small) / unit : 0;
  // beta: bisection in log space on the big message (time falls as beta grows).
  double lo = std::log(1e3), hi = std::log(1e13);
  if (link_time(c, ranks, LinkFit{f.alpha, std::exp(hi)}, big_bytes) >= t_big) {
    f.beta = std::exp(hi);
    return f;
  }
  for (int it = 0; it < 80; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (link_time(c, ranks, LinkFit{f.alpha, std::exp(mid)}, big_bytes) > t_big)
      lo = mid;
    else
      hi = mid;
  }
  f.beta = std::exp(0.5 * (lo + hi));
  return f;
}

double error_prior(Level l) {
  switch (l) {
    case Level::None: return 0;
    case Level::Bf16: return 3e-6;    // (1.7e-3)^2
    case Level::Int8: return 5e-5;    // (7.0e-3)^2
    case Level::Int4: return 1.7e-2;  // (1.3e-1)^2
    case Level::Int3: return 0.037;   // (1.9e-1)^2 on N(0, 1) blocks, 0.070 on Laplacian ones (rms_codec.hpp)
    case Level::Int2: return 0.12;    // (3.4e-1)^2; 0.117 on N(0, 1) blocks (rms_codec.hpp)
    case Level::PowerSgd: return 0.25;
  }
  return 1;
}

namespace {

// Buckets that can join a compressed batch (they hold a compressible tensor).
double batch_members(const Signals& s) {
  int m = 0;
  for (const BucketSignals& b : s.buckets) m += b.compressible > 0;
  return std::max(1, m);
}

// A collective of a batch (GradReducer reduces the compressed buckets of a
// level together, one collective per stage), as bucket b's share: its bytes'
// time and 1/m of the collective's latency term.
double batched_time(const Signals& s, cluster::Collective c, const LinkFit& l, double bytes,
                    int ranks = 0) {
  ranks = ranks > 0 ? ranks : s.ranks;
  const double lat = link_time(c, ranks, l, 0.0);
  return link_time(c, ranks, l, bytes) - lat + lat / batch_members(s);
}

// predict_seconds over sites (SiteComm's phases; see the header).
double predict_over_sites(const Signals& s, const BucketSignals& b, Level l) {
  using cluster::Collective;
  const int k = s.site_ranks, S = s.sites;
  const double full = b.buf[0];  // the bucket's fp32 bytes
  const double rs_in = link_time(Collective::ReduceScatter, k, s.site_link, full);
  const double ag_in = link_time(Collective::AllGather, k, s.site_link, full);
  const double share = 1.0 / double(std::max(k, 1));
  const double codec = s.codec_s_per_elem[size_t(l)] * double(b.compressible) * share;
  // An all-reduce of `bytes` through the phases (an off bucket; PowerSGD's P and Q).
  // batched: one call for every compressed bucket (each phase's latency shared).
  auto phased = [&](double bytes, bool batched) {
    auto t = [&](Collective c, int ranks, const LinkFit& link, double b) {
      return batched ? batched_time(s, c, link, b, ranks) : link_time(c, ranks, link, b);
    };
    return t(Collective::ReduceScatter, k, s.site_link, bytes) +
           t(Collective::AllReduce, S, s.all_reduce, bytes * share) +
           t(Collective::AllGather, k, s.site_link, bytes);
  };
  switch (l) {
    case Level::None: {
      const double t = b.reduce_scatter
                           ? rs_in + link_time(Collective::ReduceScatter, S, s.all_reduce, full * share)
                           : phased(full, false);
      return std::max(0.0, t - b.hide_s);
    }
    case Level::Bf16:
    case Level::Int8:
    case Level::Int4:
    case Level::Int3:
    case Level::Int2:
      // reduce_over_sites: the whole bucket inside (a ZeRO-1 bucket too), the
      // shard's all-to-all of encoded chunks and the owners' all-gather across.
      return rs_in + ag_in +
             2 * (batched_time(s, Collective::AllToAll, s.all_to_all, b.buf[size_t(l)] * share, S) + codec);
    case Level::PowerSgd:
      return s.codec_s_per_elem[size_t(l)] * double(b.compressible) + phased(b.buf[size_t(l)], true) +
             phased(b.buf_q, true);
  }
  return 0;
}

}  // namespace

double predict_seconds(const Signals& s, const BucketSignals& b, Level l) {
  using cluster::Collective;
  const int D = s.ranks;
  if (D <= 1) return 0;
  if (s.sites > 1 && s.site_ranks >= 1) return predict_over_sites(s, b, l);
  const double codec = s.codec_s_per_elem[size_t(l)] * double(b.compressible);
  switch (l) {
    case Level::None: {
      const double t = link_time(b.reduce_scatter ? Collective::ReduceScatter : Collective::AllReduce,
                                 D, s.all_reduce, b.buf[0]);
      return std::max(0.0, t - b.hide_s);
    }
    case Level::Bf16:
    case Level::Int8:
    case Level::Int4:
    case Level::Int3:
    case Level::Int2: {
      const int calls = b.reduce_scatter ? 1 : 2;  // all-to-all of the chunks (+ the owners' all-gather)
      return calls * (batched_time(s, Collective::AllToAll, s.all_to_all, b.buf[size_t(l)]) + codec);
    }
    case Level::PowerSgd:
      return codec + batched_time(s, Collective::AllReduce, s.all_reduce, b.buf[size_t(l)]) +
             batched_time(s, Collective::AllReduce, s.all_reduce, b.buf_q);
  }
  return 0;
}

std::vector<Choice> choose_levels(const Signals& s) {
  std::vector<Choice> out(s.buckets.size());
  // Off buckets share the group's link one after another (an NCCL stream, the
  // emulation): bucket i's all-reduce ends at end_i = max(ready_i, end_{i-1})
  // + t_i, ready_i = bwd - hide_i (bwd: the backward's length, hide_0 plus
  // bucket 0's share), and its cost is what it adds to the exposed tail
  // max(0, end - bwd). Summed over the buckets: the all-off step's exposure.
  double bwd = 0, end = 0;
  if (!s.buckets.empty()) {
    const BucketSignals& b0 = s.buckets[0];
    bwd = b0.hide_s + 2.0 / 3.0 * b0.compute_share_s;
  }
  for (size_t i = 0; i < s.buckets.size(); ++i) {
    const BucketSignals& b = s.buckets[i];
    Choice& c = out[i];
    for (int l = 0; l < kLevels; ++l) c.predicted[size_t(l)] = predict_seconds(s, b, Level(l));
    // Levels are judged in level_order (least compressed first); predicted is
    // indexed by the enum value.
    {
      BucketSignals bare = b;
      bare.hide_s = 0;
      const double t = predict_seconds(s, bare, Level::None);
      const double e = std::max(bwd - b.hide_s, end) + t;
      c.predicted[0] = std::max(0.0, e - bwd) - std::max(0.0, end - bwd);
      end = e;
    }
    if (s.step + 1 <= s.warmup_steps) {  // the levels apply from step + 1 on
      c.reason = "warm-up";
      continue;
    }
    if (b.compressible <= 0 || s.ranks <= 1) {
      c.reason = "no compressible tensor";
      continue;
    }
    const bool critical = b.rel_change < 0 || b.rel_change >= s.critical_change;
    const double rho = s.noise_share < 0 ? -1 : s.noise_share * (critical ? 0.25 : 1.0);
    const bool ef_high = b.ef_ratio > s.ef_limit && b.current != Level::None;
    // l: an enum value; compared by level_order.
    auto allowed = [&](int l) {
      const int o = level_order(Level(l));
      if (ef_high && o >= level_order(b.current) && o > level_order(Level::Bf16)) return false;
      if (l == int(Level::PowerSgd) && b.buf[size_t(l)] <= 0) return false;
      if (l == int(Level::Int2) && !s.auto_int2) return false;
      if (o <= level_order(Level::Bf16)) return true;
      if (rho < 0) return false;
      const double err = error_prior(Level(l)) * (quantized(Level(l)) && !b.reduce_scatter ? 2 : 1);
      return err <= s.budget * rho;
    };
    double best = 1e300;
    for (int l = 0; l < kLevels; ++l)
      if (allowed(l)) best = std::min(best, c.predicted[size_t(l)]);
    const double base = best + b.compute_share_s;
    const int cur = int(b.current);
    if (allowed(cur) && c.predicted[size_t(cur)] <= best + (s.tolerance + s.hysteresis) * base) {
      c.level = b.current;
      c.reason = c.predicted[size_t(cur)] <= best + s.tolerance * base ? "within tolerance"
                                                                          : "kept (hysteresis)";
    } else {
      for (int o = 0; o < kLevels; ++o) {
        const int l = int(level_at(o));
        if (allowed(l) && c.predicted[size_t(l)] <= best + s.tolerance * base) {
          c.level = Level(l);
          c.reason = "within tolerance";
          break;
        }
      }
    }
    if (critical && rho >= 0) c.reason += ", critical regime";
    if (ef_high) c.reason += ", EF residual high";
    if (rho < 0) c.reason += ", noise scale unknown";
  }
  return out;
}

namespace {
// JSON has no NaN or infinity (nlohmann writes null): unknown is -1, too large
// is 1e30 (a step with a non-finite gradient can give either).
double finite(double x, double unknown = -1) {
  if (std::isnan(x)) return unknown;
  return std::isinf(x) ? (x > 0 ? 1e30 : -1e30) : x;
}
}  // namespace

nlohmann::json to_json(const Signals& s) {
  nlohmann::json j;
  j["step"] = s.step;
  j["warmup_steps"] = s.warmup_steps;
  j["ranks"] = s.ranks;
  j["all_reduce_link"] = {{"latency_s", finite(s.all_reduce.alpha, 0)},
                          {"bandwidth_Bps", finite(s.all_reduce.beta, 1e13)}};
  j["all_to_all_link"] = {{"latency_s", finite(s.all_to_all.alpha, 0)},
                          {"bandwidth_Bps", finite(s.all_to_all.beta, 1e13)}};
  if (s.sites > 1) {
    j["sites"] = s.sites;
    j["site_ranks"] = s.site_ranks;
    j["site_link"] = {{"latency_s", finite(s.site_link.alpha, 0)},
                      {"bandwidth_Bps", finite(s.site_link.beta, 1e13)}};
  }
  j["codec_s_per_elem"] = s.codec_s_per_elem;
  j["noise_share"] = finite(s.noise_share);
  j["budget"] = s.budget;
  j["tolerance"] = s.tolerance;
  j["hysteresis"] = s.hysteresis;
  j["critical_change"] = s.critical_change;
  j["ef_limit"] = s.ef_limit;
  nlohmann::json bs = nlohmann::json::array();
  for (const BucketSignals& b : s.buckets)
    bs.push_back({{"n", b.n}, {"compressible", b.compressible}, {"reduce_scatter", b.reduce_scatter},
                  {"buf", b.buf}, {"buf_q", b.buf_q}, {"hide_s", finite(b.hide_s, 0)},
                  {"compute_share_s", finite(b.compute_share_s, 0)}, {"rel_change", finite(b.rel_change)},
                  {"ef_ratio", finite(b.ef_ratio, 1e30)}, {"current", level_name(b.current)}});
  j["buckets"] = bs;
  return j;
}

Signals signals_from_json(const nlohmann::json& j) {
  Signals s;
  s.step = j.at("step");
  s.warmup_steps = j.at("warmup_steps");
  s.ranks = j.at("ranks");
  s.all_reduce = {j.at("all_reduce_link").at("latency_s"), j.at("all_reduce_link").at("bandwidth_Bps")};
  s.all_to_all = {j.at("all_to_all_link").at("latency_s"), j.at("all_to_all_link").at("bandwidth_Bps")};
  if (j.contains("sites")) {
    s.sites = j.at("sites");
    s.site_ranks = j.at("site_ranks");
    s.site_link = {j.at("site_link").at("latency_s"), j.at("site_link").at("bandwidth_Bps")};
  }
  s.codec_s_per_elem = j.at("codec_s_per_elem");
  s.noise_share = j.at("noise_share");
  s.budget = j.at("budget");
  s.tolerance = j.at("tolerance");
  s.hysteresis = j.at("hysteresis");
  s.critical_change = j.at("critical_change");
  s.ef_limit = j.at("ef_limit");
  for (const auto& x : j.at("buckets")) {
    BucketSignals b;
    b.n = x.at("n");
    b.compressible = x.at("compressible");
    b.reduce_scatter = x.at("reduce_scatter");
    b.buf = x.at("buf");
    b.buf_q = x.at("buf_q");
    b.hide_s = x.at("hide_s");
    b.compute_share_s = x.at("compute_share_s");
    b.rel_change = x.at("rel_change");
    b.ef_ratio = x.at("ef_ratio");
    b.current = parse_level(x.at("current").get<std::string>());
    s.buckets.push_back(b);
  }
  return s;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Encode+decode seconds per element of each level on this host (the fastest
// of 3 rounds; PowerSGD: P = MQ, orthonormalize, Q = MᵀP, PQᵀ on 128 x 128).
std::array<double, kLevels> measure_codecs(int powersgd_rank) {
  std::array<double, kLevels> out{};
  const int64_t n = 1 << 16;
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (float& v : x) v = nd(rng);
  for (Level l : kQuantizedLevels) {
    std::vector<uint8_t> buf(static_cast<size_t>(encoded_bytes(l, n)));
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      encode(l, x.data(), n, buf.data());
      decode(l, buf.data(), n, y.data());
      best = std::min(best, seconds_since(t0));
    }
    out[size_t(l)] = best / double(n);
  }
  const int64_t m = 128, k = 128;
  const int r = std::max(1, powersgd_rank);
  std::vector<float> q(size_t(k * r)), p(size_t(m * r));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    init_q(q.data(), k, r, 1, "probe");
    const auto t0 = std::chrono::steady_clock::now();
    mat_mq(x.data(), m, k, q.data(), r, p.data());
    orthonormalize(p.data(), m, r);
    mat_mtp(x.data(), m, k, p.data(), r, q.data());
    mat_pqt(p.data(), q.data(), m, k, r, y.data(), false);
    best = std::min(best, seconds_since(t0));
  }
  out[size_t(Level::PowerSgd)] = best / double(m * k);
  return out;
}

}  // namespace

std::array<double, kLevels> measure_codec_seconds(int powersgd_rank) {
  return measure_codecs(powersgd_rank);
}

std::array<double, kLevels> model_codec_seconds(int powersgd_rank, double flops_per_s) {
  std::array<double, kLevels> ops{};
  ops[size_t(Level::Bf16)] = 3;
  ops[size_t(Level::Int8)] = 14;
  ops[size_t(Level::Int4)] = 32;
  ops[size_t(Level::Int3)] = 41;
  ops[size_t(Level::Int2)] = 41;
  ops[size_t(Level::PowerSgd)] = 15.5 * std::max(1, powersgd_rank);
  for (double& x : ops) x /= flops_per_s;
  return ops;
}

}  // namespace adgt::compress
