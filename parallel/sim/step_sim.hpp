// The training-step simulator (docs/simulator.md): one optimizer step of a run
// configuration on a cluster, event by event, per rank. It runs the schedule
// IR the executor runs (engine_schedule: the same generator, validator and
// ReduceGrads placement), with each instruction's work from work.hpp costed by
// an OpCosts table, the tensor- and expert-parallel collectives inside the
// ops, pipeline messages over the links they cross, the data-parallel buckets
// started as the executor starts them and reduced on a per-rank channel, the
// norm/loss all-reduces, ZeRO-1's all-gather and the optimizer.
//
// A simulated unit is one tensor-parallel group (its ranks run in lockstep,
// at the speed of its slowest member). Where every data-parallel replica is
// the same (no per-node speeds, slow ranks, link overrides, sites or shared
// cores) only replica 0 is simulated; its collectives are costed for the
// whole group. Ranks sharing cores (cpu-here, or CPU ranks emulating a
// cluster on one host) share them by processor sharing: a computing rank runs
// at min(1, cores / computing ranks) of its speed.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/work.hpp"

namespace adgt::sim {

struct SimOptions {
  // > 0: every rank of the run shares this many cores (CPU ranks emulating a
  // cluster on one host); 0: the cluster's cores_per_node (0: none shared).
  int64_t host_cores = 0;
  std::map<int, double> slow_ranks;  // world rank -> compute slowdown factor (>= 1)
  // {a, b} (world ranks, a < b) -> factor (>= 1) on the time of every
  // pipeline message between them (emulate.slow_links, or measured): a tp
  // group's message takes the slowest of its members' links.
  std::map<std::pair<int, int>, double> slow_links;
  bool all_replicas = false;         // simulate every dp replica even when they are the same
  WorkOptions work;                  // another framework's attention and dropout (work.hpp)
  // Ranks sharing more ranks than cores: the mean extra wait of each
  // synchronisation with another rank (a collective, a pipeline message), the
  // scheduler's turn-taking (host.hpp: sync_wait). 0: none.
  double sync_wait_s = 0;
  // Per world (layout) rank: the cluster device it runs on (the rank
  // placement; parallel/cluster/placement.hpp). Empty: rank r is device r.
  std::vector<int> device_of;
  // CPU ranks costed by a profile while they emulate a capped device
  // (emulate.power_cap_w; a re-plan under a measured limit): each pipeline
  // rank's compute runs power_cap_slowdown() slower on this device at its
  // power.cap_w, as the emulation slows those ranks (power_slowdown.hpp).
  // Unset: the cluster's own device, whose ops DeviceModelCosts costs capped
  // and whose limiter the step walks.
  std::optional<cluster::Device> emulated_power_device;
};

struct SimResult {
  double step_time_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // MFU convention (flops.hpp): model FLOPs, no recompute
  double mfu = 0;             // tflops_per_gpu / the device's peak for train.dtype
  double bubble = 0;          // pipeline: idle share of the stage ranks' time up to the
                              // last backward (0 without pipeline parallelism)
  // Exposed communication, seconds per step (the most of any rank): time a rank
  // waited for a group's transfers instead of computing.
  double exposed_tp_s = 0, exposed_pp_s = 0, exposed_dp_s = 0, exposed_ep_s = 0,
         exposed_step_s = 0;  // the norm/loss all-reduces and ZeRO-1's all-gather
  // Context parallelism: the ring's K/V exchange not hidden behind the block
  // before it, the all-to-alls around the attention, the MoE aux sums.
  double exposed_cp_s = 0;
  double exposed_comm_s() const {
    return exposed_tp_s + exposed_pp_s + exposed_dp_s + exposed_ep_s + exposed_cp_s +
           exposed_step_s;
  }
  // Wide-area traffic of the step (clusters with sites; docs/sites.md): the
  // bytes crossing the WAN, every rank and direction together (the
  // collectives as parallel.site_reduce runs them, and the pipeline's
  // messages), the seconds the busiest rank spends in WAN phases
  // (cross-site collective phases and messages), and the exposed part,
  // estimated: exposed_dp_s and exposed_pp_s (which contain it) times the
  // WAN's share of the gradient reduction's and of the pipeline messages'
  // time (the most of any rank).
  double wan_bytes = 0, wan_s = 0, exposed_wan_s = 0;
  double compute_s = 0;        // the busiest rank's compute
  double optimizer_s = 0;      // the update (sum of squares + AdamW)
  double memory_bytes_max = 0; // the dry run's estimate (parallel/cost/memory.hpp)
  // Of it: the model state (parameters, gradients, optimizer with master
  // weights) and ZeRO-2/3's working set (gathered units, unit gradients).
  double memory_state_bytes = 0, memory_zero_working_bytes = 0;
  // Energy of the step over every device (device.power; 0: not modelled —
  // no power model, or measured op costs): idle power over the step plus
  // the computes' dynamic energy (interconnect and hosts not counted).
  double energy_j = 0, energy_per_token_j = 0, mean_power_w = 0;
  // A power limiter under a cap (power.hpp): the largest share of a pipeline
  // rank's compute spent braked, and its step's slowdown; -1: no limiter.
  double limiter_braked = -1, limiter_slowdown = -1;
  int64_t world = 0;
  int64_t microbatches = 0;
  int64_t units_simulated = 0;
  int64_t events = 0;
};

// The simulated step as a timeline (adgt-sim --trace; docs/trace.md): per
// simulated unit (a tp group of one pipeline rank and replica), its tasks
// grouped under the names the run's trace gives them — each pipeline
// instruction as pp::to_string prints it ("Forward(mb 0, chunk 0)", also for
// an unpipelined step's micro-batches), "dp wait", the step's collectives
// ("all_reduce dp"), "optimizer" — each span from the end of the task before
// it to the end of its last task, seconds from the step's start.
struct SimTrace {
  struct Span {
    std::string name, cat;  // cat: compute, wait, pipeline, comm, optimizer (the run's categories)
    double start = 0, end = 0;
  };
  struct UnitTimeline {
    int world_rank = 0;  // the unit's first rank (tp 0)
    int pp = 0, dp = 0;  // the unit's pipeline rank and replica (dp x cp, cp fastest)
    std::vector<int> ranks;  // its tp group's world ranks
    std::vector<Span> spans;
  };
  std::vector<UnitTimeline> units;
};

// Simulates one step of the validated `cfg` (its layout in parallel.*) on
// `cl`, whose devices must be at least tp*pp*dp (std::invalid_argument
// otherwise, naming both). trace: filled with the step's timeline.
SimResult simulate_step(const RunConfig& cfg, const cluster::Cluster& cl, OpCosts& costs,
                        const SimOptions& opts = {}, SimTrace* trace = nullptr);

// One JSON object: step_time_s, tokens_per_s, tflops_per_gpu, mfu, bubble,
// exposed_comm_s (and per group), memory_gib_max, ...
std::string to_json(const SimResult& r);

}  // namespace adgt::sim
