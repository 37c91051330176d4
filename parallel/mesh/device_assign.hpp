// Which GPU each rank uses, and the check that no two ranks share one
// (pure logic; process_groups.hpp gathers the slots over MPI).
//
// Production rule: one GPU per rank. Sharing is allowed only in the explicit
// shared-GPU test mode (env ADGT_SHARED_GPU_TEST=1), where several ranks run
// on one GPU and their collectives go through MPI with host staging.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/launch.hpp"

namespace adgt {

struct DeviceSlot {
  int rank = 0;
  std::string host;
  std::string device;  // a GPU's UUID (or index); "cpu" and "emulated" are never exclusive
};

// Throws, naming both ranks, the host and the device, when two ranks hold the
// same (host, device), unless allow_shared. The same slots give the same
// message on every rank.
void check_device_assignment(const std::vector<DeviceSlot>& slots, bool allow_shared);

// The CUDA device index this rank should use among `visible_devices`:
//   - one visible device (e.g. Slurm's --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES
//     per task): device 0; whether ranks on a host then share it is for
//     check_device_assignment, on the devices' UUIDs;
//   - local_world <= visible_devices: device local_rank;
//   - more local ranks than devices: an error, or local_rank % visible_devices
//     when allow_shared.
int pick_local_device(const LaunchInfo& launch, int visible_devices, bool allow_shared);

// ADGT_SHARED_GPU_TEST: unset, "" or "0" = false, "1" = true, else an error.
bool shared_gpu_test_mode(const EnvMap& env);

// Test hook: ADGT_FAKE_DEVICES="0,0,1" names the device of local ranks 0, 1, 2
// on every host ("gpu0", "gpu0", "gpu1"), standing in for real device ids on
// machines without GPUs. Empty when unset.
std::optional<std::string> fake_device(const LaunchInfo& launch, const EnvMap& env);

}  // namespace adgt
