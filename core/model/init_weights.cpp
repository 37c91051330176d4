#include "core/model/init_weights.hpp"

#include <algorithm>
#include <numeric>

#include "core/rng.hpp"
#include "kernels/check.hpp"

namespace adgt {

void draw_init_weights(const std::vector<ParamSpec>& table, double init_std, uint64_t seed,
                       float* out, int64_t n) {
  const size_t nt = table.size();
  // Each tensor's region runs to the next tensor's offset (its alignment gap
  // included) or to n; the gap before the first tensor is zeroed here.
  std::vector<size_t> by_offset(nt);
  std::iota(by_offset.begin(), by_offset.end(), size_t(0));
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return table[a].offset < table[b].offset; });
  std::vector<int64_t> end(nt);
  for (size_t k = 0; k < nt; ++k) {
    const ParamSpec& p = table[by_offset[k]];
    end[by_offset[k]] = k + 1 < nt ? table[by_offset[k + 1]].offset : n;
    ADGT_CHECK(p.offset >= 0 && p.offset + p.numel <= end[by_offset[k]],
               "draw_init_weights: " << p.name << " [" << p.offset << ", " << p.offset + p.numel
                                     << ") overlaps the next tensor or passes " << n);
    // The shard inside the global tensor (checked here: nothing may throw
    // inside the parallel loop below).
    if (p.shape.size() == 2) {
      const int64_t rows = p.global_shape[0], cols = p.global_shape[1];
      const bool ok =
          p.shard_dim < 0    ? p.numel == rows * cols
          : p.shard_dim == 0 ? p.shard_start + p.shard_valid <= rows &&
                                   p.shard_valid * cols <= p.numel && p.shape[1] == cols
                             : p.shard_start + p.shape[1] <= cols && p.shape[0] == rows;
      ADGT_CHECK(ok, "draw_init_weights: " << p.name << ": shard (dim " << p.shard_dim << ", start "
                                           << p.shard_start << ") outside the global tensor");
    }
  }
  std::fill(out, out + (nt ? table[by_offset[0]].offset : n), 0.0f);
  // Largest streams first (a 7B model's embedding and head are 131M draws
  // each, one thread's): the tail of the parallel loop is the shortest.
  std::vector<size_t> order(nt);
  std::iota(order.begin(), order.end(), size_t(0));
  auto draws = [&](size_t i) {
    const ParamSpec& p = table[i];
    return p.shape.size() == 1 ? int64_t(0) : p.global_shape[0] * p.global_shape[1];
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return draws(a) > draws(b); });
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < nt; ++k) {
    const ParamSpec& p = table[order[k]];
    float* dst = out + p.offset;
    int64_t written = p.numel;
    if (p.shape.size() == 1) {  // RMSNorm weights
      std::fill(dst, dst + p.numel, 1.0f);
    } else {
      const int64_t rows = p.global_shape[0], cols = p.global_shape[1];
      Rng rng(seed ^ hash_string(p.name));
      auto draw = [&] { return float(init_std * rng.normal()); };
      if (p.shard_dim < 0) {
        for (int64_t i = 0; i < rows * cols; ++i) dst[i] = draw();
        written = rows * cols;
      } else if (p.shard_dim == 0) {  // rows [start, start + valid); padding rows stay 0
        for (int64_t i = 0; i < p.shard_start * cols; ++i) (void)rng.normal();
        for (int64_t i = 0; i < p.shard_valid * cols; ++i) dst[i] = draw();
        written = p.shard_valid * cols;
      } else {  // columns [start, start + local cols) of every row
        const int64_t lc = p.shape[1], s = p.shard_start;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < s; ++c) (void)rng.normal();
          for (int64_t c = 0; c < lc; ++c) dst[r * lc + c] = draw();
          for (int64_t c = s + lc; c < cols; ++c) (void)rng.normal();
        }
        written = rows * lc;
      }
    }
    std::fill(dst + written, out + end[order[k]], 0.0f);
  }
}

}  // namespace adgt
