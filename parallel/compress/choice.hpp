// The level choice of parallel.grad_compression=auto (docs/compression.md,
// "Controller"): a pure function of measured signals. The controller that
// measures them and applies the choice: parallel/control/compress_controller.hpp.
// The signals: the dp group's link, the compute the reduce can hide under,
// the gradient noise scale, Accordion's critical-regime signal and the
// error-feedback residuals.
//
// The rule, per bucket i (predict_seconds gives t_i(l), the time level l adds
// to the step):
//  - warm-up (the next step, step + 1, <= train.warmup_steps): off;
//  - a bucket with no compressible tensor: off;
//  - allowed levels: error_prior(l) <= budget * rho, with rho the noise share
//    of the reduced gradient's squared norm, S/B / (|G|^2 + S/B) (McCandlish et
//    al. 2018; B the global batch), divided by 4 in Accordion's critical
//    regime (the bucket's norm changed by >= 50% since the last interval);
//    a bucket whose EF residual exceeds ef_limit x its gradient (squared)
//    may not go above one level below its current one; off and bf16 are
//    always allowed;
//  - best = min over allowed l of t_i(l); the candidates are the allowed l
//    with t_i(l) <= best + tolerance * (best + c_i), c_i the bucket's share
//    (by elements) of the step's compute: "within 5% of the fastest" on the
//    bucket's part of the step; the least compressed candidate (level_order:
//    off, bf16, int8, int4, int3, int2, powersgd) wins;
//  - hysteresis: the current level stays while it is allowed and
//    t_i(cur) <= best + (tolerance + hysteresis) * (best + c_i).
// The compressed buckets of a level are reduced in one batch (one collective
// per stage, grad_reducer.hpp): a compressed level's t_i counts its bytes and
// 1/m of each collective's latency term, m the buckets that can compress.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/compress/level.hpp"

namespace adgt::compress {

// One measured link: latency (s) and bandwidth (bytes/s) of a group of
// `ranks` members as the cluster model's one-node collective (collectives.hpp).
struct LinkFit {
  double alpha = 0, beta = 1e12;
};

// Fits alpha and beta so that the cluster model's collective `c` over `ranks`
// members takes t_small for small_bytes and t_big for big_bytes (alpha from the
// small one, then beta by bisection on the big one).
LinkFit fit_link(cluster::Collective c, int ranks, double small_bytes, double t_small,
                 double big_bytes, double t_big);
// The model's time of `c` over `ranks` members of one node joined by `l`.
double link_time(cluster::Collective c, int ranks, const LinkFit& l, double bytes);

struct BucketSignals {
  int64_t n = 0;               // elements
  int64_t compressible = 0;    // elements of compressible tensors in it
  bool reduce_scatter = false; // ZeRO-1 bucket
  // Full buffer bytes of one member for the level's collectives, by the enum
  // value: off: the fp32 all-reduce (reduce-scatter); bf16/int8/int4/int3/int2:
  // each all-to-all of the encoded
  // chunks; powersgd: the P all-reduce (buf) and the Q all-reduce (buf_q).
  std::array<double, kLevels> buf{};
  double buf_q = 0;
  double hide_s = 0;           // compute after the bucket starts (an off bucket's reduce hides under it)
  double compute_share_s = 0;  // its share of the step's compute (the 5% tolerance's base)
  double rel_change = -1;      // Accordion: |‖g‖ - ‖g‖prev| / ‖g‖prev over the interval; < 0: unknown
  double ef_ratio = 0;         // |EF residual|^2 / |gradient|^2
  Level current = Level::None;
};

struct Signals {
  int64_t step = 0, warmup_steps = 0;  // step: the last finished one (the levels apply from step + 1)
  int ranks = 1;                                // the dp group's size
  // Flat: the group's links. Over sites (sites > 1): the cross-site group's
  // (one member per site), each member's shard crossing there.
  LinkFit all_reduce, all_to_all;               // measured (smoothed)
  // A group reduced over sites (parallel.site_reduce: hierarchical,
  // parallel/comm/site_comm.hpp): `sites` sites of site_ranks members each
  // (sites * site_ranks = ranks); 0: flat. Inside a site the reduction is
  // fp32 at every level (reduce-scatter of the bucket, then all-gather) over
  // `site_link`; a level compresses only the cross-site exchange of each
  // member's 1/site_ranks shard (GradReducer::reduce_over_sites).
  int sites = 0, site_ranks = 0;
  LinkFit site_link;                            // inside a site (all-reduce fit), measured
  std::array<double, kLevels> codec_s_per_elem{};  // measured encode+decode seconds per element
  double noise_share = -1;  // rho = (S/B) / (|G|^2 + S/B) of the reduced gradient; < 0: unknown
  double budget = 1;        // parallel.compress_error_budget
  double tolerance = 0.05;  // "within 5% of the fastest"
  double hysteresis = 0.1;  // parallel.compress_hysteresis
  double critical_change = 0.5;  // Accordion's threshold on rel_change
  double ef_limit = 10;          // EF residual / gradient (squared) above which a bucket steps down
  // Whether auto may choose int2. Off in the trainer: on the acceptance
  // benchmark (50 Mbit/s, 600 steps, 3 seeds) auto with int2 met the bytes
  // bound but lost 3.7% in validation loss (bound 2%), the harm error feedback
  // defers step after step, which no per-step signal here sees
  // (docs/compression.md). int2 stays a fixed level (grad_compression: int2).
  bool auto_int2 = false;
  std::vector<BucketSignals> buckets;
};

// Relative squared error a level adds to the gradient it sends (round trip of
// N(0, s) data, docs/compression.md's codec table; PowerSGD: an assumed 0.25).
double error_prior(Level l);
// Seconds level l adds to the step for bucket b (transfer by the α–β model of
// collectives.hpp, codec cost, an off bucket's overlap with the compute after
// it). A compressed level counts its collectives' bytes and 1/m of their
// latency, m the buckets of s with a compressible tensor (a batch shares one
// collective per stage). Over sites (s.sites > 1) SiteComm's phases: inside
// each site the fp32 reduce-scatter of the bucket and (all-reduce buckets,
// and every compressed one) the all-gather back, at every level, plus the
// cross-site exchange of the 1/site_ranks shard: off, its fp32 all-reduce
// (reduce-scatter); a quantized level, its encoded chunks (buf / site_ranks)
// and the codec on the shard; PowerSGD, its P and Q all-reduces through the
// same phases.
double predict_seconds(const Signals& s, const BucketSignals& b, Level l);

struct Choice {
  Level level = Level::None;
  std::array<double, kLevels> predicted{};  // predict_seconds per level
  std::string reason;  // "warm-up", "no compressible tensor", "fastest", "kept (hysteresis)", ...
};
std::vector<Choice> choose_levels(const Signals& s);

// Encode+decode seconds per element of each level on this host (what the
// controller measures at its first decision).
std::array<double, kLevels> measure_codec_seconds(int powersgd_rank);
// The same from a fixed count of operations per element at `flops_per_s`
// (the emulation's model clock, emulate.clock: model): what the codecs
// measured on the development VM (2026-12, at 1e10: bf16 0.28 ns, int8 1.4,
// int4 3.2, int3 and int2 4.1, PowerSGD rank 4 6.2), so a controller on that
// clock decides the same on any machine under any load.
std::array<double, kLevels> model_codec_seconds(int powersgd_rank, double flops_per_s);

nlohmann::json to_json(const Signals& s);
Signals signals_from_json(const nlohmann::json& j);

}  // namespace adgt::compress
