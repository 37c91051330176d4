// Which launcher started this process, and where it sits: read from the
// environment before MPI starts (docs/parallel.md, "Launch detection").
//
// Precedence, first match wins:
//   1. Open MPI's mpirun:  OMPI_COMM_WORLD_SIZE is set
//        rank OMPI_COMM_WORLD_RANK, world OMPI_COMM_WORLD_SIZE,
//        local rank / world OMPI_COMM_WORLD_LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_SIZE.
//      First because mpirun inside a Slurm allocation also inherits SLURM_*.
//   2. Slurm's srun:  SLURM_STEP_ID (or SLURM_STEPID) is set, i.e. this is a task of a job step
//        rank SLURM_PROCID, world SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
//        local rank SLURM_LOCALID, local world this node's entry of
//        SLURM_STEP_TASKS_PER_NODE ("2(x3),1", indexed by SLURM_NODEID), else
//        SLURM_NTASKS_PER_NODE. With world > 1, PMIX_RANK must be set too
//        (Open MPI joins an srun step only through PMIx: `srun --mpi=pmix`).
//      A Slurm batch script itself has SLURM_PROCID but no step id: not srun.
//   3. None: rank 0 of 1, launcher "single".
// Anything else that says "several processes" — torchrun's RANK / WORLD_SIZE /
// LOCAL_RANK with WORLD_SIZE > 1, MPICH's PMI_RANK / PMI_SIZE, a bare PMIX_RANK,
// a Slurm batch script of several tasks not started through srun — is an
// error naming the variables seen and saying to launch with mpirun or srun.
#pragma once
#include <map>
#include <string>

namespace adgt {

struct LaunchInfo {
  int rank = 0, world = 1;             // this process among all of the launch
  int local_rank = 0, local_world = 1; // among the processes on this host
  std::string host;                    // this host's name
  std::string launcher = "single";     // "mpirun", "srun" or "single"
};

using EnvMap = std::map<std::string, std::string>;

// The pure rule above, on a given environment. Throws std::runtime_error.
LaunchInfo detect_launch_from(const EnvMap& env, const std::string& host);
// detect_launch_from(environment(), host_name()).
LaunchInfo detect_launch();

EnvMap environment();     // a copy of this process's environment
std::string host_name();  // gethostname(), "unknown-host" if that fails

}  // namespace adgt
