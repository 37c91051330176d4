// This host's process scheduler, measured (docs/simulator.md, "Ranks sharing
// cores"): CPU ranks that emulate a cluster on one machine take turns on its
// cores, and a rank that waits for a partner (a tensor-parallel collective, a
// pipeline message) waits, on average, for the partner's turn to come round.
// The simulator's processor sharing is fluid; it adds this wait per
// synchronisation.
#pragma once

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

}  // namespace adgt::sim
