// adgt-sim: one training step of a run file simulated on a cluster
// (docs/simulator.md). The layout and batch come from the run file's keys as
// for adgt-train; --sweep ranks every feasible layout instead.
#include <CLI/CLI.hpp>

#include "apps/cli_parse.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/trace.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu_threads.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/pipeline/instruction.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/sim/dry_run.hpp"
#include "parallel/sim/host.hpp"
#include "parallel/sim/profile.hpp"
#include "parallel/sim/step_sim.hpp"
#include "parallel/sim/sweep.hpp"

namespace {

// "3:2.0,5:1.5" with emulate.slow_ranks' rules (core/config.hpp parse_slow_ranks).
std::map<int, double> parse_slow(const std::string& s) {
  std::map<int, double> out;
  for (const auto& [r, f] : adgt::parse_slow_ranks(s)) out[int(r)] = f;
  return out;
}

void print_result(const adgt::RunConfig& cfg, const adgt::cluster::Cluster& cl,
                  const adgt::sim::SimResult& r, const std::string& costs) {
  std::printf("run:              %s\n", cfg.source.c_str());
  std::printf("cluster:          %s: %ld x %ld %s (%s)\n", cl.name.c_str(), long(cl.nodes),
              long(cl.devices_per_node), cl.device.name.c_str(), cl.source.c_str());
  std::printf("costs:            %s\n", costs.c_str());
  std::printf("precision:        %s\n", adgt::sim::precision_line(cfg, cl).c_str());
  std::printf("layout:           %s (%ld ranks, %ld micro-batches)\n",
              adgt::sim::describe_layout(cfg).c_str(), long(r.world), long(r.microbatches));
  std::printf("step time:        %.6g s\n", r.step_time_s);
  std::printf("tokens/s:         %.6g\n", r.tokens_per_s);
  std::printf("TFLOP/s per GPU:  %.4g (MFU %.1f%%, model FLOPs without recompute)\n",
              r.tflops_per_gpu, 100 * r.mfu);
  std::printf("bubble:           %.1f%%\n", 100 * r.bubble);
  std::printf("exposed comm:     %.4g s (tp %.4g, pp %.4g, dp %.4g, ep %.4g, cp %.4g, step %.4g)\n",
              r.exposed_comm_s(), r.exposed_tp_s, r.exposed_pp_s, r.exposed_dp_s, r.exposed_ep_s,
              r.exposed_cp_s, r.exposed_step_s);
  if (r.wan_bytes > 0)
    std::printf("WAN:              %.4g MB per step across the sites, %.4g s of the busiest rank in "
                "WAN phases, about %.4g s of it exposed (within dp and pp above)\n",
                r.wan_bytes / 1e6, r.wan_s, r.exposed_wan_s);
  std::printf("compute:          %.4g s (busiest rank), optimizer %.4g s\n", r.compute_s,
              r.optimizer_s);
  std::printf("memory:           %.2f GiB (largest rank, the --dry-run estimate)\n",
              r.memory_bytes_max / 1073741824.0);
  const adgt::cluster::PowerModel& pw = cl.device.power;
  if (r.energy_j > 0)
    std::printf("energy:           %.4g J/token, %.4g W per device on average (%s; power cap %.0f W%s; "
                "idle %.0f W; devices only, no links or hosts)\n",
                r.energy_per_token_j, r.mean_power_w, pw.source.c_str(), pw.cap(),
                pw.cap_w > 0 ? ", --power-cap" : ", the limit", pw.idle_w);
  else
    std::printf("energy:           not modelled (%s)\n",
                pw.on() ? "measured op costs carry no energy" : "the cluster's device has no power model");
  if (r.limiter_braked >= 0)
    std::printf("limiter:          braked %.1f%% of the compute, x%.3f (the busiest pipeline rank; window "
                "%.3g ms, brake clock %.2f, hold %.3g ms: docs/power.md)\n",
                100 * r.limiter_braked, r.limiter_slowdown, 1e3 * pw.limiter_window_s, pw.limiter_brake_clock,
                1e3 * pw.limiter_hold_s);
}

// The command line.
struct Cli {
  std::string config_path, cluster_name = "dgx-h100", costs_mode = "auto", profile_cache, slow;
  std::string trace_path;  // --trace
  double power_cap = 0;    // --power-cap W (0: none)
  std::string objective = "time";  // --objective: how --sweep ranks
  std::vector<std::string> overrides;
  int64_t gpus = 0, host_cores = 0, top = 10, cold_mib = 16;
  bool json = false, sweep = false, sweep_all = false, dropout = false, no_calibrate = false;
  std::string attention = "flash", sync = "0";
  double moe_skew = 0;
  bool cluster_given = false;
  bool print_cluster = false;  // --print-cluster
};

// The op costs: measured on this CPU (a profile, calibrated unless
// --no-calibrate; the cluster's peak becomes this machine's GEMM rate) or the
// device model. `be` keeps the profile's backend.
std::unique_ptr<adgt::sim::OpCosts> make_costs(const Cli& cli, const adgt::RunConfig& cfg,
                                               adgt::cluster::Cluster& cl, std::unique_ptr<adgt::Backend>& be) {
  const bool profile =
      cli.costs_mode == "profile" || (cli.costs_mode == "auto" && cl.cpu_ranks());
  if (cli.costs_mode != "auto" && cli.costs_mode != "model" && cli.costs_mode != "profile")
    throw adgt::ConfigError("--costs: expected auto, model or profile, got '" + cli.costs_mode + "'");
  if (!profile) return std::make_unique<adgt::sim::DeviceModelCosts>(cl.device);
  be = adgt::make_backend("cpu");
  // Ranks sharing a node's cores run (and so are profiled) on the cluster's
  // threads per rank (cluster.hpp; cpu-here: cores / ranks per node).
  if (cl.cores_per_node > 0) adgt::set_cpu_threads(int(cl.rank_threads()));
  auto pc = std::make_unique<adgt::sim::ProfileCosts>(*be, cli.profile_cache, 0.01,
                                                       size_t(cli.cold_mib) << 20);
  // The run file on the emulation's model clock (emulate.clock: model): the
  // ops cost their counted matmul FLOPs at emulate.model_flops, as the run's
  // ranks time their compute.
  const bool model_clock = cfg.emulate.model_clock();
  if (model_clock) pc->count_flops(cfg.emulate.model_flops);
  if (!cli.no_calibrate) pc->calibrate(cfg);
  // MFU against this machine's measured GEMM rate, as the trainer reports it.
  cl.device.peak_fp32_flops = cl.device.peak_bf16_flops =
      model_clock ? cfg.emulate.model_flops : be->peak_tflops() * 1e12;
  return pc;
}

// The simulation's options from the command line and the run file's emulate.*.
adgt::sim::SimOptions sim_options(const Cli& cli, const adgt::RunConfig& cfg, const std::string& slow) {
  adgt::sim::SimOptions opts;
  opts.host_cores = cli.host_cores;
  opts.slow_ranks = parse_slow(slow);
  // The run file's slow links (emulate.slow_links: every entry, its onset aside).
  for (const adgt::SlowLink& l : adgt::parse_slow_links(cfg.emulate.slow_links))
    opts.slow_links[{int(std::min(l.a, l.b)), int(std::max(l.a, l.b))}] = l.factor;
  if (cli.host_cores > 0) {
    if (cli.sync == "auto") {
      const int procs = int(adgt::layout_of(cfg).world());
      opts.sync_wait_s = adgt::sim::sync_wait(adgt::sim::measure_scheduler_slice(procs), procs,
                                              int(cli.host_cores));
    } else {
      opts.sync_wait_s = std::stod(cli.sync);
    }
  }
  if (cli.attention != "flash" && cli.attention != "unfused")
    throw adgt::ConfigError("--attention: expected flash or unfused, got '" + cli.attention + "'");
  opts.work.unfused_attention = cli.attention == "unfused";
  opts.work.dropout = cli.dropout;
  if (cli.moe_skew < 0) throw adgt::ConfigError("--moe-skew must be >= 0");
  if (cli.moe_skew > 0 && cfg.model.n_experts > 0)
    opts.work.expert_load = adgt::sim::zipf_load(cfg.model.n_experts, cli.moe_skew);
  return opts;
}

// --trace FILE: the simulated step as a Chrome trace in the format of
// adgt-train's log.trace (docs/trace.md), one track per simulated unit (a tp
// group: its first rank's track, named by its coordinates), each task's span
// named as the run's trace names it, and a "step 1" span per unit.
void write_sim_trace(const std::string& path, const adgt::RunConfig& cfg, const adgt::cluster::Cluster& cl,
                     const adgt::sim::SimTrace& trace, const adgt::sim::SimResult& r) {
  const adgt::Layout lay = adgt::layout_of(cfg);
  std::vector<std::string> parts;
  for (const auto& u : trace.units) {
    std::vector<adgt::trace::Event> ev;
    double end = 0;
    for (const auto& sp : u.spans) {
      ev.push_back({sp.name, sp.cat, adgt::trace::kMainTrack, sp.start, sp.end, ""});
      end = std::max(end, sp.end);
    }
    ev.insert(ev.begin(), adgt::trace::Event{"step 1", "step", adgt::trace::kMainTrack, 0.0, end, ""});
    const std::string name =
        adgt::trace::rank_name(u.world_rank, lay, adgt::coords_of(lay, u.world_rank)) +
        (u.ranks.size() > 1 ? " [tp group of " + std::to_string(u.ranks.size()) + "]" : "");
    parts.push_back(adgt::trace::chrome_events(u.world_rank, name, u.world_rank, ev,
                                               {{adgt::trace::kMainTrack, "step (simulated)"}}));
  }
  const nlohmann::json about = {{"config", cfg.source},
                                {"simulated", true},
                                {"cluster", cl.name},
                                {"layout", adgt::sim::describe_layout(cfg)},
                                {"step_time_s", r.step_time_s},
                                {"units_simulated", r.units_simulated}};
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error("--trace: cannot write " + path);
  const std::string text = adgt::trace::chrome_trace(parts, about.dump());
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("--trace: writing " + path + " failed");
}

// One step of the run's own layout: a table, or one JSON object.
void simulate_one(const Cli& cli, const adgt::RunConfig& cfg, const adgt::cluster::Cluster& cl,
                  adgt::sim::OpCosts& costs, const adgt::sim::SimOptions& opts, int64_t world) {
  if (cli.gpus > 0 && cli.gpus != world)
    throw adgt::ConfigError("--gpus " + std::to_string(cli.gpus) + " but the run's layout has tp*pp*dp = " +
                            std::to_string(world) + "; set parallel.* or use --sweep");
  const auto t0 = std::chrono::steady_clock::now();
  adgt::sim::SimTrace trace;
  const adgt::sim::SimResult r =
      adgt::sim::simulate_step(cfg, cl, costs, opts, cli.trace_path.empty() ? nullptr : &trace);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!cli.trace_path.empty()) write_sim_trace(cli.trace_path, cfg, cl, trace, r);
  if (cli.json) {
    auto j = nlohmann::json::parse(adgt::sim::to_json(r));
    j["layout"] = adgt::sim::describe_layout(cfg);
    j["cluster"] = cl.name;
    j["costs"] = costs.describe();
    j["sim_seconds"] = took;
    j["sync_wait_s"] = opts.sync_wait_s;
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_result(cfg, cl, r, costs.describe());
    std::printf("simulated in:     %.3f s (%ld units, %ld events)\n", took,
                long(r.units_simulated), long(r.events));
  }
}

