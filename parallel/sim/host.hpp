// This host's process scheduler, measured (docs/simulator.md, "Ranks sharing
// cores"): CPU ranks that emulate a cluster on one machine take turns on its
// cores, and a rank that waits for a partner (a tensor-parallel collective, a
// pipeline message) waits, on average, for the partner's turn to come round.
// The simulator's processor sharing is fluid; it adds this wait per
// synchronisation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "parallel/sim/ops.hpp"

namespace adgt::sim {

// Mean time a process runs before the scheduler switches it out when `procs`
// busy processes share the host (measured for `seconds` by forking procs - 1
// spinning children). Seconds.
double measure_scheduler_slice(int procs, double seconds = 0.5);

// The expected wait of one synchronisation of two ranks among `procs` busy
// ranks on `cores` cores: a third of a scheduling round (procs / cores
// slices), the mean gap between two independent phases of a round; 0 when
// every rank has a core.
double sync_wait(double slice, int procs, int cores);

// The host's memory bandwidth with `threads` threads streaming at once
// (bytes/s): a triad a = b + s c over three 64 MiB arrays, the best of 5 passes
// after one that first-touches the pages (STREAM's kernel and rule).
double measure_memory_bandwidth(int threads);

// CPU ranks of one host share its memory bandwidth (docs/simulator.md, "Ranks
// sharing cores"): an op's time is at least `running` x the bytes it moves
// (DeviceModelCosts::bytes_moved) over the host's bandwidth, where `running`
// is how many ranks run at once (the ranks of the host, at most its cores
// over each rank's threads); the op's own time, measured alone, otherwise.
// running <= 1 or no bandwidth: the inner costs unchanged.
class SharedMemoryCosts final : public OpCosts {
 public:
  SharedMemoryCosts(OpCosts& inner, double host_bandwidth, double running)
      : inner_(inner), bw_(host_bandwidth), running_(running) {}
  double seconds(const Op& op, int bytes) override;
  std::string describe() const override;

 private:
  OpCosts& inner_;
  double bw_, running_;
};

class ProfileCosts;
// The wrapper for CPU ranks sharing a node (cores_per_node > 0) on the
// measured clock: `running` = min(ranks per node, cores / threads per rank),
// the bandwidth from the profile (measured once, cached); null where it does
// not apply (no shared cores, the model clock, one rank running at a time).
// What the dry run and the planner cost CPU ranks with.
std::unique_ptr<OpCosts> shared_memory_costs(const cluster::Cluster& cl, ProfileCosts& pc,
                                             bool model_clock);

// The cores every emulated rank of the run shares (emulate.cluster on this
// host, on the wall clock: all ranks run here), 0 otherwise (no emulation,
// or the virtual and model clocks, which time each rank as if it had a
// core). The launch plan and the dry run price CPU ranks with it.
int64_t emulated_host_cores(const RunConfig& cfg);

}  // namespace adgt::sim
