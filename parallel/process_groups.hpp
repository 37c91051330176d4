// The process groups of a validated ParallelDims over MPI_COMM_WORLD, made
// once at start and passed by reference (no global communicators).
#pragma once
#include <memory>
#include <string>

#include "core/comm.hpp"
#include "parallel/launch.hpp"
#include "parallel/mesh.hpp"

namespace adgt {

struct ProcessGroups {
  LaunchInfo launch;
  ParallelDims dims;
  RankCoords coords;                    // this rank's place in the mesh
  std::unique_ptr<Comm> world, tp, dp, pp;  // MpiComm each; group ranks follow mesh.hpp
  // Expert parallelism (ep consecutive ranks of each dp group) and the
  // expert-data-parallel group: the dp ranks holding the same experts.
  std::unique_ptr<Comm> ep, edp;
};

// Collective over MPI_COMM_WORLD (an MpiEnv must exist). Splits the world by
// the mesh formula of mesh.hpp: tp groups are consecutive ranks, dp groups
// stride tp, pp groups stride tp*dp. Throws CollectiveError on every rank
// (so fatal() lets every rank report it) when dims.world() differs from the
// MPI world size:
//   "parallel: tp=2 x dp=2 x pp=1 = 4 ranks but the launch has 8 (mpirun -np / srun -n); use ..."
ProcessGroups make_process_groups(const ParallelDims& dims);

// Collective: one line per rank — rank, host, local rank, tp/dp/pp
// coordinates, device — gathered to world rank 0, which gets the table
// (header first); the other ranks get "".
std::string rank_table(const ProcessGroups& pg, const std::string& device);

// Collective: gathers every rank's (host, device) and runs
// check_device_assignment on all of them, so every rank throws the same
// error (a CollectiveError).
void verify_device_assignment(const ProcessGroups& pg, const std::string& device, bool allow_shared);

}  // namespace adgt
