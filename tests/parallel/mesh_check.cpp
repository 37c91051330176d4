// adgt-mesh-check: starts MPI, builds the process groups of --tp/--dp/--pp,
// checks the device assignment, prints the rank table (rank 0) and sums a
// value in every group. The bad-launch tests run it with the wrong -np, an
// unknown launcher environment, or two ranks on one (fake) device.
//
//   mpirun -np 4 adgt-mesh-check --tp 2 --dp 2 [--pp 1]
//   ADGT_FAKE_DEVICES=0,1 ...   device of each local rank (test hook; else "cpu")
//   ADGT_SHARED_GPU_TEST=1 ...  allows ranks to share a device
//   ADGT_MESH_CHECK_FAIL_RANK=R  rank R throws alone while the others wait in a
//                                barrier: fatal() must end the whole job
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/mesh/device_assign.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/mesh/process_groups.hpp"

using namespace adgt;

namespace {
int positive(const std::string& flag, const char* v) {
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1 || n > 1 << 20)
    throw std::runtime_error(flag + " '" + v + "': expected a positive integer");
  return int(n);
}
}  // namespace

int main(int argc, char** argv) {
  try {
    Layout layout;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw std::runtime_error("usage: adgt-mesh-check [--tp N] [--dp N] [--pp N]");
      if (a == "--tp") layout.tp = positive(a, argv[++i]);
      else if (a == "--dp") layout.dp = positive(a, argv[++i]);
      else if (a == "--pp") layout.pp = positive(a, argv[++i]);
      else throw std::runtime_error("unknown argument '" + a + "'; use --tp, --dp, --pp");
    }
    MpiEnv mpi(&argc, &argv);
    ProcessGroups pg = make_process_groups(layout);
    const EnvMap env = environment();
    const std::string device = fake_device(pg.launch, env).value_or("cpu");
    verify_device_assignment(pg, device, shared_gpu_test_mode(env));
    const std::string table = rank_table(pg, device);
    if (!table.empty()) std::fputs(table.c_str(), stdout);
    if (auto it = env.find("ADGT_MESH_CHECK_FAIL_RANK"); it != env.end() &&
                                                        it->second == std::to_string(pg.world->rank()))
      throw std::runtime_error("mesh-check: injected failure on rank " + it->second);
    for (Comm* c : {pg.world.get(), pg.tp.get(), pg.dp.get(), pg.pp.get()}) {
      std::vector<int32_t> one = {1};
      c->all_reduce(Tensor(one.data(), DType::I32, {1}));
      if (one[0] != c->size())
        throw std::runtime_error(c->name() + " group: a sum of ones gave " + std::to_string(one[0]) +
                                 ", want " + std::to_string(c->size()));
    }
    pg.world->barrier();
    if (pg.world->rank() == 0) std::printf("mesh-check: ok (%d ranks, launcher %s)\n", int(pg.layout.world()), pg.launch.launcher.c_str());
    return 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
