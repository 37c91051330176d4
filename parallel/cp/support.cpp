// What context parallelism does not run yet (support.hpp).
#include "parallel/cp/support.hpp"

namespace adgt {

std::string context_parallel_unsupported(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.cp <= 1) return "";
  const std::string cp = "parallel.cp=" + std::to_string(p.cp);
  const std::string see = " (docs/context-parallel.md, \"What remains\")";
  // On CUDA the ring's block kernels mask causally only: packed documents
  // run there in all-to-all mode (the flash kernels mask documents).
  if (cfg.train.device == "cuda" && cfg.train.document_mask && p.cp_mode != "all-to-all")
    return cp + " (cp_mode " + p.cp_mode + ") with train.document_mask on train.device=cuda: "
                "the ring's CUDA block kernels do not mask documents yet" + see +
           "; use parallel.cp_mode: all-to-all, or train.device: cpu or emulated";
  return "";
}

}  // namespace adgt
