#include "core/model/shard_io.hpp"

#include <algorithm>

#include "kernels/check.hpp"

namespace adgt {

namespace {
// Copies between a shard (local layout) and its place in the whole tensor.
template <bool kToGlobal>
void move_shard(const ParamSpec& l, const ParamSpec& g, const float* src, float* dst) {
  if (l.shard_dim < 0) {
    std::copy(src, src + g.numel, dst);
    return;
  }
  const int64_t cols = g.global_shape.size() > 1 ? g.global_shape[1] : 1;
  if (l.shard_dim == 0) {
    const int64_t n = l.shard_valid * cols;
    if (kToGlobal)
      std::copy(src, src + n, dst + l.shard_start * cols);
    else
      std::copy(src + l.shard_start * cols, src + l.shard_start * cols + n, dst);
    return;
  }
  const int64_t rows = g.global_shape[0], lc = l.shape[1];
  for (int64_t i = 0; i < rows; ++i) {
    if (kToGlobal)
      std::copy(src + i * lc, src + (i + 1) * lc, dst + i * cols + l.shard_start);
    else
      std::copy(src + i * cols + l.shard_start, src + i * cols + l.shard_start + lc, dst + i * lc);
  }
}
}  // namespace

std::vector<float> global_to_local(const std::vector<ParamSpec>& local,
                                   const std::vector<ParamSpec>& global,
                                   const std::vector<float>& gflat, int64_t local_n) {
  ADGT_CHECK(local.size() == global.size(), "global_to_local: table sizes differ");
  std::vector<float> out(size_t(local_n), 0.0f);
  for (size_t i = 0; i < local.size(); ++i)
    move_shard<false>(local[i], global[i], gflat.data() + global[i].offset,
                      out.data() + local[i].offset);
  return out;
}

std::vector<float> local_to_global(const std::vector<ParamSpec>& local,
                                   const std::vector<ParamSpec>& global,
                                   const std::vector<float>& lflat, Comm& tp) {
  ADGT_CHECK(local.size() == global.size(), "local_to_global: table sizes differ");
  std::vector<float> out(size_t(total_numel(global)), 0.0f);
  std::vector<float> all, mine;
  for (size_t i = 0; i < local.size(); ++i) {
    const ParamSpec& l = local[i];
    const float* src = lflat.data() + l.offset;
    if (l.shard_dim < 0) {
      std::copy(src, src + l.numel, out.data() + global[i].offset);
      continue;
    }
    mine.assign(src, src + l.numel);
    all.resize(size_t(l.numel) * size_t(tp.size()));
    tp.all_gather(Tensor(all.data(), DType::F32, {int64_t(all.size())}),
                  Tensor(mine.data(), DType::F32, {l.numel}));
    // Rank r's shard has the same shape with shard_start = r * (its extent).
    for (int r = 0; r < tp.size(); ++r) {
      ParamSpec lr = l;
      const int64_t extent = l.shape[size_t(l.shard_dim)];
      lr.shard_start = r * extent;
      lr.shard_valid = std::clamp<int64_t>(l.global_shape[size_t(l.shard_dim)] - lr.shard_start,
                                           0, extent);
      move_shard<true>(lr, global[i], all.data() + size_t(r) * size_t(l.numel),
                       out.data() + global[i].offset);
    }
  }
  return out;
}

}  // namespace adgt
