// What context parallelism does not run yet (support.hpp).
#include "parallel/cp/support.hpp"

namespace adgt {

std::string context_parallel_unsupported(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.cp <= 1) return "";
  const std::string cp = "parallel.cp=" + std::to_string(p.cp);
  const std::string see = " (docs/context-parallel.md, \"What remains\")";
  const int64_t T = cfg.model.seq_len, seg = cfg.model.moe_capacity_segment;
  if (cfg.model.n_experts > 0 && cfg.model.moe_capacity_factor > 0 && T % (2 * p.cp) == 0 &&
      (seg <= 0 || (T / (2 * p.cp)) % seg != 0)) {
    const int64_t c = T / (2 * p.cp);
    return cp + " with model.moe_capacity_factor=" + fmt_real(cfg.model.moe_capacity_factor) +
           " and model.moe_capacity_segment=" + std::to_string(seg) +
           ": an expert's capacity is counted over groups of tokens in order, and cp splits each "
           "sequence into chunks of seq_len / (2 x cp) = " + std::to_string(c) +
           " tokens held by different ranks; set model.moe_capacity_segment to a divisor of " +
           std::to_string(c) + " (e.g. " + std::to_string(c) +
           ": every group inside one chunk, the same groups in every layout; docs/moe.md)"
           ", or use a dropless model (moe_capacity_factor: 0)";
  }
  if (cfg.train.device == "cuda")
    return cp + " on train.device=cuda: the ring's block kernels have run in the CUDA emulation "
                "only, and its sends over NCCL are not paired yet (nor has all-to-all run on a "
                "GPU)" + see +
           "; use train.device: cpu or emulated";
  return "";
}

}  // namespace adgt
