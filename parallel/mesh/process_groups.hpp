// The process groups of a validated Layout (core/layout.hpp) over
// MPI_COMM_WORLD, made once at start and passed by reference (no global
// communicators). The world is re-ordered by the rank placement
// (parallel/cluster/placement.hpp, docs/placement.md): world->rank() is the layout
// rank; launch.rank stays the launcher's (MPI) rank.
#pragma once
#include <memory>
#include <string>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "parallel/comm/launch.hpp"
#include "parallel/cluster/placement.hpp"

namespace adgt {

namespace emulate {
struct Emulation;
}

struct ProcessGroups {
  LaunchInfo launch;    // as the launcher started this process: launch.rank, host, local rank
  Placement placement;  // launcher rank -> layout rank; default: the identity
  Layout layout;
  RankCoords coords;                        // this rank's place in the layout
  // MpiComm each; world: ordered by layout rank; members and order: group_ranks()
  std::unique_ptr<Comm> world, tp, dp, pp;
  // Expert parallelism (ep consecutive ranks of each dp group) and the
  // expert-data-parallel group: the dp ranks holding the same experts.
  std::unique_ptr<Comm> ep, edp;
  // Context parallelism: the cp ranks sharing each sequence, and the dp x cp
  // ranks replicating one stage's tp shard (both groups of one when cp = 1
  // and dp = 1; dpcp is the dp group's members when cp = 1), and of them
  // those holding the same experts (edp x cp; edp's members when cp = 1).
  std::unique_ptr<Comm> cp, dpcp, edpcp;
};

// Collective over MPI_COMM_WORLD: the placement of cfg.parallel.placement
// for this launch (place_ranks() with tp = cfg.parallel.tp). The physical node
// and site of each launcher rank: under emulation (cfg.emulate.cluster set)
// the emulated cluster's, as emulate.rank_order hands them out
// (emulate::launcher_devices); otherwise the host names of all ranks
// (nodes_of_hosts) and each rank's ADGT_SITE (set on every rank or none; a
// CollectiveError naming the ranks without it otherwise). An unknown or too small emulated cluster throws the same
// CollectiveError on every rank, naming emulate.cluster.
Placement place_launch(const RunConfig& cfg);

// Collective over MPI_COMM_WORLD (an MpiEnv must exist). Re-splits the world
// (MPI_Comm_split, color 0, key = layout rank of `placement`; the identity by
// default) so world->rank() is the layout rank, then splits it into the groups
// of group_ranks() (core/layout.hpp): tp groups are consecutive ranks, dp
// groups stride tp, pp groups stride tp*dp; ep and edp divide the dp groups.
// Only layout.tp, dp, pp and ep matter here. Throws CollectiveError on every
// rank (so fatal() lets every rank report it) when layout.world() differs from
// the MPI world size:
//   "parallel: tp=2 x dp=2 x pp=1 = 4 ranks but the launch has 8 (mpirun -np / srun -n); use ..."
// or the placement does not cover the launch's ranks once each.
ProcessGroups make_process_groups(const Layout& layout, const Placement& placement = {});

// Collective: one line per rank, in layout-rank order — rank (the layout
// rank), its launcher rank (a column only when the placement reorders), host,
// local rank, node (the placement's physical node; a column only when the
// placement knows them), site (a column only when the placement knows two or
// more: the emulated cluster's sites or ADGT_SITE), tp/dp/pp coordinates, device, and the transport of
// its groups' collectives ("mpi"; "mpi (host-staged)" for device memory
// without NCCL; "nccl") — gathered to world rank 0, which gets the table
// (header first, then the placement's why and warning lines when it has
// them); the other ranks get "".
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
