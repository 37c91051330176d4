// The initial weights of a parameter table, drawn on the host (Model::init_weights).
//
// Every matrix's values are the draws of its own stream (Rng seeded with
// seed ^ hash of its name) over the whole global tensor in row-major order,
// times init_std, rounded to float; a rank keeps its shard (rows or columns)
// of them, so any tensor-parallel, pipeline or expert-parallel layout holds
// the values of the single process. RMSNorm weights are 1; padding (vocab
// rows past the valid ones, the 16-element alignment gaps) is 0.
#pragma once
#include <cstdint>
#include <vector>

#include "core/model/param_table.hpp"

namespace adgt {

// Writes all n elements of out (n >= total_numel(table); past the last
// tensor: 0). Tensors in parallel (OpenMP), largest first, each drawn
// straight into its region: no zero-filled staging buffer, no per-tensor
// copy of the global tensor, and a row-sharded tensor stops drawing after
// its last row. The values do not depend on the thread count.
void draw_init_weights(const std::vector<ParamSpec>& table, double init_std, uint64_t seed,
                       float* out, int64_t n);

}  // namespace adgt
