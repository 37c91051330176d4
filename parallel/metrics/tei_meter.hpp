// The run's side of the Training Efficiency Index (docs/tei.md): cheap
// steady_clock counters on every rank (start-up, step parts, checkpoint saves,
// evaluation), summed over the world at each record, and the records in
// metrics.jsonl on world rank 0:
//   {"event": "run_start", "run", "start_unix", "resumed_from", "devices", ...}
//   {"event": "tei", "at": "interval" | "checkpoint" | "end", "run", "step",
//    "peak_tflops", "devices", "counters": {...}, "tei", "breakdown": {...}, "job": {...}}
// "counters" are this run's raw cumulative counters (TeiCounters); "tei",
// "breakdown" and "job" are the job so far: the earlier runs of the same log
// directory (read back from metrics.jsonl at the start) and this one
// (tei_account, parallel/metrics/tei.hpp). The end record also carries the
// run's "energy" (docs/telemetry.md) where a rank measured it.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/metrics.hpp"
#include "parallel/metrics/tei.hpp"
#include "parallel/metrics/telemetry_reduce.hpp"

namespace adgt {

// Seconds since this process started (Linux: /proc/self/stat against
// /proc/uptime; elsewhere: since the library's static initialisation).
double process_age_seconds();

// The runs recorded in a metrics.jsonl (run_start and tei records; other
// lines and torn lines are skipped). Interval snapshots between checkpoint
// ones are dropped except the last: the accounting needs no more. A missing
// file gives no runs.
std::vector<TeiRun> read_tei_runs(const std::string& metrics_path);

// Ends the file with a newline if its last line was torn (a killed run), so
// the next record starts a line of its own.
void end_torn_line(const std::string& path);

// What one step spent on this rank, seconds.
struct TeiStepTimes {
  double seconds = 0;    // the whole step
  double comm_s = 0;     // exposed tp, ep and dp communication of its forward/backward
  double bubble_s = 0;   // pipeline idle: span minus busy (0 without a pipeline)
  double optimizer_s = 0;
};

class TeiMeter {
 public:
  enum class At { Interval, Checkpoint, End };
  // Every rank, at the start of train(). log: world rank 0's metrics log
  // (nullptr elsewhere); earlier: the runs already in it (rank 0; read before
  // the log was opened); resumed_from: the step this run starts at.
  TeiMeter(const RunConfig& cfg, int devices, MetricsLog* log, std::vector<TeiRun> earlier,
           int64_t resumed_from, double peak_tflops);
  // Start-up ends when the first step starts (the first call counts).
  void start_step();
  void add_step(const TeiStepTimes& t, bool applied);
  void add_checkpoint(double seconds) { c_.checkpoint_s += seconds; }
  void add_eval(double seconds) { c_.eval_s += seconds; }
  // The run's energy per token and throttled share, for the end record
  // ("energy": run_energy_json; left out when nothing was measured).
  void set_run_energy(const RunEnergy& e) { energy_ = e; }
  // Collective over `world`: sums the counters over the ranks and, on rank
  // 0, appends the tei record of `step` and returns the job's breakdown
  // (invalid elsewhere).
  TeiBreakdown record(Comm& world, At at, int64_t step, double peak_tflops);

 private:
  MetricsLog* log_;
  int devices_;
  double flops_per_step_, recompute_per_step_;
  std::chrono::steady_clock::time_point process_start_;
  bool started_ = false;
  TeiCounters c_;  // this rank's
  RunEnergy energy_;
  std::vector<TeiRun> runs_;  // the earlier runs, then this one (rank 0)
};

}  // namespace adgt
