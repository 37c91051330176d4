// ZeRO-2/3's shards (docs/zero.md): which part of every gradient unit (a
// layer, the embedding, the final norm with the head; Model::grad_units)
// each rank of the sharding group (dp x cp) keeps. Each unit is split
// evenly, FSDP's flat parameter per unit: rank r keeps elements
// [r * per_rank, (r + 1) * per_rank) of the unit (the last ranks' pieces
// end at the unit's end, so some are short or empty), and a unit's
// gather or reduce-scatter is one collective of P equal pieces. A rank's
// shard is its pieces of all units, in flat order, each piece in a slot of
// per_rank elements.
//
// The shard's table (ZeroShards::table) names what each stretch of the
// shard holds with the model's ParamSpecs re-based onto the shard, so
// AdamW and the gradient norm run on it unchanged (weight decay, tp
// replication by name).
#pragma once
#include <cstdint>
#include <vector>

#include "core/model/model.hpp"
#include "core/model/param_table.hpp"

namespace adgt {

// A unit, or with expert parallelism one of its two segments: its dense
// weights (sharded over dp x cp) and its experts' (over the experts' replica
// group, edp x cp), each sharded on its own group.
struct ZeroUnit {
  int64_t begin = 0, end = 0;  // the unit's (segment's) flat range
  int group = 0;               // 0: the sharding group, 1: the experts' (expert weights)
  int ranks = 1;               // its group's size
  int grad_unit = 0;           // the Model::grad_units() index it belongs to
  int64_t per_rank = 0;        // slot size: ceil((end - begin) / P) rounded up to 16
  int64_t lo = 0, hi = 0;      // this rank's piece, flat: begin + r * per_rank, clamped to end
  int64_t offset = 0;          // where the piece's slot starts in the shard
};

struct ZeroShards {
  int ranks = 1, rank = 0;
  std::vector<ZeroUnit> units;  // in flat order
  std::vector<std::vector<int>> by_grad_unit;  // Model::grad_units() index -> its indices in units
  int64_t shard_size = 0;         // sum of the slots (elements)
  int64_t max_unit = 0;           // the largest per_rank * ranks (a gather's buffer)
  // The model's parameter table re-based onto the shard: one entry per
  // (parameter, piece) overlap, offset in the shard, numel the overlap.
  std::vector<ParamSpec> table;
  // The unit holding flat element `at` (index into units); -1 if none.
  int unit_of(int64_t at) const;
};

// The plan for `ranks` ranks, this one `rank`. `units` may be in any order
// (Model::grad_units' backward order); they must not overlap. With
// `expert_ranks` > 0 (expert parallelism) each unit's expert weights (a
// suffix of an MoE layer's unit) are a segment of their own, sharded over
// `expert_ranks` ranks (this one `expert_rank`).
ZeroShards plan_zero_shards(const std::vector<GradUnit>& units, const std::vector<ParamSpec>& table,
                            int ranks, int rank, int expert_ranks = 0, int expert_rank = 0);

}  // namespace adgt
