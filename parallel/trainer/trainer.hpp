// The training loop: data -> the engine's step (micro-batches with gradient
// accumulation and reduction, parallel/engine/engine.hpp) -> non-finite guard -> clipping ->
// AdamW, with logging, periodic evaluation and checkpoints, resume, the
// controllers' hook (parallel/control/hook.hpp) after each step, the Training
// Efficiency Index's timers and records (parallel/metrics/tei_meter.hpp, docs/tei.md), and a
// clean stop on SIGTERM, SIGINT or SIGUSR1 (checkpoint at the step boundary,
// exit 0).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <vector>

#include "core/config.hpp"
#include "core/data/blend.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/float_env.hpp"
#include "parallel/control/hook.hpp"
#include "parallel/comm/device_comm.hpp"
#include "parallel/mesh/device_plan.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/engine/engine.hpp"
#include "parallel/mesh/process_groups.hpp"
#include "parallel/metrics/tei.hpp"
#include "parallel/metrics/telemetry_reduce.hpp"
#include "parallel/switch/reshard.hpp"

namespace adgt {

class TokenShard;
class AsyncCheckpointSaver;
class MetricsLog;
class TeiMeter;
class StepLogger;
class BlendSampler;

// One evaluation (docs/config.md, "Data blends"): each source of data.val
// evaluated alone, and val_loss = sum_s w_s * loss_s with the normalised
// weights; one source: val_loss is its loss and by_source is empty.
struct ValLoss {
  double loss = 0;
  std::vector<std::pair<std::string, double>> by_source;  // (path as written, loss), in order
};

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;
  double final_train_loss = 0;  // mean over the last log interval
  double final_val_loss = -1;   // < 0 when no evaluation ran
  double tokens_per_s = 0;      // mean over the run, excluding the first step
  int64_t peak_device_bytes = -1;  // the backend buffers' peak, max over ranks (-1: the CPU's, untracked)
  double wall_s = 0;
  std::string checkpoint;       // last checkpoint written ("" if none)
  std::string metrics_path;
  bool stopped_by_signal = false;
  // The Training Efficiency Index over the job so far: this run and the
  // earlier ones of the same log directory (docs/tei.md; valid on world rank 0).
  TeiBreakdown tei;
  // Energy per token and the throttled share of the run (docs/telemetry.md;
  // empty where no rank measured them or log.telemetry_interval_s is 0).
  RunEnergy energy;
  // Under an emulated cluster with sites: the bytes every rank's transports
  // sent to ranks of another site over the wan_steps steps of this run
  // (docs/sites.md); -1: not measured.
  double wan_bytes = -1;
  int64_t wan_steps = 0;
};

class Trainer {
 public:
  // plan: the run's device, agreed over the world (plan_devices); none: a
  // single process's own choice of cfg.train.device.
  explicit Trainer(const RunConfig& cfg, ParallelContext ctx = {},
                   std::optional<DevicePlan> plan = std::nullopt);
  ~Trainer();
  // Restores weights, optimizer state and data position from a step directory.
  void load(const std::string& step_dir);
  TrainSummary train();
  // --resume was asked for but found no checkpoint (a run killed before its
  // first save): the job goes on, so metrics.jsonl is appended to (the
  // earlier run's time counts in the TEI as lost) instead of started afresh.
  void continue_job_log() { continue_log_ = true; }
  // Mean loss over the validation split (or eval_batches of it); a blend:
  // the weighted mean of its sources' (evaluate_sources).
  double evaluate() { return evaluate_sources().loss; }
  ValLoss evaluate_sources();
  Model& model() { return engine_->model(); }
  // The run's configuration as the trainer resolved it (data.eos_id found for
  // document masking).
  const RunConfig& config() const { return cfg_; }
  Engine& engine() { return *engine_; }
  // A controller made by the caller (parallel.auto's re-planner lives above
  // this library): made now for the running layout, and again after every
  // layout switch, after the trainer's own controllers.
  // A factory may return nullptr (no controller for that layout).
  using ControllerFactory = std::function<std::unique_ptr<Controller>(const RunConfig&)>;
  void add_controller_factory(ControllerFactory f);
  // This rank's telemetry since the last call (the sampler's control
  // reader: the power controller's window); nullopt before train() starts the
  // sampler, after it ends, or where this rank reads nothing.
  std::optional<TelemetryInterval> take_control_telemetry();

