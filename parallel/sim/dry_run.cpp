// adgt-train --dry-run's prediction (dry_run.hpp).
#include "parallel/sim/dry_run.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "kernels/clock.hpp"
#include "kernels/cpu_threads.hpp"
#include "parallel/sim/host.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cost/flops.hpp"
#include "parallel/sim/profile.hpp"
#include "parallel/sim/step_sim.hpp"
#include "parallel/sim/work.hpp"

#include <map>

#include "core/model/param_table.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/choice.hpp"
#include "parallel/cost/stages.hpp"

namespace adgt::sim {

std::string resolve_auto_device(RunConfig& cfg, const std::string& cluster_arg) {
  if (cfg.train.device != "auto") return "";
  std::string why;
  if (!cluster_arg.empty()) {
    // A GPU cluster: no cores per node (a CPU cluster's) and a device that is
    // not a CPU rank (the emulation's cluster files name theirs cpu-rank).
    const cluster::Cluster cl = cluster::load_cluster(cluster_arg);
    const bool cpu = cl.cpu_ranks();
    cfg.train.device = cpu ? "cpu" : "cuda";
    why = cpu ? "the CPU ranks of --cluster " + cluster_arg : "the GPUs of --cluster " + cluster_arg;
  } else {
    const bool gpu = cuda_backend_built() && cuda_device_count() > 0;
    cfg.train.device = gpu ? "cuda" : "cpu";
    why = gpu ? "a CUDA device is visible here" : "no CUDA device here";
  }
  return "train.device=auto: estimated as " + cfg.train.device + " (" + why +
         "); set train.device to estimate another\n";
}

std::string precision_line(const RunConfig& cfg, const cluster::Cluster& cl) {
  const bool half = bf16_compute(cfg.train);
  const double peak = half ? cl.device.peak_bf16_flops : cl.device.peak_fp32_flops;
  char b[384];
  std::snprintf(b, sizeof b, "%s on %s (MFU against %s's %s peak, %.4g TFLOP/s per device%s)",
                cfg.train.dtype.c_str(), cfg.train.device.c_str(), cl.device.name.c_str(),
                half ? "bf16" : "fp32", peak / 1e12,
                cfg.train.dtype != "fp8"            ? ""
                : cl.device.peak_fp8_flops > 0      ? "; the layers' linears at its FP8 peak"
                                                    : "; this device has no FP8 peak: FP8 GEMMs costed at bf16's");
  return b;
}

namespace {
// Counts the ops a step asks for that the profile lacks (a pass of the
// simulator with every op at 1 us).
class MissingOps final : public OpCosts {
 public:
  explicit MissingOps(const ProfileCosts& pc) : pc_(pc) {}
  double seconds(const Op& op, int bytes) override {
    if (!pc_.has(op, bytes)) missing_.insert(to_string(op) + "/" + std::to_string(bytes));
    return 1e-6;
  }
  std::string describe() const override { return "missing ops"; }
  size_t count() const { return missing_.size(); }

