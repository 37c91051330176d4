// Launch detection (parallel/comm/launch.hpp) on hand-made environments: the
// precedence mpirun > srun > single, Slurm's per-node task lists, and the
// refusal of launchers adgt does not support.
#include <catch2/catch.hpp>

#include "parallel/comm/launch.hpp"

using namespace adgt;

namespace {
EnvMap mpirun_env(int rank, int world, int local, int local_world) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(world)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_world)}};
}
// What srun --mpi=pmix gives task 5 of 8 on the second of two nodes (4 per node).
EnvMap srun_env() {
  return {{"SLURM_JOB_ID", "77"},        {"SLURM_STEP_ID", "0"},   {"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "8"},         {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},         {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"PMIX_RANK", "5"}};
}
}  // namespace

TEST_CASE("launch: no launcher is a single process", "[parallel][launch]") {
  const LaunchInfo l = detect_launch_from({{"HOME", "/root"}}, "h1");
  CHECK(l.launcher == "single");
  CHECK(l.rank == 0);
  CHECK(l.world == 1);
  CHECK(l.local_rank == 0);
  CHECK(l.local_world == 1);
  CHECK(l.host == "h1");
  // torchrun-style variables that say "one process" are harmless.
  CHECK(detect_launch_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, "h").launcher == "single");
}

TEST_CASE("launch: Open MPI's mpirun", "[parallel][launch]") {
  const LaunchInfo l = detect_launch_from(mpirun_env(6, 8, 2, 4), "n2");
  CHECK(l.launcher == "mpirun");
  CHECK(l.rank == 6);
  CHECK(l.world == 8);
  CHECK(l.local_rank == 2);
  CHECK(l.local_world == 4);
  CHECK(l.host == "n2");
}

TEST_CASE("launch: srun with PMIx", "[parallel][launch]") {
  const LaunchInfo l = detect_launch_from(srun_env(), "n1");
  CHECK(l.launcher == "srun");
  CHECK(l.rank == 5);
  CHECK(l.world == 8);
  CHECK(l.local_rank == 1);
  CHECK(l.local_world == 4);
}

TEST_CASE("launch: Slurm's per-node task lists", "[parallel][launch]") {
  EnvMap env = srun_env();
  env["SLURM_STEP_TASKS_PER_NODE"] = "3(x2),2";  // nodes 0,1: 3 tasks; node 2: 2
  env["SLURM_NODEID"] = "2";
  env["SLURM_PROCID"] = "7";
  env["SLURM_LOCALID"] = "1";
  CHECK(detect_launch_from(env, "h").local_world == 2);
  env["SLURM_NODEID"] = "1";
  env["SLURM_LOCALID"] = "2";
  CHECK(detect_launch_from(env, "h").local_world == 3);
  // Without the step's list, --ntasks-per-node.
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK(detect_launch_from(env, "h").local_world == 4);
  env["SLURM_STEP_TASKS_PER_NODE"] = "3(x2";
  CHECK_THROWS_WITH(detect_launch_from(env, "h"), Catch::Contains("is not a Slurm task list"));
}

TEST_CASE("launch: mpirun wins over the Slurm variables it inherits", "[parallel][launch]") {
  EnvMap env = srun_env();  // mpirun inside an allocation (or inside an srun step)
  for (auto& [k, v] : mpirun_env(3, 4, 3, 4)) env[k] = v;
  const LaunchInfo l = detect_launch_from(env, "h");
  CHECK(l.launcher == "mpirun");
  CHECK(l.rank == 3);
  CHECK(l.world == 4);
}

TEST_CASE("launch: srun without PMIx is refused", "[parallel][launch]") {
  EnvMap env = srun_env();
  env.erase("PMIX_RANK");
  CHECK_THROWS_WITH(detect_launch_from(env, "h"),
                    Catch::Contains("srun started 8 tasks without PMIx") &&
                        Catch::Contains("srun --mpi=pmix"));
  // One task needs no PMIx.
  env["SLURM_NTASKS"] = env["SLURM_STEP_NUM_TASKS"] = "1";
  env["SLURM_PROCID"] = env["SLURM_LOCALID"] = env["SLURM_NODEID"] = "0";
  env["SLURM_STEP_TASKS_PER_NODE"] = "1";
  CHECK(detect_launch_from(env, "h").launcher == "srun");
}

TEST_CASE("launch: unknown launchers are refused with the variables seen", "[parallel][launch]") {
  CHECK_THROWS_WITH(detect_launch_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}, "h"),
                    Catch::Contains("unknown launcher") &&
                        Catch::Contains("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0") &&
                        Catch::Contains("torchrun") && Catch::Contains("mpirun -np N") &&
                        Catch::Contains("srun --mpi=pmix -n N"));
  CHECK_THROWS_WITH(detect_launch_from({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}}, "h"),
                    Catch::Contains("PMI_RANK=1 PMI_SIZE=4"));
  CHECK_THROWS_WITH(detect_launch_from({{"PMIX_RANK", "0"}}, "h"), Catch::Contains("PMIX_RANK=0"));
  // A batch script of several tasks that runs the program without srun.
  CHECK_THROWS_WITH(
      detect_launch_from({{"SLURM_JOB_ID", "5"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}}, "h"),
      Catch::Contains("Slurm batch script") && Catch::Contains("start the program with srun"));
  // ... while a one-task batch job is a single process.
  CHECK(detect_launch_from({{"SLURM_JOB_ID", "5"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}, "h")
            .launcher == "single");
}

TEST_CASE("launch: malformed or inconsistent values are errors", "[parallel][launch]") {
  EnvMap env = mpirun_env(0, 2, 0, 2);
  env["OMPI_COMM_WORLD_RANK"] = "x";
  CHECK_THROWS_WITH(detect_launch_from(env, "h"), Catch::Contains("OMPI_COMM_WORLD_RANK='x' is not an integer"));
  CHECK_THROWS_WITH(detect_launch_from(mpirun_env(2, 2, 0, 2), "h"), Catch::Contains("inconsistent"));
  env = mpirun_env(0, 2, 0, 2);
  env.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  CHECK_THROWS_WITH(detect_launch_from(env, "h"), Catch::Contains("without OMPI_COMM_WORLD_LOCAL_SIZE"));
}
