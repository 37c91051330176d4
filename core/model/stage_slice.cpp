// The stage -> rank mapping of pipeline parallelism (core/model/stage_slice.hpp);
// the layer counts come from parallel/cost/stages.hpp.
#include "core/model/stage_slice.hpp"

#include "core/model/stage_map.hpp"

#include <stdexcept>
#include <string>

namespace adgt {

int64_t StageSlice::num_layers() const {
  int64_t n = 0;
  for (const auto& [first, end] : chunks) n += end - first;
  return n;
}

StageSlice stage_slice(const std::vector<int64_t>& counts, int pp, int virtual_stages,
                       int pp_rank, StagePlacement placement) {
  if (pp < 1 || virtual_stages < 1 || pp_rank < 0 || pp_rank >= pp ||
      counts.size() != size_t(pp) * size_t(virtual_stages))
    throw std::invalid_argument("stage_slice: need 0 <= pp_rank < pp and pp x virtual_stages "
                                "counts; got pp=" + std::to_string(pp) + " virtual_stages=" +
                                std::to_string(virtual_stages) + " pp_rank=" +
                                std::to_string(pp_rank) + " and " +
                                std::to_string(counts.size()) + " counts");
  if (placement == StagePlacement::vee && virtual_stages != 2)
    throw std::invalid_argument("stage_slice: the vee placement holds 2 chunks per rank, not " +
                                std::to_string(virtual_stages));
  std::vector<int64_t> first(counts.size() + 1, 0);  // first layer of each stage
  for (size_t s = 0; s < counts.size(); ++s) first[s + 1] = first[s] + counts[s];
  StageSlice out;
  for (int c = 0; c < virtual_stages; ++c) {
    const size_t s = size_t(stage_of(placement, pp, pp_rank, c));
    out.chunks.emplace_back(first[s], first[s + 1]);
  }
  const int S = pp * virtual_stages;
  out.embedding = rank_of_stage(placement, pp, 0) == pp_rank;
  out.head = rank_of_stage(placement, pp, S - 1) == pp_rank;  // its last chunk (both placements)
  return out;
}

StageSlice whole_model(const ModelConfig& m) {
  StageSlice out;
  out.chunks.emplace_back(0, m.n_layers);
  return out;
}

}  // namespace adgt
