// parallel.auto at launch (launch_plan.hpp).
#include "parallel/plan/launch_plan.hpp"

#include <array>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu_threads.hpp"
#include <omp.h>
#include "parallel/cluster/collectives.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/comm/launch.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/cluster/placement.hpp"
#include "parallel/plan/planner.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/host.hpp"
#include "parallel/sim/profile.hpp"

namespace adgt::plan {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Planned {
  Plan plan;
  cluster::Cluster cluster;
  std::string text;  // the table and the comparison lines
  PlanInput input;   // what the plan was made from (costs aside)
};

std::vector<std::string> fixed_keys(const std::string& path, const std::vector<std::string>& overrides) {
  std::vector<std::string> out;
  for (const std::string& k : explicit_keys(path, overrides))
    if (k != "parallel.auto") out.push_back(k);
  return out;
}

// The table's rows each costed with the in-situ factor of their own run
// (ProfileCosts::calibrate keys it by the model, micro-batch and recompute:
// one micro-batch's forward and backward timed once per key, then cached),
// not the run file's, and re-ordered: the plan's step times are then the
// ones a --dry-run of each row prints (tests/newuser/plan_rows_agree.py).
// The factor is the run file's again afterwards.
void own_factors(Plan& p, const PlanInput& in, sim::ProfileCosts& pc, sim::OpCosts& used,
                 const RunConfig& base) {
  for (PlanRow& r : p.rows) {
    pc.calibrate(r.cfg);
    r.result = sim::simulate_step(r.cfg, in.cluster, used, in.sim);
    r.limit = plan_limit(r.result, in.cluster);
  }
  const bool energy = in.base.parallel.auto_objective == "energy";
  std::stable_sort(p.rows.begin(), p.rows.end(), [&](const PlanRow& a, const PlanRow& b) {
    return energy ? a.result.energy_per_token_j < b.result.energy_per_token_j
                  : a.result.step_time_s < b.result.step_time_s;
  });
  pc.calibrate(base);
}

// Launcher rank -> the simulator's rank: layout ranks site by site and
// node-contiguous, what topology placement makes of any launcher order
// (parallel/cluster/placement.hpp); the identity without an emulated cluster.
Placement sim_placement(const RunConfig& cfg, const cluster::Cluster& cl, int64_t world) {
  if (cfg.emulate.cluster.empty() || world > cl.world()) return {};
  return place_ranks(emulate::launcher_nodes(cl, int(world), cfg.emulate.rank_order), "topology", 1,
                     emulate::launcher_sites(cl, int(world), cfg.emulate.rank_order));
}

// The plan for `world` ranks of `cl` (costs from a profile on this CPU when
// the cluster's ranks are CPU ranks, else the device model). `fixed`: the
// keys the user set (kept). `measured`: launcher rank -> compute slowdown
// measured at run time (replaces the emulation's entries; empty at launch).
// `current`: also simulate this config on the same cluster and costs.
Planned plan_for(const RunConfig& cfg, const std::vector<std::string>& fixed, cluster::Cluster cl,
                 int64_t world, bool cpu_ranks, std::string why, int64_t max_tp = 0,
                 const std::map<int, double>* measured = nullptr, const RunConfig* current = nullptr,
                 sim::SimResult* current_result = nullptr,
                 const std::map<std::pair<int, int>, double>* measured_links = nullptr,
                 bool dry_run = false) {
  PlanInput in;
  in.max_tp = max_tp;
  // emulate.power_cap_w: the devices planned for are capped (docs/power.md),
  // unless the caller capped them already (a re-plan under a measured limit).
  if (cfg.emulate.power_cap_w > 0 && cl.device.power.on() && cl.device.power.cap_w <= 0)
    cl.device.power.cap_w = cfg.emulate.power_cap_w;
  in.base = cfg;
  in.world = world;
  in.fixed = fixed;
  // parallel.auto_trials picks among more rows than the table shows.
  if (cfg.parallel.auto_trials > 1) in.top = std::max<size_t>(in.top, size_t(16 * cfg.parallel.auto_trials));
  // Slow ranks are launcher ranks; the simulator's ranks are layout ranks in
  // node-contiguous order (what topology placement makes of any launcher
  // order, parallel/cluster/placement.hpp).
  const Placement place = sim_placement(cfg, cl, world);
  if (cfg.parallel.placement == "launcher" && !place.identity())
    why += "; note: parallel.placement=launcher keeps the launcher's order, which is not "
           "node-contiguous here; the plan assumes it is";
  else if (cfg.parallel.placement == "nodes" && place.layout_sites().size() > 0 &&
           place_ranks(place.node_of, "nodes", 1, place.site_of).launcher_of != place.launcher_of)
    why += "; note: parallel.placement=nodes ignores the sites, which the launcher's order "
           "interleaves here; the plan assumes the ranks site by site";
  const auto layout_rank = [&](int r) { return r < world ? place.layout_rank(r) : r; };
  const auto link_key = [&](int a, int b) {  // by value: std::minmax returns references
    const int x = layout_rank(a), y = layout_rank(b);
    return std::pair<int, int>(std::min(x, y), std::max(x, y));
  };
  if (measured) {
    for (const auto& [r, f] : *measured) in.sim.slow_ranks[layout_rank(r)] = f;
    if (measured_links)
      for (const auto& [ab, f] : *measured_links) in.sim.slow_links[link_key(ab.first, ab.second)] = f;
  } else {
    // A straggler injected mid-run ("rank:factor@step") is not the cluster the
    // launch finds: only the ones slow from the start count (ranks and links).
    for (const SlowRank& sr : parse_slow_rank_entries(cfg.emulate.slow_ranks))
      if (sr.from_step == 0) in.sim.slow_ranks[layout_rank(int(sr.rank))] = sr.factor;
    for (const SlowLink& sl : parse_slow_links(cfg.emulate.slow_links))
      if (sl.from_step == 0 && sl.a < world && sl.b < world)
        in.sim.slow_links[link_key(int(sl.a), int(sl.b))] = sl.factor;
  }
  std::unique_ptr<Backend> be;
  std::unique_ptr<sim::OpCosts> costs;
  std::unique_ptr<sim::OpCosts> shared;  // SharedMemoryCosts over costs, or none
  std::optional<ScopedCpuThreads> threads;
  sim::ProfileCosts* profile = nullptr;
  std::string profile_note;
  if (cpu_ranks) {
    be = make_backend("cpu");
    // Ranks sharing a node's cores: the ops are timed at each rank's threads
    // (held until the plan is made: the keys carry the count).
    if (cl.cores_per_node > 0) threads.emplace(int(cl.rank_threads()));
    // A launch caches the profile in log.dir; a dry run in this machine's
    // and binary's cache (sim::default_profile_cache: the next dry run reads
    // it), after reading a launch's from log.dir if there is one.
    std::error_code ec;
    if (!dry_run) std::filesystem::create_directories(cfg.log.dir, ec);
    std::string cache = ec ? "" : cfg.log.dir + "/plan-profile.json";
    if (dry_run && !std::filesystem::exists(cache)) cache = sim::default_profile_cache();
    auto pc = std::make_unique<sim::ProfileCosts>(*be, cache);
    if (dry_run && cache == cfg.log.dir + "/plan-profile.json") pc->read_only();
    if (dry_run)
      pc->on_first_measure([cache] {
        std::printf("profiling this machine's ops once for the planner's layouts (%s)\n",
                    cache.empty() ? "not cached: ADGT_PROFILE_CACHE=off or no home directory"
                                  : ("cached in " + cache).c_str());
        std::fflush(stdout);
      });
    // On the emulation's model clock the ranks' compute is counted FLOPs at
    // emulate.model_flops: the plan costs the ops the same way.
    const bool model_clock = cfg.emulate.model_clock();
    if (model_clock) pc->count_flops(cfg.emulate.model_flops);
    // Under a cap the ranks compute as much slower as the emulation makes
    // them (the device's power model; its peak is replaced just below).
    if (cl.device.power.on() && cl.device.power.cap_w > 0) in.sim.emulated_power_device = cl.device;
    pc->calibrate(cfg);  // the in-situ factor (docs/simulator.md, "Cost tables")
    cl.device.peak_fp32_flops = cl.device.peak_bf16_flops =
        model_clock ? cfg.emulate.model_flops : be->peak_tflops() * 1e12;
    // The host's memory bandwidth shared by the ranks that run at once.
    shared = sim::shared_memory_costs(cl, *pc, model_clock);
    profile = pc.get();
    costs = std::move(pc);
    // Every rank of the launch shares this host's cores (the emulation
    // needs one host; cpu-here says its own cores per node) — on the wall
    // clock: the virtual and model clocks time each rank as if it had a core.
    in.sim.host_cores = sim::emulated_host_cores(cfg);
  } else {
    costs = std::make_unique<sim::DeviceModelCosts>(cl.device);
  }
  in.cluster = cl;
  sim::OpCosts& used = shared ? *shared : *costs;
  const auto t0 = std::chrono::steady_clock::now();
  // The profile is measured as the sweep asks for ops; time it apart.
  Planned out{make_plan(in, used), cl, "", in};
  if (profile && !cfg.emulate.model_clock()) own_factors(out.plan, in, *profile, used, cfg);
  if (current && current_result) *current_result = sim::simulate_step(*current, cl, used, in.sim);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sim::ProfileCosts* pc = profile) {
    pc->save();
    char b[160];
    std::snprintf(b, sizeof b, "  profile: %d ops measured, %d cached; planning with the profile %.2f s\n",
                  pc->measured(), pc->cached(), total);
    profile_note = b;
  }
  out.text = format_plan(out.plan, cl);
  if (!why.empty()) out.text += "  cluster: " + why + "\n";
  out.text += profile_note;
  if (auto meg = megatron_default(in, used)) {
    char b[512];
    std::snprintf(b, sizeof b,
                  "  Megatron's default (tp = devices per node, smallest pp that fits): %s: %.4g s; "
                  "the plan is %.2fx as fast\n",
                  meg->layout.c_str(), meg->result.step_time_s,
                  meg->result.step_time_s / out.plan.chosen().result.step_time_s);
    out.text += b;
  }
  return out;
}

