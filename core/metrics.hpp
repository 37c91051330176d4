// Training metrics: the human step line on rank 0 and metrics.jsonl (one JSON
// object per logged step) in the log directory.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace adgt {

// One MoE layer over a step (loads over the ep group, this rank's traffic).
struct MoeLayerMetrics {
  int64_t layer = 0;
  std::vector<int64_t> load;  // assignments per expert, before capacity drops
  int64_t tokens = 0, dropped = 0;
  double aux = 0;             // mean aux loss (without coef)
  int64_t a2a_bytes = 0;
  double a2a_seconds = 0;
  double imbalance() const;   // max load / mean load (1 = balanced)
};

// One hardware telemetry field over a log interval (docs/telemetry.md),
// reduced over the ranks that measured it: per-sample fields (power_w,
// temperatures, clocks; `count` samples) and per-rank ones (energy_j, the
// throttled shares; `count` ranks). A field no rank measured is not listed.
struct TelemetryStat {
  std::string name;          // "power_w", "sm_clock_mhz", "energy_j", "throttled", ...
  bool per_rank = false;     // count is ranks (else samples)
  int64_t count = 0;
  double min = 0, mean = 0, max = 0;
  double total = -1;         // the sum over the ranks (energy_j only; < 0: not reported)
};

struct StepMetrics {
  int64_t step = 0, total_steps = 0;  // step is 1-based (steps completed)
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, tflops = 0, mfu = 0;  // mfu in [0,1]; < 0 when no peak is known
  double peak_tflops = 0;
  double elapsed_s = 0, eta_s = 0;
  int64_t skipped_steps = 0;
  int world = 1;                      // ranks
  int64_t tp_bytes = 0, dp_bytes = 0;  // bytes this rank sent in the step, per group
  int64_t pp_bytes = 0;
  // The data-parallel gradient reduction the step did not hide: seconds each
  // rank waited for it after its step's work, the compressed buckets' reduce
  // included, mean and maximum over the ranks (< 0: dp = 1).
  double dp_wait_s = -1, dp_wait_max_s = -1;
  // Exposed communication of this step per group, seconds (this rank; the
  // step line's "wait"): inside blocking tp/pp/ep calls, and dp_wait_s for dp.
  // Groups of one are left out (< 0).
  double tp_wait_s = -1, pp_wait_s = -1, ep_wait_s = -1, cp_wait_s = -1;
  int64_t cp_bytes = -1;  // context parallelism: bytes this rank sent over cp (< 0: cp = 1)
  int64_t host_reads = -1;  // device-to-host waits of the step (device backends; < 0: not counted)
  double bubble = -1;  // pipeline: measured idle share of the step (< 0: no pipeline)
  double bubble_idle = -1;  // of it, waiting for a neighbour (receives, end of the list)
  int64_t held = -1;        // pipeline: most chunk activations a rank held at once (< 0: none)
  // Gradient compression (docs/compression.md; "" = off everywhere): the
  // buckets' levels ("int8", or a mix "int8:12,off:2"), and this rank's bytes
  // of the compressed buckets: sent, and what the fp32 reduce would have sent.
  std::string grad_compression;
  int64_t gc_sent_bytes = 0, gc_fp32_bytes = 0;
  // The compressed buckets' reduce, seconds, mean over the ranks: part of
  // dp_wait_s (< 0: not measured).
  double gc_seconds = -1;
  // ZeRO-2/3 (docs/zero.md; zero_level 0: not in use): this rank's unit
  // weight gathers and gradient reduce-scatters of the step, and the seconds
  // it waited for them (their exposed part; together dp_wait_s).
  int64_t zero_level = 0, zero_gathers = 0, zero_reduces = 0, zero_gather_bytes = 0;
  double zero_gather_wait_s = 0, zero_reduce_wait_s = 0;
  std::vector<MoeLayerMetrics> moe;  // this rank's MoE layers
  // A blend of token files (data.train with weights): training tokens read
  // from each source so far, in the run's order (empty: one source).
  std::vector<int64_t> source_tokens;
  // Hardware telemetry of the interval (log.telemetry_interval_s; empty:
  // off, or nothing measured): the step line shows power_w's and
  // sm_clock_mhz's means, metrics.jsonl every field under "telemetry".
  std::vector<TelemetryStat> telemetry;
};

std::string format_duration(double seconds);  // "1h02m", "3m12s", "45s"
std::string format_step_line(const StepMetrics& m);
// The eval line's loss: "val loss 3.1234", and for a blend of data.val
// sources each one's: "val loss 3.1234 (data/a 3.0000, data/b 3.5000)".
std::string format_val_loss(double val_loss, const std::vector<std::pair<std::string, double>>& by_source);

class MetricsLog {
 public:
  // Opens <dir>/metrics.jsonl; `append` keeps earlier records (resume).
  MetricsLog(const std::string& dir, bool append);
  void log_step(const StepMetrics& m);
  // {"step", "val_loss"}, and for a blend of data.val sources
  // "val_loss_by_source": {path as written: that source's loss}.
  void log_eval(int64_t step, double val_loss,
                const std::vector<std::pair<std::string, double>>& by_source = {});
  // Any other record (a controller's decision with its inputs), one line.
  void log_record(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace adgt
