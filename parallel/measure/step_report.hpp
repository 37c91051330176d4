// What one step measured, as the loop hands it to the observers and
// controllers (parallel/control/hook.hpp), and the readings derived from it
// that several controllers use.
#pragma once
#include <cstdint>

#include "parallel/engine/engine.hpp"

namespace adgt {

// What the loop knows after a step; the same on every rank except the
// per-rank measurements marked so.
struct StepReport {
  int64_t step = 0;        // steps completed (1-based)
  int64_t first_step = 0;  // the step this run started from (resume)
  int64_t total_steps = 0; // train.steps
  double loss = 0, grad_norm = 0, lr = 0;
  bool applied = true;     // the update was applied (loss and norm finite)
  int64_t skipped_steps = 0;  // updates skipped so far in this run
  double seconds = 0;      // this rank: the step's wall time
  int64_t tp_bytes = 0, dp_bytes = 0, pp_bytes = 0;  // this rank: bytes sent in the step, per group
  int64_t cp_bytes = 0;  // context parallelism: the ring's K/V and dK/dV, or the all-to-alls
  // This rank: seconds the step spent inside blocking calls of its tp, pp, ep
  // and cp groups (the compute waited on them: exposed communication); the dp
  // reduction's exposed part is the engine's dp_wait_s.
  double tp_seconds = 0, pp_seconds = 0, ep_seconds = 0, cp_seconds = 0;
  // Backend calls that waited for the device to hand the host a value in this
  // step (Backend::host_reads; -1 where not counted: the CPU backend).
  int64_t host_reads = -1;
  // A blend of token files: training tokens read from each source so far
  // (the same on every rank: a function of the global sample index).
  std::vector<int64_t> source_tokens;
};

// This rank's compute in the step: with a pipeline, the executor's compute
// instructions' own time (PipelineExecutor::last_compute_seconds: CPU time x
// the emulated slowdown where measured); else the step's wall time less the
// time blocked in tp, pp, ep and cp calls and the exposed dp wait. The re-plan of
// parallel.auto and the expert-placement controller read a rank's speed from it.
double rank_compute_seconds(Engine& e, const StepReport& r);

}  // namespace adgt
