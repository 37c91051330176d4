// The single-process training loop: data -> micro-batches with gradient
// accumulation -> non-finite guard -> clipping -> AdamW, with logging,
// periodic evaluation and checkpoints, resume, and a clean stop on SIGTERM,
// SIGINT or SIGUSR1 (checkpoint at the step boundary, exit 0).
#pragma once
#include <memory>
#include <string>

#include "core/checkpoint_sharded.hpp"
#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/data_parallel.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"
#include "kernels/backend.hpp"
#include "parallel/pipeline_executor.hpp"

namespace adgt {

class TokenShard;
class Sampler;

struct TrainSummary {
  int64_t steps_done = 0;
  int64_t skipped_steps = 0;
  double final_train_loss = 0;  // mean over the last log interval
  double final_val_loss = -1;   // < 0 when no evaluation ran
  double tokens_per_s = 0;      // mean over the run, excluding the first step
  double wall_s = 0;
  std::string checkpoint;       // last checkpoint written ("" if none)
  std::string metrics_path;
  bool stopped_by_signal = false;
};

// The process groups this rank belongs to (nullptr: a group of one).
struct ParallelContext {
  Comm* tp = nullptr;
  Comm* dp = nullptr;
  Comm* pp = nullptr;     // the pipeline group: the same tp and dp coordinates, every stage
  Comm* ep = nullptr;     // expert parallelism: ep consecutive ranks of the dp group
  Comm* edp = nullptr;    // the dp ranks holding the same experts
  Comm* world = nullptr;  // every rank of the run: checkpoints are saved and loaded over it
  int world_rank = 0;     // rank 0 logs, prints and commits checkpoints
};

class Trainer {
 public:
  explicit Trainer(const RunConfig& cfg, ParallelContext ctx = {});
  ~Trainer();
  // Restores weights, optimizer state and data position from a step directory.
  void load(const std::string& step_dir);
  TrainSummary train();
  double evaluate();  // mean loss over the validation split (or eval_batches of it)
  Model& model() { return *model_; }

 private:
  double run_micro_batches(int64_t first_sample);
  // The same step through the pipeline executor (parallel.pp > 1).
  double run_pipeline_step(int64_t first_sample);
  // Fills micro-batch a's (B, T) inputs and targets of the step starting at first_sample.
  void fetch_micro_batch(int64_t first_sample, int64_t a, int32_t* in, int32_t* tg);
  // After a pipeline step: the measured bubble of the pipeline group
  // (1 - sum of busy time / (pp x the slowest rank's step time)).
  double measured_bubble();
  void trace_pipeline_step();  // ADGT_PIPELINE_TRACE
  // greedy: a new schedule from this step's measured stage times (collective over the world).
  void replan_from_measurements();
  bool pipelined() const { return ctx_.pp->size() > 1; }
  std::string save();
  ShardLayout layout() const;  // this rank's place, for the checkpoint files
  bool lead() const { return ctx_.world_rank == 0; }

  RunConfig cfg_;
  ParallelContext ctx_;
  SelfComm self_tp_{"tp"}, self_dp_{"dp"}, self_pp_{"pp"}, self_ep_{"ep"}, self_edp_{"edp"},
      self_world_{"world"};
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<PipelineExecutor> pipe_;
  std::unique_ptr<TokenShard> train_shard_, val_shard_;
  std::unique_ptr<Sampler> sampler_;
  int64_t step_ = 0;            // steps completed
  int64_t opt_steps_ = 0;       // AdamW updates applied (steps minus skipped ones)
  int64_t samples_seen_ = 0;    // global training samples consumed
  std::string last_checkpoint_;
};

// Installs the SIGTERM/SIGINT/SIGUSR1 handlers that ask the loop to stop.
void install_stop_handlers();

}  // namespace adgt