 private:
  // Fills micro-batch a's (B, T) inputs and targets of the step starting at first_sample.
  void fetch_micro_batch(int64_t first_sample, int64_t a, int32_t* in, int32_t* tg);
  // log.trace (docs/trace.md): recording starts at the first traced step
  // (collective: a world barrier) and ends after the last one's boundary,
  // when every rank's events are gathered into <log.dir>/trace.json.
  void trace_begin();
  void trace_end();
  // Mean loss over the first windows of one validation shard (validation.cpp).
  double evaluate_shard(const TokenShard& shard);
  // Writes this step's checkpoint (checkpoint.async: copies the state to host
  // memory and starts the background write; wait: also commits it now).
  // Collective over the world.
  void save(MetricsLog* metrics, TeiMeter& tei, bool wait);
  // checkpoint.async, at a step boundary: commits the save in flight once
  // every rank has written it (wait: waits for it). Collective over the world.
  void commit_checkpoint(MetricsLog* metrics, TeiMeter& tei, bool wait);
  bool lead() const { return world_rank_ == 0; }
  void print_header(double peak) const;
  // train()'s parts: rank 0's metrics.jsonl (nullptr elsewhere; a resume
  // appends and reads the earlier runs' TEI records into earlier_runs); the
  // asynchronous saves' staging buffers; one step (data, forward and
  // backward, the update or a skipped one, the step's report); an evaluation
  // now; the summary at the end.
  std::unique_ptr<MetricsLog> open_metrics_log(std::vector<TeiRun>& earlier_runs);
  void prepare_async_save();
  StepReport run_step(TeiMeter& tei, TrainSummary& sum, int64_t first_step, int64_t& consecutive_bad);
  void evaluate_now(MetricsLog* metrics, TeiMeter& tei, TrainSummary& sum);
  void finish_summary(TrainSummary& sum, MetricsLog* metrics, TeiMeter& tei, const StepLogger& logger,
                      std::chrono::steady_clock::time_point t_start);
  // A step's time: the emulation's virtual clock when it has one (what each
  // rank would measure with a core of its own), else the wall clock.
  double step_clock() const;
  // A signal to any rank stops every rank at this step boundary; *switch_due:
  // world rank 0 has a due layout switch request (both agreed over the world).
  int agreed_stop_signal(bool* switch_due = nullptr);
  // Builds the engine on ctx's groups: the emulation and device wrappers, the
  // engine, gradient compression's settings and the controllers.
  void wire(ParallelContext ctx, bool init = true);
  // The in-memory layout switch (docs/reliability.md): rank 0 takes the due
  // request of <log.dir>/switch, every rank applies it or every rank logs why
  // not. Returns whether the layout changed.
  bool run_switch(MetricsLog* log);
  void log_decisions(MetricsLog* log);  // unlogged_, then cleared
  void switch_layout(const RunConfig& next, const std::string& why, MetricsLog* log);
  // switch_layout's parts: whether world rank 0 stays on this process under
  // `placement` (refused and said otherwise; collective over world); the
  // running engine torn down and the new layout's groups made (collective
  // over MPI_COMM_WORLD), returned as the context to wire; the console line
  // and metrics.jsonl record of a finished switch.
  struct SwitchRecord {
    std::string why, from, schedule_before, exchange;
    bool had_ef = false;  // gradient compression's error feedback was dropped
    bool exact = false;   // an f64 state carried in f64 (the layout stayed: ExactCarry)
    ReshardStats rs;
    nlohmann::json phases;  // this rank's seconds per phase
  };
  bool switch_keeps_lead(const RunConfig& next, const Placement& placement, Comm& world);
  ParallelContext rebuild_groups(const RunConfig& next, const Placement& placement,
                                 const std::string& plan_json);
  void report_switch(const SwitchRecord& rec, std::chrono::steady_clock::time_point t0, MetricsLog* log);
  // A controller's layout request (the same on every rank): switched in
  // memory, or refused with a logged reason. Returns whether it changed.
  // A change of parallel.expert_placement and/or parallel.expert_replicas
  // alone, made in memory without a new engine (Engine::move_experts, then
  // the replicas); false when next changes more, or when gradient
  // compression's residuals or ZeRO would have to follow the experts.
  bool experts_in_place(const RunConfig& next, const std::string& who, MetricsLog* log);
  bool apply_layout_request(const std::vector<std::string>& overrides, const std::string& who,
                            MetricsLog* log);