int ranks_per_host(const std::vector<std::string>& hosts, int64_t* nodes, std::string* why) {
  const std::vector<int> node = nodes_of_hosts(hosts);
  std::vector<int> count(size_t(*std::max_element(node.begin(), node.end()) + 1), 0);
  for (int n : node) ++count[size_t(n)];
  const int lo = *std::min_element(count.begin(), count.end());
  const int hi = *std::max_element(count.begin(), count.end());
  *nodes = int64_t(count.size());
  if (lo != hi && why)
    *why += "hosts run " + std::to_string(lo) + " to " + std::to_string(hi) +
            " ranks; planned as " + std::to_string(lo) + " devices per node. ";
  return lo;
}

}  // namespace

cluster::Cluster launch_cluster(const RunConfig& cfg, const std::vector<std::string>& hosts,
                                const std::string& gpu_name, int64_t cores, std::string* why,
                                const GpuTopology& topo, int64_t* max_tp) {
  const int64_t world = int64_t(hosts.size());
  if (!cfg.emulate.cluster.empty()) {
    cluster::Cluster cl = cluster::load_cluster(cfg.emulate.cluster);
    if (cl.preset() && cl.world() != world) cl = cluster::with_gpus(cl, world);
    if (why) *why += "emulated (emulate.cluster=" + cfg.emulate.cluster + ")";
    return cl;
  }
  int64_t nodes = 1;
  const int dpn = ranks_per_host(hosts, &nodes, why);
  cluster::Cluster cl;
  if (gpu_name.empty()) {
    cl = cluster::load_cluster("cpu-here");
    cl.cores_per_node = std::max<int64_t>(1, cores);
    if (why) *why += std::to_string(nodes) + " host(s) of " + std::to_string(dpn) + " CPU ranks";
  } else {
    const std::string g = lower(gpu_name);
    std::string preset = "dgx-h100";
    if (g.find("h200") != std::string::npos || g.find("gh200") != std::string::npos) preset = "dgx-h200";
    else if (g.find("a100") != std::string::npos) preset = "dgx-a100-80gb";
    else if (g.find("h100") == std::string::npos && why)
      *why += "no preset for GPU '" + gpu_name + "'; planned as an H100 (give a cluster file "
              "with emulate.cluster-free --cluster for a dry run). ";
    cl = cluster::load_cluster(preset);
    if (why) *why += std::to_string(nodes) + " host(s) x " + std::to_string(dpn) + " " + gpu_name +
                     " (preset " + preset + ")";
  }
  cl.nodes = nodes;
  cl.devices_per_node = dpn;
  if (!gpu_name.empty() && topo.gpus > 0 && topo.nvlink_domain < dpn) {
    cl.intra.bandwidth = 25e9;  // PCIe 4.0 x16, achieved
    cl.intra.latency = 2e-6;
    cl.intra.efficiency = 1;
    if (max_tp) *max_tp = std::max(1, topo.nvlink_domain);
    if (why)
      *why += "; nvidia-smi topo -m: NVLink joins only " + std::to_string(topo.nvlink_domain) +
              " of the host's " + std::to_string(topo.gpus) +
              " GPUs: the node's links costed as PCIe, tp kept within " +
              std::to_string(topo.nvlink_domain);
  }
  return cl;
}

