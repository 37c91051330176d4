#include "parallel/control/compress_controller.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/check.hpp"
#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/bucket_reduce.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/powersgd.hpp"
#include "parallel/comm/site_comm.hpp"
#include "parallel/dp/grad_reducer.hpp"
#include "parallel/emulate/slowdown.hpp"

namespace adgt::compress {

namespace {

// Seconds of `c` on `comm` with a buffer of `elems` floats per member: the
// fastest of 3 rounds, each entered together (barrier). On the emulation's
// virtual clock (emulate.clock: virtual) timed on that clock: the link
// model's time, whatever the host's load. On the wall clock a loaded host
// (4 ranks on 2 cores beside two CPU hogs) stalled every round of a
// 100 Gbit/s probe often enough to read 0.06 GB/s and compress on a fast
// link (compress_controller_schedule_np4 failed 3 runs in 5 that way).
double probe(Comm& comm, cluster::Collective c, int64_t elems, const emulate::ComputeSlowdown& clk) {
  std::vector<float> in(size_t(elems), 1.0f), out(size_t(elems), 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    const double t0 = clk.now();  // the emulation's clock; the wall clock without one
    if (c == cluster::Collective::AllToAll)
      comm.all_to_all(Tensor(out.data(), DType::F32, {elems}), Tensor(in.data(), DType::F32, {elems}));
    else
      comm.all_reduce(Tensor(in.data(), DType::F32, {elems}));
    best = std::min(best, clk.now() - t0);
  }
  return best;
}

class CompressController final : public Controller {
 public:
  CompressController(const RunConfig& cfg, Engine& e) : cfg_(cfg) {
    interval_ = std::max<int64_t>(1, cfg.parallel.compress_interval);
    warmup_ = cfg.train.warmup_steps;
    norms_ = std::make_shared<BucketNormTracker>(e.backend(), e.reducer().buckets().size());
    e.reducer().set_norm_tracker(norms_);
  }
  std::string name() const override { return "grad-compression"; }
  // Every compress_interval steps, and after the last warm-up step: the
  // schedule, not the interval, says when compression may start.
  bool due(const StepReport& r) const override {
    return r.step > r.first_step && (r.step % interval_ == 0 || (warmup_ > 0 && r.step == warmup_));
  }

  nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) override {
    GradReducer& red = e.reducer();
    const int D = e.groups().dp->size();
    rank_ = world.rank();
    step_ = r.step;
    // Bucket count: the longest list over the world (stages differ under pp).
    double kk[1] = {double(red.buckets().size())};
    world.all_reduce(Tensor(kk, DType::F64, {1}), ReduceOp::Max);
    const size_t K = size_t(kk[0]);
    if (!codec_measured_) {
      const int rank = int(red.compression().powersgd_rank);
      const emulate::ComputeSlowdown* slow = e.groups().slowdown;
      codec_ = slow && slow->model_clock() ? model_codec_seconds(rank, cfg_.emulate.model_flops)
                                           : measure_codec_seconds(rank);
      codec_measured_ = true;
    }
    const std::vector<double> mx = agreed_maxima(e, r, world, K);
    int64_t steps = 0;
    const std::vector<double> sm = agreed_norm_sums(red, world, K, steps);

    Signals s;
    s.step = r.step;
    s.warmup_steps = cfg_.train.warmup_steps;
    s.ranks = D;
    s.budget = cfg_.parallel.compress_error_budget;
    s.hysteresis = cfg_.parallel.compress_hysteresis;
    if (mx[kSites] > 1) {
      s.sites = int(mx[kSites]);
      s.site_ranks = int(mx[kSites + 1]);
    }
    if (smooth_links(D, s.sites, s.site_ranks, mx)) s.hysteresis = 0;
    s.all_reduce = ar_;
    s.all_to_all = aa_;
    s.site_link = site_;
    for (int l = 0; l < kLevels; ++l) s.codec_s_per_elem[size_t(l)] = mx[kCodec + size_t(l)];
    compute_s_ = compute_s_ > 0 ? 0.5 * (compute_s_ + mx[kCompute]) : mx[kCompute];
    double g2 = 0, tr = 0;
    const double b_noise = noise_scale(s, D, sm, steps, g2, tr);
    add_bucket_signals(s, red, K, mx, sm, steps);
    agree_current_levels(s, red, world, K);

    nlohmann::json in = to_json(s);
    in["measured"] = {{"compute_s", compute_s_},
                      {"reduce_s", mx[kCompute + 1]},
                      {"probe_s", {mx[0], mx[1], mx[2], mx[3]}},
                      {"grad_sq", g2},
                      {"trace_sigma", tr},
                      {"noise_scale_tokens", b_noise},
                      {"lr", r.lr},
                      {"norm_steps", steps}};
    if (s.sites > 1) in["measured"]["site_probe_s"] = {mx[4], mx[5]};
    return in;
  }