  RunConfig cfg_;
  int world_rank_ = 0;
  std::unique_ptr<Backend> backend_;
  // train.flush_denormals on a CPU backend: FTZ/DAZ while the trainer lives.
  std::unique_ptr<cpu::FlushDenormals> flush_denormals_;
  // Link and compute emulation (emulate.cluster; docs/emulation.md): the
  // trainer's own when the launcher made none, and the groups wrapped in
  // EmulatedComms. Outlive the device wrappers and the engine.
  std::unique_ptr<emulate::Emulation> own_emulation_;
  emulate::Emulation* emulation_ = nullptr;
  std::vector<std::unique_ptr<Comm>> emulated_comms_;
  int64_t run_start_step_ = 0;  // the step train() started from
  // With a device backend: the groups, wrapped so device tensors are staged
  // or go to NCCL (parallel/comm/device_comm.hpp). Outlive the engine.
  std::vector<std::unique_ptr<Comm>> device_comms_;
  // The data-parallel groups spanning sites, reduced hierarchically
  // (parallel.site_reduce; docs/sites.md); over the device groups (or the
  // emulated ones), so destroyed before them.
  std::vector<std::unique_ptr<Comm>> site_comms_;
  // log.trace: the steps traced, and the groups wrapped in TracedComms
  // (every layout's: an engine of an earlier layout may outlive its wiring).
  std::optional<std::pair<int64_t, int64_t>> trace_steps_;
  std::vector<std::unique_ptr<Comm>> traced_comms_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<Controller>> controllers_;
  std::vector<ControllerFactory> factories_;  // add_controller_factory
  // This rank's telemetry sampler while train() runs (the step logger's too).
  std::shared_ptr<TelemetrySampler> telemetry_;
  std::mutex telemetry_mu_;  // guards telemetry_ (set and reset by train())
  DevicePlan dev_;  // the run's device, as agreed at start
  // After an in-memory layout switch: the new layout's process groups (the
  // launch's stay with the caller, unused) and a world over every launcher
  // rank for the state's exchange.
  std::unique_ptr<ProcessGroups> switched_groups_;
  int64_t switches_ = 0;  // layout switches so far in this run
  // Rank 0: records of decisions made while wiring a layout (the attention
  // kernel), written to metrics.jsonl once it is open (log_decisions).
  std::vector<nlohmann::json> unlogged_;
  std::vector<std::unique_ptr<TokenShard>> train_shards_;  // one per blend source
  std::vector<std::unique_ptr<TokenShard>> val_shards_;  // one per data.val source
  std::vector<BlendSource> val_sources_;                  // their paths and normalised weights
  std::unique_ptr<BlendSampler> sampler_;
  int64_t step_ = 0;            // steps completed
  bool continue_log_ = false;   // continue_job_log()
  int64_t opt_steps_ = 0;       // AdamW updates applied (steps minus skipped ones)
  int64_t samples_seen_ = 0;    // global training samples consumed
  std::string last_checkpoint_;
  std::unique_ptr<AsyncCheckpointSaver> saver_;  // checkpoint.async (docs/reliability.md)
  double saver_copy_s_ = 0;                      // the save in flight's copy to host memory
};

// The engine's view of process groups: their communicators, the layout and
// this rank's place (emulation and plan left for the caller).
ParallelContext context_of(const ProcessGroups& pg);

// Installs the SIGTERM/SIGINT/SIGUSR1 handlers that ask the loop to stop.
void install_stop_handlers();
// The stop signal received and not yet acted on (0: none); read by the watchdog.
int pending_stop_signal();

}  // namespace adgt