// Every feasible layout for --gpus, ranked: a table of the best --top, or a JSON array.
void sweep(const Cli& cli, const adgt::RunConfig& cfg, const adgt::cluster::Cluster& cl,
           adgt::sim::OpCosts& costs, const adgt::sim::SimOptions& opts) {
  if (cli.gpus <= 0) throw adgt::ConfigError("--sweep needs --gpus N");
  const auto t0 = std::chrono::steady_clock::now();
  adgt::sim::SweepOptions so;
  // Keys given with --set are held (the run file's layout is what the sweep varies).
  for (const auto& ov : cli.overrides) so.fixed.push_back(ov.substr(0, ov.find('=')));
  so.keep = cli.sweep_all ? 0 : size_t(std::max<int64_t>(cli.top, 1));
  so.energy = cli.objective == "energy";
  const adgt::sim::SweepResult sw = adgt::sim::sweep_layouts(cfg, cli.gpus, cl, costs, so, opts);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cli.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& row : sw.rows) {
      auto j = nlohmann::json::parse(adgt::sim::to_json(row.result));
      j["layout"] = row.layout;
      arr.push_back(j);
    }
    std::printf("%s\n", arr.dump().c_str());
    return;
  }
  std::printf("precision: %s\n", adgt::sim::precision_line(cfg, cl).c_str());
  std::printf("%ld layouts fit, %ld simulated (%ld bounded out), %ld broke a layout rule, %ld "
              "did not fit %.0f GiB, %ld differ from a --set key; %.2f s\n",
              long(sw.candidates), long(sw.rows.size()), long(sw.bounded),
              long(sw.rejected_rules), long(sw.rejected_memory),
              cl.device.memory_bytes / 1073741824.0, long(sw.rejected_fixed), took);
  std::printf("%-4s %-58s %10s %8s %7s %8s %9s %8s\n", "#", "layout", "step s", "MFU", "bubble",
              "exp.comm", "mem GiB", "J/token");
  for (size_t i = 0; i < sw.rows.size() && int64_t(i) < cli.top; ++i) {
    const auto& r = sw.rows[i].result;
    std::printf("%-4zu %-58s %10.4g %7.1f%% %6.1f%% %8.3g %9.1f %8.4g\n", i + 1, sw.rows[i].layout.c_str(),
                r.step_time_s, 100 * r.mfu, 100 * r.bubble, r.exposed_comm_s(),
                r.memory_bytes_max / 1073741824.0, r.energy_per_token_j);
  }
}