namespace {
// launch_cluster for this machine's GPU (its name and NVLink topology) or
// CPU ranks (`gpu` empty), with this machine's cores: the cluster the
// launch, the re-plan and the link model all plan on.
cluster::Cluster hosts_cluster(const RunConfig& cfg, const std::vector<std::string>& hosts,
                               const std::string& gpu, std::string* why, int64_t* max_tp) {
  const GpuTopology topo = gpu.empty() ? GpuTopology{} : parse_nvidia_topology(read_nvidia_topology());
  cluster::Cluster cl = launch_cluster(cfg, hosts, gpu,
                                       std::max<int64_t>(1, std::thread::hardware_concurrency()),
                                       why, topo, max_tp);
  // The ranks run with this rank's threads (adgt-train set them at start-up).
  if (cl.cores_per_node > 0) cl.threads_per_rank = omp_get_max_threads();
  return cl;
}
}  // namespace

namespace {

// The GPU's name from nvidia-smi ("" when the run is on the CPU or it cannot tell).
std::string gpu_name_of(const RunConfig& cfg) {
  const bool gpu = cfg.train.device == "cuda" ||
                   (cfg.train.device == "auto" && cuda_backend_built() && cuda_device_count() > 0);
  if (!gpu) return "";
  std::string name;
  if (FILE* f = popen("nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null", "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, f)) name = buf;
    pclose(f);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  return name.empty() ? "unknown GPU" : name;
}

// Broadcast from rank 0; the other ranks wait without spinning (on a shared
// host their polling would steal the cores rank 0 profiles on).
std::string polite_broadcast(const std::string& text, int rank) {
  long long n = rank == 0 ? (long long)text.size() : 0;
  MPI_Request req;
  MPI_Ibcast(&n, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD, &req);
  for (int done = 0; !done;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string out = rank == 0 ? text : std::string(size_t(n), '\0');
  MPI_Bcast(out.data(), int(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return out;
}

}  // namespace

std::vector<size_t> trial_rows(const Plan& p, size_t k, double within) {
  std::vector<size_t> out;
  if (p.rows.empty() || k == 0) return out;
  const double best = p.rows.front().result.step_time_s;
  std::vector<std::array<int64_t, 4>> shapes;
  for (size_t i = 0; i < p.rows.size() && out.size() < k; ++i) {
    const RunConfig& c = p.rows[i].cfg;
    if (i > 0 && p.rows[i].result.step_time_s > best * (1.0 + within)) break;
    const std::array<int64_t, 4> sh{c.parallel.tp, c.parallel.pp, c.parallel.dp, c.parallel.ep};
    if (std::find(shapes.begin(), shapes.end(), sh) != shapes.end()) continue;
    shapes.push_back(sh);
    out.push_back(i);
  }
  return out;
}

std::vector<std::pair<size_t, int>> trial_candidates(const Plan& p, size_t k, size_t more,
                                                     double within) {
  const std::vector<size_t> lead = trial_rows(p, k, within);
  std::vector<std::pair<size_t, int>> out;
  for (size_t g = 0; g < lead.size(); ++g) out.emplace_back(lead[g], int(g));
  for (size_t g = 0; g < lead.size(); ++g) {
    const RunConfig& l = p.rows[lead[g]].cfg;
    size_t n = 0;
    for (size_t i = 0; i < p.rows.size() && n < more; ++i) {
      const RunConfig& c = p.rows[i].cfg;
      if (i == lead[g] || c.parallel.tp != l.parallel.tp || c.parallel.pp != l.parallel.pp ||
          c.parallel.dp != l.parallel.dp || c.parallel.ep != l.parallel.ep)
        continue;
      out.emplace_back(i, int(g));
      ++n;
    }
  }
  return out;
}

LaunchPlan plan_at_launch(const RunConfig& cfg, const std::string& path,
                          const std::vector<std::string>& overrides) {
  auto world = MpiComm::world("plan");
  const int rank = world->rank(), size = world->size();
  const std::vector<std::string> hosts = world->all_gather_strings(host_name());  // every rank's

  LaunchPlan lp;
  lp.hosts = hosts;
  lp.fixed = fixed_keys(path, overrides);
  std::string payload;
  if (rank == 0) {
    try {
      std::string why;
      const std::string gpu = gpu_name_of(cfg);
      int64_t max_tp = 0;
      const cluster::Cluster cl = hosts_cluster(cfg, hosts, gpu, &why, &max_tp);
      Planned p = plan_for(cfg, fixed_keys(path, overrides), cl, size, gpu.empty(), why, max_tp);
      lp.table = p.text;
      std::ostringstream os;
      os << "OK\n" << plan_json(p.plan, p.cluster) << "\n";
      for (const std::string& o : plan_overrides(p.plan.chosen().cfg)) os << o << "\n";
      // The plans to try (parallel.auto_trials), one line each after "TRIALS".
      const auto cands = trial_candidates(p.plan, size_t(std::max<int64_t>(0, cfg.parallel.auto_trials)));
      if (cands.size() > 1) {
        lp.table += "trials (parallel.auto_trials=" + std::to_string(cfg.parallel.auto_trials) +
                    "; round 1: the best plan of each structure within 25% of the best "
                    "predicted; round 2: the fastest one's next two):\n";
        for (size_t j = 0; j < cands.size(); ++j) {
          char b[80];
          std::snprintf(b, sizeof b, "  trial plan %zu (structure %d): ", j, cands[j].second);
          lp.table += b + p.plan.rows[cands[j].first].layout + "\n";
        }
        os << "TRIALS\n";
        for (const auto& [i, g] : cands) {
          std::string line = std::to_string(g);
          for (const std::string& o : plan_overrides(p.plan.rows[i].cfg)) line += "\t" + o;
          os << line << "\n";
        }
      }
      payload = os.str();
    } catch (const std::exception& e) {
      payload = std::string("ERR\n") + e.what();
    }
  }
  payload = polite_broadcast(payload, rank);
  if (payload.rfind("ERR\n", 0) == 0) throw ConfigError(payload.substr(4));
  std::istringstream is(payload.substr(3));
  std::getline(is, lp.json);
  bool trials = false;
  for (std::string line; std::getline(is, line);) {
    if (line == "TRIALS") {
      trials = true;
      continue;
    }
    if (line.empty()) continue;
    if (!trials) {
      lp.overrides.push_back(line);
      continue;
    }
    std::istringstream words(line);  // the structure, then tab-separated overrides
    std::string g;
    std::getline(words, g, '\t');
    std::vector<std::string> ov;
    for (std::string w; std::getline(words, w, '\t');)
      if (!w.empty()) ov.push_back(w);
    lp.trials.push_back(std::move(ov));
    lp.trial_group.push_back(std::stoi(g));
  }
  std::vector<std::string> all_ov = overrides;
  all_ov.insert(all_ov.end(), lp.overrides.begin(), lp.overrides.end());
  lp.cfg = load_config(path, all_ov);
  if (auto err = layout_error(lp.cfg.model, lp.cfg.train, layout_of(lp.cfg)))
    throw ConfigError(path + ": the plan breaks a layout rule: " + *err);
  validate_world(lp.cfg, size);
  return lp;
}

void write_plan_file(const std::string& dir, const std::string& json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/plan.json";
  FILE* f = ec ? nullptr : std::fopen(path.c_str(), "w");
  if (!f || std::fprintf(f, "%s\n", json.c_str()) < 0 || std::fclose(f) != 0)
    std::fprintf(stderr, "warning: parallel.auto: cannot write %s; the plan is in metrics.jsonl\n",
                 path.c_str());
}

std::string plan_dry_run(const RunConfig& cfg, const std::string& path,
                         const std::vector<std::string>& overrides,
                         const std::string& cluster_arg, int64_t gpus, RunConfig* chosen) {
  cluster::Cluster cl;
  std::string why;
  bool cpu = false;
  int64_t world = gpus;
  if (!cluster_arg.empty()) {
    cl = cluster::load_cluster(cluster_arg);
    if (world <= 0) world = cl.preset() ? layout_of(cfg).world() : cl.world();
    if (cl.world() < world || (cl.preset() && cl.world() != world)) cl = cluster::with_gpus(cl, world);
    cpu = cl.cpu_ranks();
  } else if (!cfg.emulate.cluster.empty()) {
    if (world <= 0) world = cluster::load_cluster(cfg.emulate.cluster).world();
    cl = launch_cluster(cfg, std::vector<std::string>(size_t(world), "localhost"), "", 0, &why);
    cpu = true;
  } else {
    if (world <= 0) world = layout_of(cfg).world();
    const int64_t cores = usable_cores();
    cl = launch_cluster(cfg, std::vector<std::string>(size_t(world), "localhost"), "", cores, &why);
    // The threads adgt-train will give each rank (OMP_NUM_THREADS, else cores / ranks).
    const RankThreads th = rank_threads(int(cl.devices_per_node), int(cores));
    cl.threads_per_rank = th.threads;
    why += ", " + std::to_string(th.threads) + " thread(s) each (" + th.why + ")";
    cpu = true;
  }
  Planned p = plan_for(cfg, fixed_keys(path, overrides), cl, world, cpu, why, 0, nullptr, nullptr,
                       nullptr, nullptr, /*dry_run=*/true);
  if (chosen) *chosen = p.plan.chosen().cfg;
  return p.text;
}

Replan replan(const RunConfig& cfg, const std::vector<std::string>& fixed,
              const std::vector<std::string>& hosts, const std::map<int, double>& slow,
              const std::map<std::pair<int, int>, double>& slow_links, double power_cap_w) {
  Replan out;
  std::string why;
  const std::string gpu = gpu_name_of(cfg);
  int64_t max_tp = 0;
  cluster::Cluster cl = hosts_cluster(cfg, hosts, gpu, &why, &max_tp);
  if (power_cap_w > 0) {
    if (!cl.device.power.on())
      throw ConfigError("re-planning under a " + std::to_string(power_cap_w) + " W cap: the cluster's device " +
                        cl.device.name + " has no power model (device.power, docs/cluster.md)");
    cl.device.power.cap_w = power_cap_w;
  }
  const int64_t world = int64_t(hosts.size());
  Planned p = plan_for(cfg, fixed, cl, world, gpu.empty(), why, max_tp, &slow, &cfg, &out.current,
                       &slow_links);
  out.chosen = p.plan.chosen().cfg;
  out.planned = p.plan.chosen().result;
  out.overrides = plan_overrides(out.chosen);
  out.layout_now = sim::describe_layout(cfg);
  out.layout_new = p.plan.chosen().layout;
  out.table = p.text;
  out.json = plan_json(p.plan, p.cluster);
  return out;
}

cluster::Cluster run_cluster(const RunConfig& cfg, const std::vector<std::string>& hosts) {
  std::string why;
  int64_t max_tp = 0;
  return hosts_cluster(cfg, hosts, gpu_name_of(cfg), &why, &max_tp);
}

std::map<std::pair<int, int>, double> link_model_times(const RunConfig& cfg,
                                                       const std::vector<std::string>& hosts,
                                                       const std::vector<std::pair<int, int>>& links,
                                                       double bytes) {
  std::string why;
  int64_t max_tp = 0;
  const cluster::Cluster cl = hosts_cluster(cfg, hosts, gpu_name_of(cfg), &why, &max_tp);
  const int64_t world = int64_t(hosts.size());
  const Placement place = sim_placement(cfg, cl, world);
  const auto layout_rank = [&](int r) { return r < world ? place.layout_rank(r) : r; };
  std::map<std::pair<int, int>, double> out;
  for (const auto& [a, b] : links)
    if (a != b && layout_rank(a) < cl.world() && layout_rank(b) < cl.world())
      out[{a, b}] = cluster::message_time(cl, layout_rank(a), layout_rank(b), bytes,
                                          world / std::max<int64_t>(1, cfg.parallel.pp));
  return out;
}

}  // namespace adgt::plan
