// The Training Efficiency Index (TEI, docs/tei.md): goodput MFU over a whole
// job, across restarts. The model FLOPs of the steps whose updates survived,
// over (peak FLOP/s x devices x the job's wall-clock), and the breakdown of
// where the rest of the job's peak capacity went. Pure accounting here: the
// runs' cumulative counters in, the figures out; the live timers and the
// metrics.jsonl records are parallel/metrics/tei_meter.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

// One run's counters, cumulative from its process start. Times are
// device-seconds: each rank's own seconds summed over the run's ranks (so a
// run of D ranks for W seconds has wall_s = D x W). FLOPs are global (the
// whole model, the MFU convention of parallel/cost/flops.hpp).
struct TeiCounters {
  int64_t steps = 0;          // steps this run completed
  int64_t skipped_steps = 0;  // of them, non-finite ones whose update was skipped
  double wall_s = 0;          // process start to the snapshot
  double startup_s = 0;       // process start to the first step's start
  double step_s = 0;          // inside applied steps (data, forward, backward, update)
  double comm_s = 0;          // of step_s: exposed tp, ep and dp communication of the forward/backward
  double bubble_s = 0;        // of step_s: pipeline idle (span minus busy; pp waits are in it)
  double optimizer_s = 0;     // of step_s: gradient norm, clipping, AdamW (ZeRO-1's gather included)
  double checkpoint_s = 0;    // checkpoint saves
  double eval_s = 0;          // evaluations
  double skipped_s = 0;       // inside skipped steps (lost)
  double model_flops = 0;     // model FLOPs of the applied steps
  double recompute_flops = 0; // activation recompute of the applied steps (estimated)
};

// A snapshot of a run's counters at the end of a completed step (`step` is the
// global step number), at a log interval, after a checkpoint save of that
// step (checkpoint = true) or at the run's end.
struct TeiSnapshot {
  int64_t step = 0;
  bool checkpoint = false;
  TeiCounters c;
};

struct TeiRun {
  int id = 1;                  // 1, 2, ... in the log directory
  int64_t resumed_from = 0;    // the step it started from (0: a fresh start)
  double start_unix = 0;       // its process start, seconds since the epoch (world rank 0)
  int devices = 1;             // ranks
  double peak_flops = 0;       // per device, FLOP/s: the MFU peak (the last one it used)
  std::vector<TeiSnapshot> snapshots;  // in the order written
};

// The job's figures. Fractions are of the job's peak capacity
// sum over runs of peak x device-seconds; they sum to 1.
struct TeiBreakdown {
  bool valid = false;      // a run with a snapshot and a known peak
  int runs = 0;
  double tei = 0;          // = useful
  double useful = 0;       // model FLOPs of the counted steps / capacity
  double below_peak = 0;   // the rest of the counted steps' compute (kernels below peak)
  double recompute = 0;    // estimated: compute x recompute FLOPs / (model + recompute FLOPs)
  double comm = 0;         // exposed communication
  double bubble = 0;       // pipeline bubble
  double optimizer = 0;
  double checkpoint = 0;   // checkpoint saves
  double eval = 0;
  double startup = 0;      // process start to the first step, every run
  double lost = 0;         // work after the last surviving checkpoint of a run; skipped steps
  double other = 0;        // the remainder: logging, stop agreement, the loop between steps
  double capacity_flops = 0;   // sum over runs of peak x device-seconds
  double device_s = 0;         // sum over runs of device-seconds
  double wall_s = 0;           // sum over runs of each run's wall-clock (process start to its last record)
  double gap_s = 0;            // between runs (a run's last record to the next one's start): not in TEI
  double counted_flops = 0;    // model FLOPs of the counted steps
  int64_t counted_steps = 0;
  int64_t lost_steps = 0;      // redone after a resume, or skipped
  double sum() const {
    return useful + below_peak + recompute + comm + bubble + optimizer + checkpoint + eval +
           startup + lost + other;
  }
};

// The job's TEI from its runs in order. Run k's work survives up to
// cutoff_k = min over later runs j of resumed_from_j: its kept point is its
// last snapshot when no later run exists, else its latest checkpoint
// snapshot at a step <= cutoff_k, else the end of its start-up. Everything
// after the kept point (to its last snapshot) is lost, as are its skipped
// steps. Formulas: docs/tei.md.
TeiBreakdown tei_account(const std::vector<TeiRun>& runs);

// Activation recompute FLOPs per token of the whole model (the MFU
// convention's counting, parallel/cost/flops.hpp) for train.recompute:
// selective: every layer's attention core forward again; full: the whole
// forward of the recomputing layers of every stage (MoE layers: without their
// experts, which keep their state); none: 0. An estimate of what the backward
// re-runs, not a measurement.
double recompute_flops_per_token(const RunConfig& cfg);

// The end-of-run summary's TEI block (several lines, each ending in '\n');
// "" when !b.valid.
std::string format_tei(const TeiBreakdown& b);

}  // namespace adgt