  nlohmann::json decide(const nlohmann::json& in) override {
    const Signals s = signals_from_json(in);
    const std::vector<Choice> cs = choose_levels(s);
    nlohmann::json d;
    nlohmann::json levels = nlohmann::json::array(), why = nlohmann::json::array();
    double chosen = 0, off = 0;
    for (const Choice& c : cs) {
      levels.push_back(level_name(c.level));
      why.push_back(c.reason);
      chosen += c.predicted[size_t(c.level)];
      off += c.predicted[0];
    }
    d["levels"] = levels;
    d["reasons"] = why;
    d["predicted_reduce_s"] = chosen;
    d["predicted_reduce_off_s"] = off;
    return d;
  }

  void apply(Engine& e, const nlohmann::json& d) override {
    GradReducer& red = e.reducer();
    const auto& levels = d.at("levels");
    for (size_t i = 0; i < red.buckets().size() && i < levels.size(); ++i)
      red.set_level(int(i), parse_level(levels[i].get<std::string>()));
    // ADGT_LOG_CONTROLLER=1: every rank prints what it applied (the tests
    // compare the ranks).
    if (const char* v = std::getenv("ADGT_LOG_CONTROLLER"); v && *v && *v != '0')
      std::fprintf(stderr, "grad-compression rank %d step %ld applied %s\n", rank_, long(step_),
                   levels.dump().c_str());
  }

 private:
  // The probes' sizes in floats per member of the probed group: latency (1
  // float) and bandwidth (4096 floats, 16 KiB).
  static int64_t small_probe(int D) { return D; }
  static int64_t big_probe(int D) { return 4096 * int64_t(D); }
  // agreed_maxima's layout: kGlobals values (4 probe times: all-reduce and
  // all-to-all, small and big, of the dp group or, over sites, of the
  // cross-site group; 2 of the site's group (all-reduce, small and big); the
  // sites and members a site (0 0: flat); compute, reduce; codec seconds per
  // level), then kPerBucket per bucket (elements, compressible elements,
  // reduce-scatter, the level's buffer bytes, PowerSGD's Q bytes).
  static constexpr size_t kSites = 6, kCompute = 8, kCodec = 10;
  static constexpr size_t kGlobals = kCodec + kLevels, kPerBucket = 3 + kLevels + 1;

