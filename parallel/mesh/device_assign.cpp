#include "parallel/mesh/device_assign.hpp"

#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace adgt {

namespace {
const char* kSharedHint =
    "give each rank its own GPU (srun --gpus-per-task=1, or --ntasks-per-node / mpirun -np "
    "per node = GPUs per node), or set ADGT_SHARED_GPU_TEST=1 for the shared-GPU test mode";
}

void check_device_assignment(const std::vector<DeviceSlot>& slots, bool allow_shared) {
  if (allow_shared) return;
  std::map<std::pair<std::string, std::string>, int> owner;  // (host, device) -> first rank
  for (const DeviceSlot& s : slots) {
    if (s.device == "cpu" || s.device == "emulated") continue;  // never exclusive
    auto [it, fresh] = owner.emplace(std::make_pair(s.host, s.device), s.rank);
    if (!fresh) {
      std::ostringstream os;
      os << "device assignment: ranks " << it->second << " and " << s.rank << " both use device "
         << s.device << " on host " << s.host << "; " << kSharedHint;
      throw std::runtime_error(os.str());
    }
  }
}

int pick_local_device(const LaunchInfo& l, int visible_devices, bool allow_shared) {
  std::ostringstream where;
  where << "rank " << l.rank << " (host " << l.host << ", local rank " << l.local_rank << " of "
        << l.local_world << ")";
  if (visible_devices <= 0)
    throw std::runtime_error("device assignment: " + where.str() +
                             " sees no CUDA device; check CUDA_VISIBLE_DEVICES and the job's GPU "
                             "request (srun --gpus-per-task=1)");
  if (visible_devices == 1) return 0;
  if (l.local_world <= visible_devices) return l.local_rank;
  if (allow_shared) return l.local_rank % visible_devices;
  std::ostringstream os;
  os << "device assignment: " << where.str() << ": " << l.local_world
     << " ranks on this host but " << visible_devices << " visible GPUs; " << kSharedHint;
  throw std::runtime_error(os.str());
}

bool shared_gpu_test_mode(const EnvMap& env) {
  auto it = env.find("ADGT_SHARED_GPU_TEST");
  if (it == env.end() || it->second.empty() || it->second == "0") return false;
  if (it->second == "1") return true;
  throw std::runtime_error("ADGT_SHARED_GPU_TEST='" + it->second + "': use 1 (on) or 0 (off)");
}

std::optional<std::string> fake_device(const LaunchInfo& l, const EnvMap& env) {
  auto it = env.find("ADGT_FAKE_DEVICES");
  if (it == env.end()) return std::nullopt;
  std::vector<std::string> ids;
  std::stringstream ss(it->second);
  for (std::string id; std::getline(ss, id, ',');) ids.push_back(id);
  if (l.local_rank >= int(ids.size()))
    throw std::runtime_error("ADGT_FAKE_DEVICES='" + it->second + "' has no entry for local rank " +
                             std::to_string(l.local_rank) + " (one comma-separated id per local rank)");
  return "gpu" + ids[size_t(l.local_rank)];
}

}  // namespace adgt
