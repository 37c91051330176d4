// adgt-train: parse the command line and the YAML run file, set up the
// process groups, then train, evaluate, or print the dry-run estimate.
// No math and no MPI calls here.
#include <CLI/CLI.hpp>

#include "apps/cli_parse.hpp"
#include <chrono>
#include <cstdio>
#include <thread>
#include <exception>
#include <memory>
#include <omp.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/config.hpp"
#include "core/data/data_check.hpp"
#include "core/layout.hpp"
#include "parallel/cost/memory.hpp"
#include "parallel/cp/support.hpp"
#include "parallel/engine/engine.hpp"
#include "parallel/trainer/trainer.hpp"
#include "parallel/comm/agree.hpp"
#include "parallel/mesh/device_assign.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/fault/watchdog.hpp"
#include "kernels/cpu_threads.hpp"
#include "parallel/comm/launch.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/mesh/process_groups.hpp"
#include "parallel/plan/launch_plan.hpp"
#include "parallel/control/power_controller.hpp"
#include "parallel/metrics/power_signal.hpp"
#include "parallel/control/replan_controller.hpp"
#include "parallel/control/trial_controller.hpp"
#include "parallel/sim/dry_run.hpp"
#include "parallel/pipeline/validate.hpp"

namespace {

void print_summary(const adgt::TrainSummary& s) {
  std::printf("\n== summary ==\n");
  std::printf("steps:            %ld%s\n", long(s.steps_done),
              s.stopped_by_signal ? " (stopped by signal)" : "");
  std::printf("final train loss: %.4f\n", s.final_train_loss);
  if (s.final_val_loss >= 0) std::printf("final val loss:   %.4f\n", s.final_val_loss);
  std::printf("tokens/s:         %.0f\n", s.tokens_per_s);
  std::printf("wall time:        %.1f s\n", s.wall_s);
  if (s.peak_device_bytes >= 0)
    std::printf("device memory:    %.3f GiB peak of the backend's buffers (largest rank; %lld bytes)\n",
                double(s.peak_device_bytes) / double(1 << 30), (long long)s.peak_device_bytes);
  if (s.wan_bytes >= 0)
    std::printf("WAN:              %.6g MB sent across the sites by all ranks, %.6g MB per step "
                "(%ld steps; docs/sites.md)\n",
                s.wan_bytes / 1e6, s.wan_steps > 0 ? s.wan_bytes / 1e6 / double(s.wan_steps) : 0.0,
                long(s.wan_steps));
  if (s.skipped_steps) std::printf("skipped steps:    %ld (non-finite)\n", long(s.skipped_steps));
  std::printf("checkpoint:       %s\n", s.checkpoint.empty() ? "(none)" : s.checkpoint.c_str());
  std::printf("metrics:          %s\n", s.metrics_path.c_str());
  std::printf("%s", adgt::format_tei(s.tei).c_str());  // the job's TEI block (docs/tei.md)
  std::printf("%s", adgt::format_run_energy(s.energy).c_str());  // J/token, throttling (docs/telemetry.md)
}

// The command line.
struct Cli {
  std::string config_path, resume;
  std::vector<std::string> overrides;
  bool dry_run = false, eval_only = false, print_config = false, print_schedule = false;
  std::string cluster;
  int64_t gpus = 0;
};

// --dry-run, --print-config, --print-schedule: no launch needed. Exit code 0,
// 2 for a configuration or schedule error, 1 otherwise.
int print_without_launch(const Cli& cli) {
  try {
    adgt::RunConfig cfg = adgt::load_config(cli.config_path, cli.overrides);
    // train.device=auto estimates the device a launch would get (cuda on a GPU
    // --cluster): the memory model and the costs follow it.
    if (cli.dry_run) std::printf("%s", adgt::sim::resolve_auto_device(cfg, cli.cluster).c_str());
    if (cli.dry_run && cfg.parallel.auto_plan) {  // the plan table, then the chosen run's estimate
      std::printf("%s", adgt::plan::plan_dry_run(cfg, cli.config_path, cli.overrides, cli.cluster,
                                                 cli.gpus, &cfg)
                            .c_str());
    }
    if (cli.print_config) std::printf("%s", adgt::to_yaml(cfg).c_str());
    if (cli.print_schedule) {
      if (cfg.parallel.pp > 1)
        std::printf("%s", adgt::describe_pipeline_schedule(cfg).c_str());
      else
        std::printf("parallel.pp=1: no pipeline schedule (set parallel.pp > 1)\n");
    }
    if (cli.dry_run) {
      const auto held = cfg.parallel.pp > 1
                            ? adgt::pp::held_activations(adgt::make_pipeline_schedule(cfg))
                            : std::vector<std::vector<int64_t>>{};
      const int64_t bpp = adgt::compute_bytes_per_element(cfg);
      const auto est = adgt::estimate_memory(cfg, bpp, held);
      // What parallel.adapt's schedule re-plan may come to hold (taken
      // only where it fits the device: docs/adaptation.md).
      const bool adaptive = cfg.parallel.pp > 1 && cfg.parallel.adapt != "off";
      const auto replan = adaptive ? adgt::estimate_memory_replanned(cfg, bpp, held) : est;
      std::printf("%s", adgt::format_estimate(cfg, est, adaptive ? &replan : nullptr).c_str());
      std::printf("%s", adgt::sim::dry_run_prediction(cfg, cli.cluster).c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dynamic_cast<const adgt::ConfigError*>(&e) || dynamic_cast<const adgt::pp::ScheduleError*>(&e) ? 2 : 1;
  }
}

std::string who(const adgt::MpiEnv& mpi) {
  return "rank " + std::to_string(mpi.rank()) + " (host " + mpi.launch().host + ")";
}

// Loads the run file on every rank and checks the data inputs (shards,
// tokenizer) before anything is launched. An input error is reported once per
// job: by rank 0, or by the first rank that found one where rank 0 did not (a
// file that only some hosts see); every rank returns false together (agreed by
// one collective, so none is left waiting) and the job exits 2.
bool load_agreed(const Cli& cli, const adgt::MpiEnv& mpi, adgt::RunConfig& cfg) {
  std::string config_error;
  try {
    cfg = adgt::load_config(cli.config_path, cli.overrides);
    if (!cfg.parallel.auto_plan) adgt::validate_world(cfg, mpi.size());  // else: planned below
    if (const std::string why = adgt::context_parallel_unsupported(cfg); !why.empty())
      throw adgt::ConfigError(cfg.source + ": " + why);
    adgt::check_data_inputs(cfg);
    adgt::emulate::check_emulation_inputs(cfg, mpi.size());
  } catch (const adgt::ConfigError& e) {
    config_error = adgt::attribute_overrides(e.what(), cli.config_path, cli.overrides);
  }
  // size - rank of the lowest failing rank (0: none failed).
  const int first = adgt::agree_max(config_error.empty() ? 0 : mpi.size() - mpi.rank());
  if (!first) {
    if (mpi.rank() == 0)
      if (const std::string w = adgt::tokenizer_warning(cfg); !w.empty())
        std::fprintf(stderr, "warning: %s\n", w.c_str());
    return true;
  }
  if (mpi.rank() == mpi.size() - first)
    std::fprintf(stderr, "error: %s: %s\n", who(mpi).c_str(), config_error.c_str());
  return false;
}

// What parallel.auto decided at launch.
struct AutoPlan {
  std::string plan_json;
  std::shared_ptr<adgt::plan::ReplanState> replan;  // parallel.replan (docs/planner.md)
  std::shared_ptr<adgt::plan::TrialState> trials;   // parallel.auto_trials
};

// parallel.auto (docs/planner.md): rank 0 plans and broadcasts the plan;
// every rank loads the run with it, or every rank returns false with the
// same error.
bool plan_launch(const Cli& cli, const adgt::MpiEnv& mpi, adgt::RunConfig& cfg, AutoPlan& ap) {
  if (!cfg.parallel.auto_plan) return true;
  try {
    adgt::plan::LaunchPlan lp = adgt::plan::plan_at_launch(cfg, cli.config_path, cli.overrides);
    if (mpi.rank() == 0) {
      std::printf("%s", lp.table.c_str());
      adgt::plan::write_plan_file(lp.cfg.log.dir, lp.json);
    }
    cfg = lp.cfg;
    ap.plan_json = lp.json;
    if (cfg.parallel.replan && mpi.size() > 1) {
      ap.replan = std::make_shared<adgt::plan::ReplanState>();
      ap.replan->hosts = lp.hosts;
      ap.replan->fixed = lp.fixed;
    }
    if (lp.trials.size() > 1) {
      ap.trials = std::make_shared<adgt::plan::TrialState>(
          adgt::plan::make_trial_state(lp.trials, lp.trial_group));
    }
    return true;
  } catch (const adgt::ConfigError& e) {
    if (mpi.rank() == 0)
      std::fprintf(stderr, "error: %s: %s\n", who(mpi).c_str(), e.what());
    else
      std::fprintf(stderr, "error: %s: stopping: parallel.auto found no plan (rank 0 says why)\n",
                   who(mpi).c_str());
    return false;
  }
}

// Resumes from --resume when it names a complete checkpoint (or says it
// starts from scratch). Returns the checkpoint loaded ("" none).
std::string resume_if_asked(const Cli& cli, const adgt::RunConfig& cfg, adgt::Trainer& trainer, bool lead) {
  const std::string from = adgt::resolve_resume(cli.resume, cfg.checkpoint.dir);
  if (!cli.resume.empty() && from.empty()) {
    if (cli.eval_only)
      throw std::runtime_error("--resume " + cli.resume + ": no complete checkpoint under " +
                               cfg.checkpoint.dir);
    if (lead)
      std::printf("--resume %s: no complete checkpoint under %s; starting from scratch\n",
                  cli.resume.c_str(), cfg.checkpoint.dir.c_str());
    trainer.continue_job_log();  // the job's earlier runs stay in metrics.jsonl (docs/tei.md)
  }
  if (!from.empty()) {
    adgt::fault::PhaseScope loading(adgt::fault::Phase::CheckpointLoad);
    const auto t_load = std::chrono::steady_clock::now();
    trainer.load(from);
    if (lead)
      std::printf("resumed from %s (loaded in %.3f s)\n", from.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());
  }
  return from;
}

// The launched run: process groups, watchdog, devices, emulation, the
// trainer and its controllers, then training or an evaluation.
int train_or_evaluate(const Cli& cli, const adgt::RunConfig& cfg, const AutoPlan& ap) {
  // Rank placement (parallel.placement; docs/placement.md): world rank = layout rank.
  adgt::ProcessGroups pg = adgt::make_process_groups(adgt::layout_of(cfg), adgt::place_launch(cfg));
  const bool lead = pg.world->rank() == 0;
  // Hang and death detection (docs/reliability.md): heartbeats under
  // <log.dir>/.heartbeat; a rank that stops progressing is named by every
  // other rank, which exits 1. Stopped (the heartbeat says "done") at the end.
  const auto watchdog = adgt::fault::start_watchdog(cfg, *pg.world, pg.launch.rank, pg.launch.host,
                                                    adgt::pending_stop_signal);
  // The device of the run, agreed over the world; each rank's GPU (two
  // ranks on one GPU are refused unless ADGT_SHARED_GPU_TEST=1) and the
  // transport of its collectives (parallel/mesh/device_plan.hpp).
  const adgt::DevicePlan dev = adgt::plan_devices(pg, cfg.train.device);
  if (lead && !dev.warning.empty()) std::fprintf(stderr, "warning: %s\n", dev.warning.c_str());
  // Link and compute emulation (emulate.cluster; docs/emulation.md): null when off.
  const auto emulation = adgt::emulate::setup_emulation(cfg, pg.world.get(), pg.world->rank(), &pg.placement);
  const std::string table = adgt::rank_table(pg, dev.device_id, dev.transport, emulation.get());
  if (lead && pg.world->size() > 1) std::printf("%s", table.c_str());

  adgt::ParallelContext ctx = adgt::context_of(pg);
  ctx.emulation = emulation.get();
  ctx.plan_json = ap.plan_json;
  const auto t_build = std::chrono::steady_clock::now();
  adgt::Trainer trainer(cfg, ctx, dev);
  if (lead) {  // where a large model's start-up goes (the 7B's was 43 s on the first GPU run)
    const auto& it = trainer.model().init_times();
    std::printf("start-up: trainer ready in %.2f s (initial weights drawn in %.2f s on %d "
                "threads, copied to the backend in %.2f s)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count(),
                it.draw_s, omp_get_max_threads(), it.to_device_s);
    const adgt::RunConfig& rc = trainer.config();
    if (rc.train.document_mask || rc.model.rope_reset_per_document)
      std::printf("documents: a new one after each token %ld;%s%s\n", long(rc.data.eos_id),
                  rc.train.document_mask ? " attention masked at the boundaries" : "",
                  rc.model.rope_reset_per_document ? " positions restart per document" : "");
  }
  // The power controller (docs/power.md): with parallel.adapt on, under
  // emulate.power_cap_w (the emulation's factor), or on ranks that read NVML
  // (CUDA ranks, log.telemetry_source nvml) when the run's cluster model has
  // a power model.
  if (cfg.parallel.adapt != "off") {
    adgt::PowerInputs pin;
    bool on = false;
    if (emulation && cfg.emulate.power_cap_w > 0) {
      pin.cluster = emulation->cluster;
      pin.emulated_cap_w = cfg.emulate.power_cap_w;
      on = true;
    } else if (cfg.log.telemetry_interval_s > 0 &&
               (dev.device == "cuda" || cfg.log.telemetry_source == "nvml")) {
      pin.cluster = emulation ? emulation->cluster
                              : adgt::plan::run_cluster(
                                    cfg, adgt::MpiComm::world("power")->all_gather_strings(pg.launch.host));
      on = pin.cluster.device.power.on();
      if (lead)
        std::printf("power controller: %s\n",
                    on ? ("re-plans when NVML reports throttled clocks (" + pin.cluster.device.name +
                          "'s power model: " + pin.cluster.device.power.source + ")").c_str()
                       : ("off: the cluster's device " + pin.cluster.device.name +
                          " has no power model (device.power, docs/cluster.md)").c_str());
    }
    if (on) {
      pin.telemetry = [&trainer]() -> std::optional<adgt::PowerSignal> {
        if (const auto w = trainer.take_control_telemetry()) return adgt::power_signal(*w);
        return std::nullopt;
      };
      pin.replan = ap.replan;
      trainer.add_controller_factory(
          [pin](const adgt::RunConfig& c) { return adgt::make_power_controller(c, pin); });
    }
  }
  if (ap.replan)  // re-plans while training when the ranks' measured speeds change
    trainer.add_controller_factory([replan = ap.replan](const adgt::RunConfig& c) {
      return adgt::plan::make_replan_controller(c, replan);
    });
  if (ap.trials)  // runs the planner's best plans and keeps the fastest measured
    trainer.add_controller_factory([trials = ap.trials](const adgt::RunConfig& c) {
      return adgt::plan::make_trial_controller(c, trials);
    });
  const std::string from = resume_if_asked(cli, cfg, trainer, lead);
  if (cli.eval_only) {
    if (from.empty()) throw std::runtime_error("--eval-only needs --resume DIR (or auto)");
    adgt::fault::PhaseScope evaluating(adgt::fault::Phase::Eval);
    const adgt::ValLoss loss = trainer.evaluate_sources();  // a blend: each source's, then the mean
    if (lead) {
      for (const auto& [source, l] : loss.by_source) std::printf("eval loss %s: %.6f\n", source.c_str(), l);
      std::printf("eval loss: %.6f\n", loss.loss);
    }
    return 0;
  }
  adgt::install_stop_handlers();
  const adgt::TrainSummary s = trainer.train();
  if (lead) print_summary(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-train: pretrain a LLaMA-family model"};
  Cli cli;
  app.add_option("--config", cli.config_path, "YAML run file (configs/tiny.yaml, ...)")->required();
  app.add_option("--set", cli.overrides, "override a key: --set section.key=value (repeatable)");
  app.add_option("--resume", cli.resume,
                 "continue from a checkpoint: a step directory, or 'auto' for the newest one "
                 "under checkpoint.dir");
  app.add_flag("--dry-run", cli.dry_run,
               "print parameter count, FLOPs per token and memory per rank; allocate nothing");
  app.add_option("--cluster", cli.cluster,
                 "with --dry-run: predict the step time on this cluster (a preset such as "
                 "dgx-h100, or a cluster file; default: this machine when the run is on its CPU)");
  app.add_option("--gpus", cli.gpus,
                 "with --dry-run and parallel.auto: plan for this many devices of --cluster "
                 "(default: the cluster file's devices, or the run's tp x pp x dp for a preset)");
  app.add_flag("--eval-only", cli.eval_only,
               "evaluate on the validation split (with --resume) and print 'eval loss: <value>'");
  app.add_flag("--print-config", cli.print_config, "print the resolved configuration as YAML");
  app.add_flag("--print-schedule", cli.print_schedule,
               "print the pipeline stages and each rank's schedule timeline with the predicted "
               "bubble (parallel.pp > 1)");
  ADGT_CLI_PARSE(app, argc, argv);
  if (cli.dry_run || cli.print_config || cli.print_schedule) return print_without_launch(cli);

  adgt::MpiEnv mpi(&argc, &argv);
  // Each rank's OpenMP/BLAS threads: OMP_NUM_THREADS, else the host's cores
  // over its ranks (libgomp's default, every core in every rank, ran N x C
  // threads on C cores; kernels/cpu_threads.hpp). Before the plan profiles ops.
  const int local = mpi.launch().local_world;
  const adgt::RankThreads th = adgt::rank_threads(local);
  if (!th.from_env) {
    adgt::set_cpu_threads(th.threads);
    if (mpi.rank() == 0 && local > 1)
      std::printf("cpu threads: %d per rank (OMP_NUM_THREADS unset: %s)\n", th.threads, th.why.c_str());
  }
  // Ranks with cores of their own spin briefly in their waits; without a
  // spare core the pipeline's send helper polls seldom (mpi_comm.hpp).
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (local > 1 && local * th.threads <= cores) adgt::set_mpi_spin_us(2000);
  if (const char* e = std::getenv("ADGT_MPI_SPIN_US"); e && *e) adgt::set_mpi_spin_us(std::atoi(e));
  adgt::set_host_spare_core(local * th.threads < cores);
  adgt::RunConfig cfg;
  AutoPlan ap;
  if (!load_agreed(cli, mpi, cfg) || !plan_launch(cli, mpi, cfg, ap)) return 2;
  try {
    return train_or_evaluate(cli, cfg, ap);
  } catch (const adgt::CheckpointError& e) {
    // Checkpoint saves and loads agree on failure over the world (every rank
    // throws together), so every rank prints its message before the job ends.
    adgt::fatal(adgt::CollectiveError(e.what()));
  } catch (const std::exception& e) {
    adgt::fatal(e);  // names the rank and host; aborts every rank when there are several
  }
}