  // The dp group's probes (between steps: no step's dp bytes count them) —
  // over sites, the cross-site group's and the site's (SiteComm's phases are
  // priced apart: choice.hpp) —, the step's compute and reduce seconds, the
  // codec times and every bucket's geometry, each the maximum over the world
  // (a run whose groups differ, some over sites and some flat, is priced
  // over sites with the slowest links of each kind).
  std::vector<double> agreed_maxima(Engine& e, const StepReport& r, Comm& world, size_t K) {
    GradReducer& red = e.reducer();
    Comm& dp = *e.groups().dp;
    const auto& bk = red.buckets();
    const compress::Settings& set = red.compression();
    double probes[6] = {0, 0, 0, 0, 0, 0}, sites[2] = {0, 0};
    const emulate::ComputeSlowdown& clk = e.slowdown();
    auto* sc = dynamic_cast<SiteComm*>(&red.data_group());
    Comm& across = sc ? sc->cross() : dp;
    const int D = across.size();
    if (D > 1) {
      probes[0] = probe(across, cluster::Collective::AllReduce, small_probe(D), clk);
      probes[1] = probe(across, cluster::Collective::AllReduce, big_probe(D), clk);
      probes[2] = probe(across, cluster::Collective::AllToAll, small_probe(D), clk);
      probes[3] = probe(across, cluster::Collective::AllToAll, big_probe(D), clk);
    }
    if (sc) {
      const int k = sc->local().size();
      sites[0] = sc->cross().size();
      sites[1] = k;
      if (k > 1) {
        probes[4] = probe(sc->local(), cluster::Collective::AllReduce, small_probe(k), clk);
        probes[5] = probe(sc->local(), cluster::Collective::AllReduce, big_probe(k), clk);
      }
    }
    const size_t G = kGlobals, F = kPerBucket;
    std::vector<double> mx(G + K * F, 0.0);
    for (int i = 0; i < 6; ++i) mx[size_t(i)] = probes[i];
    mx[kSites] = sites[0];
    mx[kSites + 1] = sites[1];
    mx[kCompute] = std::max(0.0, r.seconds - red.last_wait_seconds() - red.last_compression().seconds);
    mx[kCompute + 1] = red.last_wait_seconds() + red.last_compression().seconds;  // measured reduce time
    for (int l = 0; l < kLevels; ++l) mx[kCodec + size_t(l)] = codec_[size_t(l)];
    const std::vector<ParamSpec>& table = e.model().table();
    for (size_t i = 0; i < bk.size(); ++i) {
      const GradBucket& b = bk[i];
      const int64_t n = b.end - b.begin;
      const bool rs = b.op == BucketOp::ReduceScatter;
      int64_t comp = 0, ps_p = 0, ps_q = 0;
      for (const ParamSpec& p : table) {
        if (!compressible(p, set.min_elems) || p.offset < b.begin || p.offset + p.numel > b.end) continue;
        comp += p.numel;
        ps_p += p.shape[0] * set.powersgd_rank;
        ps_q += p.shape[1] * set.powersgd_rank;
      }
      double* f = &mx[G + i * F];
      f[0] = double(n);
      f[1] = double(comp);
      f[2] = rs ? 1 : 0;
      f[3] = 4.0 * double(n);
      const int Dg = dp.size();  // the level's chunks: over the whole group
      for (Level l : kQuantizedLevels) {
        int64_t words = 0;
        for (int d = 0; d < Dg; ++d) {
          const auto [lo, hi] = chunk_range(n, Dg, d, rs);
          if (hi > lo) words += chunk_words(l, chunk_layout(table, b.begin + lo, b.begin + hi, set.min_elems));
        }
        f[3 + int(l)] = 4.0 * double(words);
      }
      f[3 + int(Level::PowerSgd)] = comp > 0 ? 4.0 * double(ps_p + (n - comp)) : 0;
      f[3 + kLevels] = 4.0 * double(ps_q);
    }
    world.all_reduce(Tensor(mx.data(), DType::F64, {int64_t(mx.size())}), ReduceOp::Max);
    return mx;
  }

