// The data-parallel gradient buckets: fixed flat ranges of the gradient
// buffer, each with an id, reduced as one collective once every gradient in it
// is final (Megatron-Core's param-and-grad buffer buckets). The plan is a pure
// function of the model's gradient units (Model::grad_units), so every rank of
// a data-parallel group makes the same buckets in the same order and starts
// their collectives in that order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "core/model/param_table.hpp"

namespace adgt {

enum class BucketOp : uint8_t {
  AllReduce,      // every rank gets the whole sum
  ReduceScatter,  // ZeRO-1: rank d keeps chunk d of the flat buffer, summed
};

// Which group reduces a bucket: the data-parallel group, or for expert
// weights under expert parallelism the expert-data-parallel group (the dp
// ranks that hold the same experts).
enum class BucketGroup : uint8_t { DataParallel, ExpertDataParallel };

struct GradBucket {
  int id = 0;              // position in the plan: the order collectives start in
  int chunk = 0;           // the model chunk its gradients belong to; -1: every chunk
  int64_t begin = 0, end = 0;  // flat range of the gradient buffer
  int64_t need = 0;        // elements of gradient units inside: it is ready when all are final
  BucketOp op = BucketOp::AllReduce;
  BucketGroup group = BucketGroup::DataParallel;
};

struct BucketPlanInput {
  std::vector<GradUnit> units;     // Model::grad_units(): the backward's completion order
  std::vector<ParamSpec> table;    // Model::table(): expert flags and offsets
  int64_t flat_size = 0;           // Model::flat_size()
  int64_t bucket_elems = 1024;     // a bucket closes once it holds at least this many
  bool zero = false;               // ZeRO-1: one reduce-scatter bucket of the whole buffer
  bool expert_groups = false;      // expert parallelism: expert weights reduce over edp
  bool reduce_dp = true;           // the dp group has more than one rank
  bool reduce_edp = true;          // the edp group has more than one rank
};

// The buckets, in start order:
//  - ZeRO-1: one ReduceScatter bucket [0, flat_size) over dp, chunk -1.
//  - Otherwise, walking the units in completion order, a bucket grows by the
//    next unit while that unit is of the same chunk and ends where the bucket
//    begins (the backward runs from the end of the buffer to its start), and
//    closes once it holds at least bucket_elems elements (or at a gap).
//    With expert_groups each bucket is then cut where the table switches
//    between expert and non-expert weights; the expert pieces reduce over edp.
//  - A bucket whose group has one rank (reduce_dp / reduce_edp false) is left
//    out. Ids number the buckets kept, from 0.
std::vector<GradBucket> plan_grad_buckets(const BucketPlanInput& in);

}  // namespace adgt
