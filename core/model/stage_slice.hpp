// What one pipeline rank holds (docs/config.md, "Pipeline stages").
//
// The model's L blocks are cut into S = pp x virtual_stages contiguous stages;
// chunk c of pipeline rank r is stage s = c*pp + r (the looped placement), or
// with zb-v's vee placement stage r (c = 0) and 2pp-1-r (c = 1)
// (core/model/stage_map.hpp, docs/pipeline-schedules.md). Stage 0 also holds the
// token embedding, stage S-1 the final norm and lm_head. How many layers each
// stage gets (the FLOP balance, or parallel.stage_layers) is decided in
// parallel/cost/stages.hpp (stage_layer_counts); a Model only needs the
// resulting slice. Pure functions: no ranks, no communicators.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/model/stage_map.hpp"

namespace adgt {

// What one pipeline rank holds.
struct StageSlice {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // global layer range [first, end) per chunk
  bool embedding = true;  // model.embed_tokens (stage 0: chunk 0 of pp rank 0)
  bool head = true;       // model.norm and lm_head (stage S-1: chunk v-1 of pp rank pp-1, vee: of rank 0)
  int64_t num_layers() const;  // layers over all chunks
};
// The slice of pipeline rank `pp_rank` for per-stage counts `counts`
// (counts.size() == pp * virtual_stages): chunk c is stage
// stage_of(placement, pp, pp_rank, c) (core/model/stage_map.hpp; vee needs
// virtual_stages == 2). A run's placement: placement_of_schedule(parallel.schedule).
StageSlice stage_slice(const std::vector<int64_t>& counts, int pp, int virtual_stages,
                       int pp_rank, StagePlacement placement = StagePlacement::looped);
// No pipeline: one chunk [0, n_layers), embedding and head.
StageSlice whole_model(const ModelConfig& m);

}  // namespace adgt