  // The sums over the world of the squared gradient norms (local and reduced,
  // all-reduce buckets) and of the error-feedback residuals: [local total,
  // reduced total, then per bucket local, reduced, residual]. `steps`: the
  // steps they were summed over. Resets the reducer's norm statistics.
  std::vector<double> agreed_norm_sums(GradReducer& red, Comm& world, size_t K, int64_t& steps) {
    const auto& bk = red.buckets();
    const BucketNormStats& ns = norms_->stats();
    std::vector<double> sm(2 + K * 3, 0.0);
    for (size_t i = 0; i < bk.size(); ++i) {
      const bool ar = ns.reduced_sq.size() > i && ns.reduced_sq[i] >= 0;
      if (ns.local_sq.size() > i) sm[2 + 3 * i] = ns.local_sq[i];
      if (ar) {
        sm[2 + 3 * i + 1] = ns.reduced_sq[i];
        sm[0] += ns.local_sq[i];
        sm[1] += ns.reduced_sq[i];
      }
      double res = 0;
      const compress::BucketCodecState& st = red.state(int(i)).codec;
      for (float v : st.residual) res += double(v) * v;
      for (float v : st.owner_residual) res += double(v) * v;
      sm[2 + 3 * i + 2] = res;
    }
    steps = ns.steps;
    world.all_reduce(Tensor(sm.data(), DType::F64, {int64_t(sm.size())}), ReduceOp::Sum);
    norms_->reset();
    return sm;
  }

  // Links: exponential moving averages (weight 1/2) of latency and time per
  // byte; a bandwidth that moved by more than kLinkJump either way is a
  // changed link, not noise: the average restarts from the new probe and
  // this decision has no hysteresis, so the levels follow a link change at
  // the next interval (an average would take log2(ratio) intervals to
  // forget a 2000x slower link, and hysteresis would keep a compressed
  // level that costs little more on a fast link). Returns whether a link changed.
  // Over sites (sites > 1): the cross-site group's links (sites members)
  // and the site's (site_ranks members).
  bool smooth_links(int D, int sites, int site_ranks, const std::vector<double>& mx) {
    if (sites > 1) D = sites;
    const int64_t small = small_probe(D), big = big_probe(D);
    const LinkFit ar = fit_link(cluster::Collective::AllReduce, D, 4.0 * small, mx[0], 4.0 * big, mx[1]);
    const LinkFit aa = fit_link(cluster::Collective::AllToAll, D, 4.0 * small, mx[2], 4.0 * big, mx[3]);
    const int k = site_ranks;
    const LinkFit in = sites > 1 ? fit_link(cluster::Collective::AllReduce, k, 4.0 * small_probe(k), mx[4],
                                            4.0 * big_probe(k), mx[5])
                                 : LinkFit{};
    constexpr double kLinkJump = 4;
    bool link_changed = false;
    auto smooth = [&](LinkFit& avg, const LinkFit& now) {
      const double ratio = links_ && avg.beta > 0 && now.beta > 0 ? now.beta / avg.beta : 0;
      if (links_ && (ratio > kLinkJump || ratio < 1 / kLinkJump)) link_changed = true;
      if (!links_ || ratio > kLinkJump || ratio < 1 / kLinkJump) return void(avg = now);
      avg.alpha = 0.5 * (avg.alpha + now.alpha);
      avg.beta = 1.0 / (0.5 * (1.0 / avg.beta + 1.0 / now.beta));
    };
    smooth(ar_, ar);
    smooth(aa_, aa);
    if (sites > 1) smooth(site_, in);
    links_ = true;
    return link_changed;
  }

  // Gradient noise scale (McCandlish et al. 2018, appendix A): B_small =
  // B/D per replica, B_big = B, in tokens. Sets s.noise_share and g2, tr (the
  // smoothed |G|^2 and trace of the covariance); returns the noise scale in
  // tokens (-1: unknown).
  double noise_scale(Signals& s, int D, const std::vector<double>& sm, int64_t steps, double& g2,
                     double& tr) {
    double b_noise = -1;
    const double Bb = double(cfg_.train.global_batch * cfg_.model.seq_len), Bs = Bb / D;
    if (steps > 0 && D > 1 && sm[1] > 0) {
      const double gs = double(D) * sm[0] / double(steps), gb = sm[1] / double(steps);
      const double g2_now = (Bb * gb - Bs * gs) / (Bb - Bs);
      const double s_now = (gs - gb) / (1.0 / Bs - 1.0 / Bb);
      if (std::isfinite(g2_now) && std::isfinite(s_now)) {  // a non-finite step is left out
        g2_ = noise_ ? 0.5 * (g2_ + g2_now) : g2_now;
        tr_ = noise_ ? 0.5 * (tr_ + s_now) : s_now;
        noise_ = true;
      }
    }
    if (noise_) {
      g2 = g2_;
      tr = tr_;
      const double sb = std::max(0.0, tr) / Bb;
      s.noise_share = g2 > 0 ? sb / (g2 + sb) : 1.0;
      if (g2 > 0) b_noise = tr / g2;
    }
    return b_noise;
  }