int run(Cli cli) {
  std::vector<std::string> ov = cli.overrides;
  adgt::RunConfig cfg = cli.sweep ? adgt::load_config(cli.config_path, cli.overrides)
                                  : adgt::load_config(cli.config_path, ov);
  // The run file's emulated cluster and slow ranks (emulate.*) unless given here.
  if (!cli.cluster_given && !cfg.emulate.cluster.empty()) cli.cluster_name = cfg.emulate.cluster;
  std::string slow = cli.slow;
  if (slow.empty() && !cfg.emulate.slow_ranks.empty()) slow = cfg.emulate.slow_ranks;
  // train.device=auto: the cluster's device (cuda on a GPU cluster), which the
  // memory model follows; said on stderr (stdout stays the table or JSON).
  if (const std::string note = adgt::sim::resolve_auto_device(cfg, cli.cluster_name); !note.empty())
    std::fprintf(stderr, "%s", note.c_str());
  adgt::cluster::Cluster cl = adgt::cluster::load_cluster(cli.cluster_name);
  const int64_t world = adgt::layout_of(cfg).world();
  const int64_t want = cli.gpus > 0 ? cli.gpus : world;
  // The run file's emulated cluster stays whole: its ranks sit on the devices
  // the emulated launcher gives them (below), the rest idle, as in the run.
  const bool emulated = !cfg.emulate.cluster.empty() && cli.cluster_name == cfg.emulate.cluster &&
                        cli.gpus <= 0 && want <= cl.world();
  if (want != cl.world() && !emulated) cl = adgt::cluster::with_gpus(cl, want);
  if (cli.power_cap > 0) {  // every device capped (docs/cluster.md, "Power")
    if (!cl.device.power.on())
      throw adgt::ConfigError("--power-cap " + std::to_string(cli.power_cap) + ": cluster " + cl.name +
                              "'s device has no power model (device.power in docs/cluster.md)");
    if (cli.power_cap <= cl.device.power.idle_w)
      throw adgt::ConfigError("--power-cap " + std::to_string(cli.power_cap) + " W is not above the device's idle " +
                              std::to_string(cl.device.power.idle_w) + " W");
    cl.device.power.cap_w = cli.power_cap;
  }
  std::unique_ptr<adgt::Backend> be;
  const std::unique_ptr<adgt::sim::OpCosts> costs = make_costs(cli, cfg, cl, be);
  adgt::sim::SimOptions opts = sim_options(cli, cfg, slow);
  // The run file's emulated cluster: its ranks where the emulated launcher
  // and parallel.placement put them (a placement ignoring sites costs as it runs).
  if (!cfg.emulate.cluster.empty() && cli.cluster_name == cfg.emulate.cluster && world <= cl.world()) {
    try {
      opts.device_of = adgt::emulate::layout_devices(cfg, cl, int(world));
    } catch (const std::invalid_argument& e) {
      throw adgt::ConfigError(e.what());
    }
  }
  if (cli.sweep)
    sweep(cli, cfg, cl, *costs, opts);
  else
    simulate_one(cli, cfg, cl, *costs, opts, world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-sim: simulate a training step of a run file on a cluster"};
  Cli cli;
  app.add_option("--config", cli.config_path, "YAML run file (required but with --print-cluster)");
  app.add_option("--set", cli.overrides, "override a key: --set section.key=value (repeatable)");
  app.add_option("--cluster", cli.cluster_name,
                 "a preset (dgx-a100-80gb, dgx-h100, dgx-h200, cpu-here) or a cluster file "
                 "(default: the run file's emulate.cluster, else dgx-h100)")->capture_default_str();
  app.add_option("--gpus", cli.gpus, "devices (default: the layout's tp*pp*dp; with --sweep required)");
  app.add_option("--costs", cli.costs_mode,
                 "auto (profile on CPU clusters, else the device model) | model | profile")
      ->capture_default_str();
  app.add_option("--profile-cache", cli.profile_cache, "JSON file of measured op times (read and extended)");
  app.add_option("--profile-cold-mib", cli.cold_mib,
                 "profile: cycle each op through copies of its operands totalling this many MiB "
                 "(0: cache-hot)")->capture_default_str();
  app.add_flag("--no-calibrate", cli.no_calibrate,
               "profile: the ops' times alone, without the in-situ factor (one micro-batch of the "
               "run's model on one rank against the profile's sum of its ops; docs/simulator.md)");
  app.add_option("--host-cores", cli.host_cores,
                 "every rank shares this many cores (CPU ranks emulating the cluster on one host)");
  app.add_option("--host-sync", cli.sync,
                 "with --host-cores: seconds each synchronisation of two ranks waits for the "
                 "scheduler (auto: a third of a round of this host's measured slices; 0: none, "
                 "the default: see docs/simulator.md for how each fares)")->capture_default_str();
  app.add_option("--slow-ranks", cli.slow,
                 "rank:factor,... compute slowdowns (default: the run file's emulate.slow_ranks)");
  app.add_option("--attention", cli.attention,
                 "flash (adgt's kernels) | unfused (scores in memory: other frameworks before "
                 "FlashAttention, for comparing with their published runs)")->capture_default_str();
  app.add_flag("--dropout", cli.dropout, "add attention and hidden dropout (GPT-3-era recipes)");
  app.add_option("--moe-skew", cli.moe_skew,
                 "MoE load model: expert e gets a share (e+1)^-S of the routed tokens (0: uniform)")
      ->capture_default_str();
  app.add_flag("--json", cli.json, "print one JSON object (an array with --sweep)");
  app.add_option("--power-cap", cli.power_cap,
                 "every device capped at this many watts: the power model's clock under the cap "
                 "slows the compute-bound side of each op (docs/cluster.md, \"Power\"); energy per "
                 "token in the result");
  app.add_option("--objective", cli.objective,
                 "with --sweep: rank by step time, or by energy per token (the device's power model; "
                 "every layout simulated)")
      ->check(CLI::IsMember({"time", "energy"}))
      ->capture_default_str();
  app.add_option("--trace", cli.trace_path,
                 "write the simulated step as a Chrome trace (Perfetto, chrome://tracing) in the "
                 "format of adgt-train's log.trace (docs/trace.md)");
  app.add_flag("--sweep", cli.sweep,
               "rank every feasible layout for --gpus (keys given with --set are held)");
  app.add_flag("--all", cli.sweep_all,
               "with --sweep: simulate every layout (default: only until the best --top are "
               "certain, by a lower bound of each step time)");
  app.add_option("--top", cli.top, "rows of the --sweep table")->capture_default_str();
  app.add_flag("--print-cluster", cli.print_cluster,
               "print --cluster (a preset or a file) as a cluster file, every field, and exit: "
               "the start of a modified copy");
  ADGT_CLI_PARSE(app, argc, argv);
  cli.cluster_given = app.count("--cluster") > 0;
  try {
    if (cli.print_cluster) {
      std::printf("%s", adgt::cluster::to_yaml(adgt::cluster::load_cluster(cli.cluster_name)).c_str());
      return 0;
    }
    if (cli.config_path.empty()) throw adgt::ConfigError("--config is required (a YAML run file)");
    return run(cli);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dynamic_cast<const adgt::ConfigError*>(&e) ||
                   dynamic_cast<const adgt::pp::ScheduleError*>(&e)
               ? 2
               : 1;
  }
}
