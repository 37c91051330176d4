// adgt-train --dry-run's prediction (dry_run.hpp).
#include "parallel/sim/dry_run.hpp"

#include <cstdio>
#include <memory>
#include <thread>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cost/flops.hpp"
#include "parallel/sim/profile.hpp"
#include "parallel/sim/step_sim.hpp"

namespace adgt::sim {

std::string dry_run_prediction(const RunConfig& cfg, const std::string& cluster_arg) {
  const int64_t world = layout_of(cfg).world();
  cluster::Cluster cl;
  if (!cluster_arg.empty()) {
    cl = cluster::load_cluster(cluster_arg);
    // A preset or one node grows (or shrinks) to the run; a file of several
    // nodes keeps its shape when it holds the run.
    if (cl.world() < world || ((cl.preset() || cl.nodes == 1) && cl.world() != world))
      cl = cluster::with_gpus(cl, world);
  } else {
    const bool gpu = cfg.train.device == "cuda" ||
                     (cfg.train.device == "auto" && cuda_backend_built() && cuda_device_count() > 0);
    if (gpu)
      return "predicted step:   (add --cluster PRESET|FILE, e.g. --cluster dgx-h100, for the "
             "simulator's step time)\n";
    // Profiling runs each distinct op a few times: only for steps small
    // enough to profile in seconds on a CPU.
    const double flops = mfu_flops_per_token(cfg.model) * double(cfg.train.global_batch) *
                         double(cfg.model.seq_len) / double(world);
    if (flops > 5e11)
      return "predicted step:   (a step of this model is too large to profile on this CPU; add "
             "--cluster PRESET|FILE, e.g. --cluster dgx-h100, for the simulator's step time)\n";
    cl = cluster::load_cluster("cpu-here");
    cl.devices_per_node = world;
    cl.cores_per_node = std::max<int64_t>(1, std::thread::hardware_concurrency());
  }
  std::unique_ptr<Backend> be;
  std::unique_ptr<OpCosts> costs;
  if (cl.cores_per_node > 0) {
    be = make_backend("cpu");
    costs = std::make_unique<ProfileCosts>(*be, "");
    // MFU against this machine's measured GEMM rate, as the trainer reports it.
    cl.device.peak_fp32_flops = cl.device.peak_bf16_flops = be->peak_tflops() * 1e12;
  } else {
    costs = std::make_unique<DeviceModelCosts>(cl.device);
  }
  const SimResult r = simulate_step(cfg, cl, *costs);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "predicted step:   %.4g s on %s (%ld x %ld %s; adgt-sim, %s): %.4g tokens/s, "
                "MFU %.1f%%, bubble %.1f%%, exposed communication %.3g s\n",
                r.step_time_s, cl.name.c_str(), long(cl.nodes), long(cl.devices_per_node),
                cl.device.name.c_str(), costs->describe().c_str(), r.tokens_per_s, 100 * r.mfu,
                100 * r.bubble, r.exposed_comm_s());
  return buf;
}

}  // namespace adgt::sim