  // One BucketSignals per bucket of the longest list (K) from the agreed
  // maxima and sums.
  void add_bucket_signals(Signals& s, GradReducer& red, size_t K, const std::vector<double>& mx,
                          const std::vector<double>& sm, int64_t steps) {
    const size_t G = kGlobals, F = kPerBucket;
    const size_t have = red.buckets().size();
    double total = 0;
    for (size_t i = 0; i < K; ++i) total += mx[G + i * F];
    prev_norm_.resize(K, -1);
    double after = total;
    for (size_t i = 0; i < K; ++i) {
      const double* f = &mx[G + i * F];
      BucketSignals b;
      b.n = int64_t(f[0]);
      b.compressible = int64_t(f[1]);
      b.reduce_scatter = f[2] > 0;
      for (int l = 0; l < kLevels; ++l) b.buf[size_t(l)] = f[3 + l];
      b.buf_q = f[3 + kLevels];
      after -= f[0];
      // The bucket starts during the backward (about 2/3 of the compute), in
      // bucket order: what follows it can hide an off bucket's all-reduce.
      b.hide_s = total > 0 ? 2.0 / 3.0 * compute_s_ * after / total : 0;
      b.compute_share_s = total > 0 ? compute_s_ * f[0] / total : 0;
      const double norm = steps > 0 ? std::sqrt(sm[2 + 3 * i + 1] / double(steps)) : -1;
      if (norm > 0 && prev_norm_[i] > 0) b.rel_change = std::abs(norm - prev_norm_[i]) / prev_norm_[i];
      if (norm > 0) prev_norm_[i] = norm;
      const double local = steps > 0 ? sm[2 + 3 * i] / double(steps) : 0;
      b.ef_ratio = local > 0 ? sm[2 + 3 * i + 2] / local : 0;
      b.current = i < have ? red.level(int(i)) : Level::None;
      s.buckets.push_back(b);
    }
  }

  // Ranks with fewer buckets report off for the missing ones: take the
  // level of the ranks that have them (max over the world of the level).
  void agree_current_levels(Signals& s, GradReducer& red, Comm& world, size_t K) {
    std::vector<double> cur(K, 0.0);
    for (size_t i = 0; i < red.buckets().size(); ++i) cur[i] = double(int(red.level(int(i))));
    if (K > 0) world.all_reduce(Tensor(cur.data(), DType::F64, {int64_t(K)}), ReduceOp::Max);
    for (size_t i = 0; i < K; ++i) s.buckets[i].current = Level(int(cur[i]));
  }

  RunConfig cfg_;
  std::shared_ptr<BucketNormTracker> norms_;  // fed by the reducer, read at each decision
  int64_t interval_ = 20, warmup_ = 0;
  bool codec_measured_ = false, links_ = false, noise_ = false;
  std::array<double, kLevels> codec_{};
  LinkFit ar_, aa_, site_;  // site_: inside a site (a group over sites)
  double compute_s_ = 0, g2_ = 0, tr_ = 0;
  int rank_ = 0;
  int64_t step_ = 0;
  std::vector<double> prev_norm_;
};

}  // namespace

std::unique_ptr<Controller> make_compress_controller(const RunConfig& cfg, Engine& e) {
  return std::make_unique<CompressController>(cfg, e);
}


}  // namespace adgt::compress
