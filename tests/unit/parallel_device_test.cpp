// Device assignment (parallel/mesh/device_assign.hpp): one GPU per rank unless the
// shared-GPU test mode is on.
#include <catch2/catch.hpp>

#include "parallel/mesh/device_assign.hpp"
#include "parallel/mesh/device_plan.hpp"

using namespace adgt;

namespace {
LaunchInfo local(int local_rank, int local_world) {
  LaunchInfo l;
  l.rank = 10 + local_rank;
  l.world = 32;
  l.local_rank = local_rank;
  l.local_world = local_world;
  l.host = "node3";
  l.launcher = "srun";
  return l;
}
}  // namespace

TEST_CASE("devices: distinct (host, device) pairs pass", "[parallel][device]") {
  CHECK_NOTHROW(check_device_assignment({{0, "a", "GPU-1"}, {1, "a", "GPU-2"}, {2, "b", "GPU-1"},
                                         {3, "b", "GPU-2"}},
                                        false));
  // CPU ranks share the host freely.
  CHECK_NOTHROW(check_device_assignment({{0, "a", "cpu"}, {1, "a", "cpu"}}, false));
}

TEST_CASE("devices: two ranks on one device name both ranks, the host and the device",
          "[parallel][device]") {
  const std::vector<DeviceSlot> slots = {{0, "a", "GPU-1"}, {1, "a", "GPU-2"}, {2, "b", "GPU-7"},
                                         {3, "b", "GPU-7"}};
  CHECK_THROWS_WITH(check_device_assignment(slots, false),
                    Catch::Contains("ranks 2 and 3 both use device GPU-7 on host b") &&
                        Catch::Contains("--gpus-per-task=1") &&
                        Catch::Contains("ADGT_SHARED_GPU_TEST=1"));
  CHECK_NOTHROW(check_device_assignment(slots, true));
}

TEST_CASE("devices: picking the local device", "[parallel][device]") {
  CHECK(pick_local_device(local(3, 4), 4, false) == 3);
  CHECK(pick_local_device(local(1, 2), 8, false) == 1);
  // One GPU per task (Slurm sets CUDA_VISIBLE_DEVICES per task): device 0.
  CHECK(pick_local_device(local(3, 4), 1, false) == 0);
  CHECK_THROWS_WITH(pick_local_device(local(5, 8), 4, false),
                    Catch::Contains("rank 15 (host node3, local rank 5 of 8): 8 ranks on this host but 4 visible GPUs"));
  CHECK(pick_local_device(local(5, 8), 4, true) == 1);
  CHECK_THROWS_WITH(pick_local_device(local(0, 1), 0, false), Catch::Contains("sees no CUDA device"));
}

TEST_CASE("devices: the test-mode switches", "[parallel][device]") {
  CHECK_FALSE(shared_gpu_test_mode({}));
  CHECK_FALSE(shared_gpu_test_mode({{"ADGT_SHARED_GPU_TEST", "0"}}));
  CHECK(shared_gpu_test_mode({{"ADGT_SHARED_GPU_TEST", "1"}}));
  CHECK_THROWS_WITH(shared_gpu_test_mode({{"ADGT_SHARED_GPU_TEST", "yes"}}), Catch::Contains("use 1 (on) or 0 (off)"));
  CHECK_FALSE(fake_device(local(0, 2), {}).has_value());
  CHECK(fake_device(local(1, 2), {{"ADGT_FAKE_DEVICES", "0,0"}}).value() == "gpu0");
  CHECK(fake_device(local(1, 2), {{"ADGT_FAKE_DEVICES", "3,5"}}).value() == "gpu5");
  CHECK_THROWS_WITH(fake_device(local(2, 3), {{"ADGT_FAKE_DEVICES", "0,1"}}), Catch::Contains("no entry for local rank 2"));
}

TEST_CASE("devices: the run's device is agreed over the ranks", "[parallel][device]") {
  CHECK(agreed_device("auto", {"cuda", "cuda"}) == "cuda");
  CHECK(agreed_device("auto", {"cuda", "cpu"}) == "cpu");  // one rank without a GPU: all on the CPU
  CHECK(agreed_device("cpu", {"cpu", "cpu"}) == "cpu");
  CHECK(agreed_device("emulated", {"emulated"}) == "emulated");
  CHECK(collective_transport("cpu", 8, false, true) == "mpi");
  CHECK(collective_transport("emulated", 8, false, true) == "mpi (host-staged)");
  CHECK(collective_transport("cuda", 8, false, true) == "nccl");
  CHECK(collective_transport("cuda", 8, true, true) == "mpi (host-staged)");   // shared GPU
  CHECK(collective_transport("cuda", 1, false, true) == "mpi (host-staged)");  // one process
  CHECK(collective_transport("cuda", 8, false, false) == "mpi (host-staged)"); // no NCCL built
}
