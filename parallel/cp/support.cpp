// What context parallelism does not run yet (support.hpp).
#include "parallel/cp/support.hpp"

namespace adgt {

std::string context_parallel_unsupported(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.cp <= 1) return "";
  const std::string cp = "parallel.cp=" + std::to_string(p.cp);
  const std::string see = " (docs/context-parallel.md, \"What remains\")";
  if (cfg.train.device == "cuda")
    return cp + " on train.device=cuda: the ring's block kernels have run in the CUDA emulation "
                "only, and its sends over NCCL are not paired yet (nor has all-to-all run on a "
                "GPU)" + see +
           "; use train.device: cpu or emulated";
  return "";
}

}  // namespace adgt
