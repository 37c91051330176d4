// Pipeline-schedule generators: each returns the per-rank instruction lists
// of instruction.hpp, with the Send/Recv pairs and the final WaitSends
// already in place (from_compute_order). docs/pipeline-schedules.md draws
// each one.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/instruction.hpp"

namespace adgt::pp {

// GPipe: every rank runs all m forwards, then all m (fused) backwards, in
// micro-batch order. Peak in-flight activations: m on every rank. Any m >= 1.
Schedule gpipe(int pp, int m);

// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): rank r runs
// w = min(pp - r - 1, m) warm-up forwards, then m - w steady pairs
// (forward of micro-batch w + i, fused backward of i), then w cool-down
// backwards. Peak in-flight on rank r: min(pp - r, m). Needs m >= pp.
Schedule one_f_one_b(int pp, int m);

// Megatron's interleaved 1F1B over v chunks per rank (stage c*pp + r on rank
// r, chunk c). The k-th forward of a rank is chunk (k mod pp*v) / pp of
// micro-batch (k / (pp*v)) * pp + k mod pp; backwards walk the chunks in
// reverse. Warm-up: all m*v forwards when m == pp, else
// min(2 (pp - r - 1) + (v - 1) pp, m v); then forward/backward pairs; then
// the remaining backwards. Needs pp >= 2, v >= 2, m >= pp and m % pp == 0.
Schedule interleaved_1f1b(int pp, int m, int v);

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward is
// split into BackwardInput (B) and BackwardWeight (W). Forwards and B's
// follow 1F1B exactly (so the peak in-flight activations are 1F1B's), and
// rank r defers its first r W's: after the k-th B (k = 0, 1, ...) it runs the
// oldest pending W only when k >= r; the deferred W's fill the cool-down.
// With T_F = T_B = T_W the bubble is (pp-1) T_F per rank instead of 1F1B's
// 3 (pp-1) T_F. Needs m >= pp.
Schedule zb_h1(int pp, int m);

// Greedy list scheduling from measured stage times (the base for adaptive
// scheduling). One chunk per rank when costs have pp entries; v chunks per
// rank (stage c*pp + r on rank r, as interleaved) when they have pp*v. The
// timeline is simulated; whenever a rank is free it starts one of its ready
// instructions (F, B and W each in micro-batch order per stage):
//   a B whose output gradient has arrived (the critical path; of several
//   chunks', the earliest ready), else
//   an F whose input has arrived, while fewer than mem_limit_microbatches
//   micro-batches are admitted on the rank (from their chunk-0 F to their
//   chunk-0 B; with v = 1 the activations in flight; later chunks' F of an
//   admitted micro-batch always may run), else
//   a W (weight gradients fill time that would otherwise be idle);
// and the variant with F before B, variants that only start a W when it
// ends before the next F or B can start, and with v > 1 variants that run
// the deepest chunk's ready F first. Of these candidates and the
// hand-written orders (v = 1: 1F1B and ZB-H1 where they fit the memory
// limit, m >= pp; v > 1: the interleaved order, fused and with split
// backwards whose W's are deferred as in ZB-H1, m a multiple of pp), it
// returns the one with the shortest simulated makespan (Schedule::detail
// names it; with costs.jitter the shortest expected makespan,
// expected_makespan). Needs mem_limit_microbatches >= 1. `held_limit` caps what a
// rank holds from forward to its last backward, weight gradients included,
// summed over its chunks (max_held_activations, what the memory estimate
// counts): candidates above it are skipped.
// With placement vee (v = 2) the stages sit as ZB-V places them
// (core/model/stage_map.hpp) and only the list-scheduling variants run.
Schedule greedy(int pp, int m, const StageCosts& costs, std::int64_t mem_limit_microbatches,
                std::int64_t held_limit = std::numeric_limits<std::int64_t>::max(),
                StagePlacement placement = StagePlacement::looped);

// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"):
// two chunks per rank in the V-shaped placement (rank r holds stages r and
// 2pp-1-r, so rank 0 holds the first and the last, and rank pp-1 turns a
// micro-batch around in memory), split backwards, and at most pp
// micro-batches admitted per rank: 1F1B's activation memory (each chunk
// holds half a stage of one chunk's layers). The order is greedy's list
// scheduling over `costs` (empty: F = B = W = 1), which on equal times
// fills the warm-up and cool-down with the other chunk's work and the W's.
// Any m >= 1; pp >= 2.
Schedule zb_v(int pp, int m, const StageCosts& costs = {});

// The schedules make_schedule() knows, in the order of its error message.
const std::vector<std::string>& schedule_names();  // gpipe 1f1b interleaved zb-h1 zb-v greedy

// Dispatch by name. `costs` is only used by greedy and zb-v (empty: F = B =
// W = 1 per stage, comm 0); `mem_limit` and `held_limit` only by greedy
// (mem_limit 0: pp, 1F1B's peak); `placement` must be vee for zb-v and may
// be for greedy (v = 2). Checks the arguments first (check_schedule_args).
Schedule make_schedule(const std::string& name, int pp, int m, int v,
                       const StageCosts& costs = {}, std::int64_t mem_limit = 0,
                       std::int64_t held_limit = std::numeric_limits<std::int64_t>::max(),
                       StagePlacement placement = StagePlacement::looped);

// The settings rules of every schedule, as named errors (ScheduleError):
//   parallel.schedule not one of schedule_names();
//   parallel.pp < 1, parallel.microbatches < 1, parallel.virtual_stages < 1;
//   v > 1 with a schedule other than interleaved, greedy or zb-v; interleaved with v < 2
//   or pp < 2; greedy with v > 1 and pp < 2;
//   m < pp for 1f1b, zb-h1 and interleaved;
//   interleaved with m not a multiple of pp (as Megatron requires).
//   the vee placement without virtual_stages=2, pp >= 2 and schedule
//   zb-v or greedy; zb-v without placement vee.
void check_schedule_args(const std::string& schedule, int pp, int v, int m,
                         StagePlacement placement = StagePlacement::looped);

// check_schedule_args, plus model.n_layers divisible by pp * v (every stage
// the same number of layers).
void check_pipeline_config(int n_layers, int pp, int v, int m, const std::string& schedule,
                           StagePlacement placement = StagePlacement::looped);

}  // namespace adgt::pp
