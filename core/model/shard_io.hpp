// Moves flat fp32 buffers between the global layout (whole tensors, as in a
// checkpoint: build_param_table(m)) and a tensor-parallel rank's local layout
// (build_param_table(m, tp, rank)).
#pragma once
#include <vector>

#include "core/comm.hpp"
#include "core/model/param_table.hpp"

namespace adgt {

// This rank's shards cut from whole tensors; vocabulary padding rows are zero.
std::vector<float> global_to_local(const std::vector<ParamSpec>& local,
                                   const std::vector<ParamSpec>& global,
                                   const std::vector<float>& global_flat, int64_t local_flat_n);
// Whole tensors assembled from every tp rank's shards (a collective over `tp`;
// every rank gets the result).
std::vector<float> local_to_global(const std::vector<ParamSpec>& local,
                                   const std::vector<ParamSpec>& global,
                                   const std::vector<float>& local_flat, Comm& tp);

}  // namespace adgt