 private:
  const ProfileCosts& pc_;
  std::set<std::string> missing_;
};
}  // namespace

void announce_profiling(const RunConfig& cfg, const cluster::Cluster& cl, const ProfileCosts& pc) {
  MissingOps miss(pc);
  (void)simulate_step(cfg, cl, miss);
  const double est = double(miss.count()) * kProfileSecondsPerOp + (pc.calibrated(cfg) ? 0.0 : 1.5);
  std::printf("profiling this machine's ops once (%zu ops, ~%.0f s; %s)\n", miss.count(),
              std::max(1.0, est),
              pc.path().empty() ? "not cached: ADGT_PROFILE_CACHE=off or no home directory"
                                : ("cached in " + pc.path()).c_str());
  std::fflush(stdout);
}

std::string dry_run_prediction(const RunConfig& cfg, const std::string& cluster_given) {
  const int64_t world = layout_of(cfg).world();
  // Without --cluster, a run on an emulated cluster (emulate.cluster) is
  // predicted on that cluster, as its launch plan and adgt-sim see it.
  const std::string cluster_arg = cluster_given.empty() ? cfg.emulate.cluster : cluster_given;
  cluster::Cluster cl;
  if (!cluster_arg.empty()) {
    cl = cluster::load_cluster(cluster_arg);
    // A preset or one node grows (or shrinks) to the run; a file of several
    // nodes keeps its shape when it holds the run.
    if (cl.world() < world || ((cl.preset() || cl.nodes == 1) && cl.world() != world))
      cl = cluster::with_gpus(cl, world);
  } else {
    const bool gpu = cfg.train.device == "cuda" ||
                     (cfg.train.device == "auto" && cuda_backend_built() && cuda_device_count() > 0);
    if (gpu)
      return "predicted step:   (add --cluster PRESET|FILE, e.g. --cluster dgx-h100, for the "
             "simulator's step time)\n";
    // Profiling runs each distinct op a few times: only for steps small
    // enough to profile in seconds on a CPU.
    const double flops = mfu_flops_per_token(cfg.model) * double(cfg.train.global_batch) *
                         double(cfg.model.seq_len) / double(world);
    if (flops > 5e11)
      return "predicted step:   (a step of this model is too large to profile on this CPU; add "
             "--cluster PRESET|FILE, e.g. --cluster dgx-h100, for the simulator's step time)\n";
    // This host: the run's ranks share its cores, each with the threads
    // adgt-train gives it (OMP_NUM_THREADS, else cores / ranks).
    cl = cluster::load_cluster("cpu-here");
    cl.devices_per_node = world;
    cl.cores_per_node = usable_cores();
    cl.threads_per_rank = rank_threads(int(world), int(cl.cores_per_node)).threads;
  }
  std::unique_ptr<Backend> be;
  std::unique_ptr<OpCosts> costs;
  std::unique_ptr<OpCosts> shared;  // the host's memory bandwidth over its ranks
  std::optional<ScopedCpuThreads> threads;
  ProfileCosts* profile = nullptr;
  double profiled_s = 0;
  if (cl.cpu_ranks()) {  // as adgt-sim --costs auto and the launch plan cost CPU ranks
    be = make_backend("cpu");
    // Ranks sharing a node's cores: the ops are timed at each rank's threads.
    if (cl.cores_per_node > 0) threads.emplace(int(cl.rank_threads()));
    auto pc = std::make_unique<ProfileCosts>(*be, default_profile_cache());
    profile = pc.get();
    // On the emulation's model clock the ops cost their counted FLOPs, as the
    // run's ranks, its launch plan and adgt-sim count them.
    const bool model_clock = cfg.emulate.model_clock();
    if (model_clock) pc->count_flops(cfg.emulate.model_flops);
    pc->on_first_measure([&] {
      announce_profiling(cfg, cl, *profile);
      profiled_s = -wall_seconds();
    });
    pc->calibrate(cfg);  // the in-situ factor (docs/simulator.md, "Cost tables")
    shared = shared_memory_costs(cl, *pc, model_clock);
    costs = std::move(pc);
    // MFU against this machine's measured GEMM rate, as the trainer reports it.
    cl.device.peak_fp32_flops = cl.device.peak_bf16_flops =
        model_clock ? cfg.emulate.model_flops : be->peak_tflops() * 1e12;
  } else {
    costs = std::make_unique<DeviceModelCosts>(cl.device);
  }
  OpCosts& used = shared ? *shared : *costs;
  // An emulated cluster run here on the wall clock: every rank shares this
  // host's cores, as the launch plan prices it (the virtual and model clocks
  // time each rank as if it had a core).
  SimOptions opt;
  if (cluster_given.empty() && cl.cpu_ranks()) opt.host_cores = emulated_host_cores(cfg);
  const bool on_host = opt.host_cores > 0;
  const SimResult r = simulate_step(cfg, cl, used, opt);
  std::string note;
  if (profile && profile->measured() > 0) {
    profile->save();
    profiled_s += wall_seconds();
    char b[512];
    std::snprintf(b, sizeof b, "  profile: %d ops of this machine measured in %.1f s%s\n",
                  profile->measured(), profiled_s,
                  profile->path().empty() ? " (no cache: ADGT_PROFILE_CACHE=off or no home directory)"
                                          : ("; cached in " + profile->path()).c_str());
    note = b;
  }
  if (on_host) {
    char b[256];
    std::snprintf(b, sizeof b,
                  "  cores: the %ld emulated ranks share this host's %ld cores (emulate.clock wall; "
                  "virtual or model: a core each)\n",
                  long(world), long(opt.host_cores));
    note += b;
  } else if (cl.cores_per_node > 0) {
    char b[256];
    std::snprintf(b, sizeof b, "  cores: %ld ranks on %ld cores, %ld thread(s) each%s\n",
                  long(cl.devices_per_node), long(cl.cores_per_node), long(cl.rank_threads()),
                  cl.threads_per_rank > 0 && cluster_arg.empty()
                      ? (" (" + rank_threads(int(world), int(cl.cores_per_node)).why + ")").c_str()
                      : "");
    note += b;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "predicted step:   %.4g s on %s (%ld x %ld %s; adgt-sim, %s): %.4g tokens/s, "
                "MFU %.1f%%, bubble %.1f%%, exposed communication %.3g s\n",
                r.step_time_s, cl.name.c_str(), long(cl.nodes), long(cl.devices_per_node),
                cl.device.name.c_str(), used.describe().c_str(), r.tokens_per_s, 100 * r.mfu,
                100 * r.bubble, r.exposed_comm_s());
  // The power model's energy (docs/power.md), where the costs carry it: what
  // a run's telemetry (the summary's "energy:" line) is compared with.
  if (r.energy_per_token_j > 0) {
    char e[320];
    std::snprintf(e, sizeof e, "  energy: %.4g J/token, %.0f W mean per device (%s's power model: %s)\n",
                  r.energy_per_token_j, r.mean_power_w, cl.device.name.c_str(),
                  cl.device.power.source.c_str());
    note += e;
  }
  return std::string(buf) + note + "  precision: " + precision_line(cfg, cl) + "\n" + expected_compression(cfg, cl, r.compute_s, cl.cpu_ranks()).line;
}

ExpectedCompression expected_compression(const RunConfig& cfg, const cluster::Cluster& cl,
                                         double compute_s, bool cpu_codecs) {
  using cluster::Collective;
  ExpectedCompression out;
  if (cfg.parallel.grad_compression != "auto" || cfg.parallel.dp <= 1) return out;
  const Layout lay = layout_of(cfg);
  const std::vector<int> dp = group_ranks(lay, Group::dp, 0);
  const int D = int(dp.size());
  compress::Signals s;
  s.step = cfg.train.warmup_steps + 1;
  s.warmup_steps = cfg.train.warmup_steps;
  s.ranks = D;
  s.budget = cfg.parallel.compress_error_budget;
  s.hysteresis = 0;      // a first decision
  s.noise_share = 1;     // assumed: the budget allows every level
  // The controller's probes (1 and 4096 floats per member of n), timed by
  // `time` (bytes -> seconds), fitted as the controller fits what it measures.
  auto fit = [](Collective c, int n, const auto& time) {
    const double small = 4.0 * n, big = 4.0 * 4096 * n;
    return compress::fit_link(c, n, small, time(small), big, time(big));
  };
  auto group = [&](Collective c, const std::vector<int>& g) {
    return fit(c, int(g.size()), [&](double b) { return cluster::collective_time(cl, c, g, b); });
  };
  s.all_reduce = group(Collective::AllReduce, dp);
  s.all_to_all = group(Collective::AllToAll, dp);
  // A group reduced over sites: the controller probes the cross-site group
  // (one member a site, the WAN shared as cross_site_time prices it) and a
  // site's members apart (choice.hpp prices the phases).
  const auto by = cfg.parallel.site_reduce == "flat" ? std::vector<std::vector<int>>{}
                                                     : cluster::members_by_site(cl, dp);
  if (by.size() > 1) {
    std::vector<int> cross;
    for (const auto& m : by) cross.push_back(m[0]);
    std::vector<int64_t> nodes;
    for (int w : by[0])
      if (std::find(nodes.begin(), nodes.end(), cl.node_of(w)) == nodes.end()) nodes.push_back(cl.node_of(w));
    auto across = [&](Collective c) {
      return fit(c, int(cross.size()), [&](double b) {
        return cluster::cross_site_time(cl, c, cross, b, int64_t(nodes.size()));
      });
    };
    s.sites = int(by.size());
    s.site_ranks = int(by[0].size());
    s.all_reduce = across(Collective::AllReduce);
    s.all_to_all = across(Collective::AllToAll);
    s.site_link = group(Collective::AllReduce, by[0]);
  }
  const int r = int(std::max<int64_t>(1, cfg.parallel.powersgd_rank));
  if (cpu_codecs) {
    s.codec_s_per_elem = compress::measure_codec_seconds(r);
  } else {
    // Memory-bound on the device: encode reads 4 bytes and writes the code,
    // decode the reverse; PowerSGD's products read the matrix 3 times.
    const double hbm = cl.device.hbm_bandwidth * cl.device.memory_efficiency;
    for (compress::Level l : compress::kQuantizedLevels)
      s.codec_s_per_elem[size_t(l)] =
          2 * (4.0 + double(compress::encoded_bytes(l, 1 << 16)) / 65536.0) / hbm;
    s.codec_s_per_elem[size_t(compress::Level::PowerSgd)] = 3 * 4.0 * 2 / hbm;
  }
  // Each parameter of world rank 0's first pipeline stage, by the layer
  // index rank_work's buckets use (embedding -2, the head n_layers).
  const StageSlice slice = stage_slice(stage_layer_counts(cfg), int(cfg.parallel.pp),
                                       int(cfg.parallel.virtual_stages), 0,
                                       placement_of_schedule(cfg.parallel.schedule));
  const std::vector<ParamSpec> table = build_param_table(cfg.model, cfg.parallel.tp, 0, &slice);
  struct Geo {
    int64_t n = 0, comp = 0, ps_p = 0, ps_q = 0;
  };
  std::map<int64_t, Geo> per_layer;
  for (const ParamSpec& p : table) {
    if (p.expert >= 0) continue;  // expert weights reduce over edp, not dp
    int64_t layer = int64_t(cfg.model.n_layers);
    if (p.is_embedding && p.name.rfind("model.embed_tokens", 0) == 0) layer = -2;
    if (p.name.rfind("model.layers.", 0) == 0) layer = std::stoll(p.name.substr(13));
    Geo& g = per_layer[layer];
    g.n += p.numel;
    if (p.shape.size() == 2 && p.numel >= cfg.parallel.compress_min_elems) {
      g.comp += p.numel;
      g.ps_p += p.shape[0] * r;
      g.ps_q += p.shape[1] * r;
    }
  }
  const RankWork rw = rank_work(cfg, 0);
  double total = 0;
  std::vector<Geo> geo;
  std::vector<bool> rs;
  for (const BucketWork& b : rw.buckets) {
    if (b.group != Group::dp) continue;
    Geo g;
    for (int64_t l : b.layers) {
      const Geo& x = per_layer[l];
      g.n += x.n, g.comp += x.comp, g.ps_p += x.ps_p, g.ps_q += x.ps_q;
    }
    geo.push_back(g);
    rs.push_back(b.reduce_scatter);
    total += double(g.n);
  }
  double after = total;
  for (size_t i = 0; i < geo.size(); ++i) {
    const Geo& g = geo[i];
    compress::BucketSignals b;
    b.n = g.n;
    b.compressible = g.comp;
    b.reduce_scatter = rs[i];
    const double rest = 4.0 * double(g.n - g.comp);
    b.buf[0] = 4.0 * double(g.n);
    for (compress::Level l : compress::kQuantizedLevels)
      b.buf[size_t(l)] = double(compress::encoded_bytes(l, g.comp)) +
                         rest / 4.0 * double(compress::exact_elem_bytes(l));
    b.buf[size_t(compress::Level::PowerSgd)] = g.comp > 0 ? 4.0 * double(g.ps_p) + rest : 0;
    b.buf_q = 4.0 * double(g.ps_q);
    after -= double(g.n);
    b.hide_s = total > 0 ? 2.0 / 3.0 * compute_s * after / total : 0;
    b.compute_share_s = total > 0 ? compute_s * double(g.n) / total : 0;
    s.buckets.push_back(b);
  }
  std::map<std::string, int> count;
  for (const compress::Choice& c : compress::choose_levels(s)) {
    out.levels.push_back(compress::level_name(c.level));
    ++count[out.levels.back()];
  }
  out.link_Bps = s.all_reduce.beta;
  out.link_latency_s = s.all_reduce.alpha;
  std::string mix;
  for (const auto& [name, n] : count) mix += (mix.empty() ? "" : ", ") + name + " " + std::to_string(n);
  char where[160] = "";
  if (s.sites > 1)
    std::snprintf(where, sizeof where, " over %d sites of %d, compressed across only: cross-site", s.sites,
                  s.site_ranks);
  char inside[96] = "";
  if (s.sites > 1) std::snprintf(inside, sizeof inside, ", inside a site %.4g GB/s", s.site_link.beta / 1e9);
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "grad compression: auto expects %s of %zu dp buckets after warm-up (dp=%d%s link "
                "%.4g GB/s, %.3g us%s; if the gradient noise allows; docs/compression.md)\n",
                mix.c_str(), out.levels.size(), D, where, out.link_Bps / 1e9, out.link_latency_s * 1e6,
                inside);
  out.line = buf;
  return out;
}

}  // namespace adgt::sim
