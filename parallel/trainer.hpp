// The training loop: data -> the engine's step (micro-batches with gradient
// accumulation and reduction, engine.hpp) -> non-finite guard -> clipping ->
// AdamW, with logging, periodic evaluation and checkpoints, resume, the
// controllers' hook (controller.hpp) after each step, the Training
// Efficiency Index's timers and records (tei_meter.hpp, docs/tei.md), and a
// clean stop on SIGTERM, SIGINT or SIGUSR1 (checkpoint at the step boundary,
// exit 0).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <vector>

#include "core/config.hpp"
#include "kernels/backend.hpp"
#include "parallel/controller.hpp"
#include "parallel/device_comm.hpp"
#include "parallel/device_plan.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/engine.hpp"
#include "parallel/tei.hpp"

namespace adgt {

class TokenShard;
class Sampler;

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
  double evaluate();  // mean loss over the validation split (or eval_batches of it)
  Model& model() { return engine_->model(); }
  Engine& engine() { return *engine_; }

 private:
  // Fills micro-batch a's (B, T) inputs and targets of the step starting at first_sample.
  void fetch_micro_batch(int64_t first_sample, int64_t a, int32_t* in, int32_t* tg);
  void trace_pipeline_step();  // ADGT_PIPELINE_TRACE
  std::string save();
  bool lead() const { return world_rank_ == 0; }
  void print_header(double peak) const;
  // A signal to any rank stops every rank at this step boundary.
  int agreed_stop_signal();

  RunConfig cfg_;
  int world_rank_ = 0;
  std::unique_ptr<Backend> backend_;
  // Link and compute emulation (emulate.cluster; docs/emulation.md): the
  // trainer's own when the launcher made none, and the groups wrapped in
  // EmulatedComms. Outlive the device wrappers and the engine.
  std::unique_ptr<emulate::Emulation> own_emulation_;
  emulate::Emulation* emulation_ = nullptr;
  std::vector<std::unique_ptr<Comm>> emulated_comms_;
  // With a device backend: the groups, wrapped so device tensors are staged
  // or go to NCCL (parallel/device_comm.hpp). Outlive the engine.
  std::vector<std::unique_ptr<Comm>> device_comms_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<Controller>> controllers_;
  std::unique_ptr<TokenShard> train_shard_, val_shard_;
  std::unique_ptr<Sampler> sampler_;
  int64_t step_ = 0;            // steps completed
  bool continue_log_ = false;   // continue_job_log()
  int64_t opt_steps_ = 0;       // AdamW updates applied (steps minus skipped ones)
  int64_t samples_seen_ = 0;    // global training samples consumed
  std::string last_checkpoint_;
};

// Installs the SIGTERM/SIGINT/SIGUSR1 handlers that ask the loop to stop.
void install_stop_handlers();

}  // namespace adgt
