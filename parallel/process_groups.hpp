// The process groups of a validated Layout (core/layout.hpp) over
// MPI_COMM_WORLD, made once at start and passed by reference (no global
// communicators).
#pragma once
#include <memory>
#include <string>

#include "core/comm.hpp"
#include "core/layout.hpp"
#include "parallel/launch.hpp"

namespace adgt {

namespace emulate {
struct Emulation;
}

struct ProcessGroups {
  LaunchInfo launch;
  Layout layout;
  RankCoords coords;                        // this rank's place in the layout
  std::unique_ptr<Comm> world, tp, dp, pp;  // MpiComm each; members and order: group_ranks()
  // Expert parallelism (ep consecutive ranks of each dp group) and the
  // expert-data-parallel group: the dp ranks holding the same experts.
  std::unique_ptr<Comm> ep, edp;
};

// Collective over MPI_COMM_WORLD (an MpiEnv must exist). Splits the world into
// the groups of group_ranks() (core/layout.hpp): tp groups are consecutive
// ranks, dp groups stride tp, pp groups stride tp*dp; ep and edp divide the dp
// groups. Only layout.tp, dp, pp and ep matter here. Throws CollectiveError on
// every rank (so fatal() lets every rank report it) when layout.world()
// differs from the MPI world size:
//   "parallel: tp=2 x dp=2 x pp=1 = 4 ranks but the launch has 8 (mpirun -np / srun -n); use ..."
ProcessGroups make_process_groups(const Layout& layout);

// Collective: one line per rank — rank, host, local rank, tp/dp/pp
// coordinates, device, and the transport of its groups' collectives ("mpi";
// "mpi (host-staged)" for device memory without NCCL; "nccl") — gathered to
// world rank 0, which gets the table (header first); the other ranks get "".
// With `emulation` (parallel/emulate/emulation.hpp) a column names each rank's
// emulated node and compute slowdown, after a line naming the cluster.
std::string rank_table(const ProcessGroups& pg, const std::string& device,
                       const std::string& collectives = "mpi",
                       const emulate::Emulation* emulation = nullptr);

// Collective: gathers every rank's (host, device) and runs
// check_device_assignment on all of them, so every rank throws the same
// error (a CollectiveError).
void verify_device_assignment(const ProcessGroups& pg, const std::string& device, bool allow_shared);

}  // namespace adgt
