// The global gradient norm over every rank's part of the model: tensor-parallel
// shards summed over tp, a replicated tensor counted once, ZeRO-1 chunks summed
// over dp, distinct experts over ep, pipeline stages over pp.
#pragma once
#include <cstdint>
#include <vector>

#include "core/comm.hpp"
#include "core/model/param_table.hpp"
#include "kernels/backend.hpp"

namespace adgt {

struct GradNormGroups {
  Comm* tp = nullptr;      // shards of one tensor (nullptr: a group of one)
  Comm* chunks = nullptr;  // ZeRO-1: the dp group whose ranks hold disjoint chunks; else nullptr
  Comm* ep = nullptr;      // expert parallelism: distinct experts (nullptr: none)
  // ZeRO-2/3 with expert parallelism: the experts' replica group, whose ranks
  // hold disjoint pieces of the expert weights (nullptr: none).
  Comm* expert_chunks = nullptr;
  Comm* pp = nullptr;      // pipeline stages (nullptr: one stage)
};

// sqrt of the sum of squares of grads[lo, hi) (flat buffer of `table`), summed
// over the groups as above. Collective over the groups given; the same value
// (bit for bit) on every rank.
double global_grad_norm(Backend& be, const std::vector<ParamSpec>& table, Tensor grads, int64_t lo,
                        int64_t hi, const GradNormGroups& g);

}  // namespace adgt
