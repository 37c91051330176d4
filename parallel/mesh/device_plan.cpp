#include "parallel/mesh/device_plan.hpp"

#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/check.hpp"
#include "parallel/mesh/device_assign.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"

namespace adgt {

namespace {
// Every rank's error ("" for none); any one stops every rank with the first.
void agree_errors(const MpiComm& world, const std::string& mine) {
  const std::vector<std::string> all = world.all_gather_strings(mine);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw CollectiveError("rank " + std::to_string(r) + ": " + all[r]);
}
}  // namespace

std::string agreed_device(const std::string& requested, const std::vector<std::string>& chosen) {
  if (requested != "auto") return requested;
  for (const std::string& c : chosen)
    if (c != "cuda") return "cpu";
  return chosen.empty() ? "cpu" : "cuda";
}

std::string collective_transport(const std::string& device, int world, bool shared,
                                 bool nccl_built) {
  if (device == "cpu") return "mpi";
  if (device == "cuda" && world > 1 && !shared && nccl_built) return "nccl";
  return "mpi (host-staged)";
}

DevicePlan plan_devices(const ProcessGroups& pg, const std::string& requested) {
#ifdef ADGT_HAVE_NCCL
  constexpr bool nccl_built = true;
#else
  constexpr bool nccl_built = false;
#endif
  const auto* world = dynamic_cast<const MpiComm*>(pg.world.get());
  ADGT_CHECK(world, "plan_devices: the world group is not an MpiComm");
  const EnvMap env = environment();
  DevicePlan p;
  DeviceQuery q;
  std::string mine, err;
  try {
    p.shared = shared_gpu_test_mode(env);
    if (requested != "cpu" && requested != "emulated") q = cuda_device_query();
    const DeviceChoice c = choose_device(requested, q, cuda_backend_built());
    mine = c.device;
    p.warning = c.warning;
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_errors(*world, err);
  p.device = agreed_device(requested, world->all_gather_strings(mine));
  err.clear();
  try {
    if (p.device == "cuda") {
      p.cuda_device = pick_local_device(pg.launch, q.count, p.shared);
      p.device_id = fake_device(pg.launch, env).value_or(cuda_device_uuid(p.cuda_device));
    } else {
      p.device_id = p.device;
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_errors(*world, err);
  verify_device_assignment(pg, p.device_id, p.shared);
  p.transport = collective_transport(p.device, int(pg.world->size()), p.shared, nccl_built);
  return p;
}

}  // namespace adgt
