#include "parallel/dp/grad_norm.hpp"

#include <cmath>

#include "core/optimizer.hpp"

namespace adgt {

double global_grad_norm(Backend& be, const std::vector<ParamSpec>& table, Tensor grads, int64_t lo,
                        int64_t hi, const GradNormGroups& g) {
  // [sum over tensor-parallel shards, sum over replicated tensors, expert
  // weights (tp shards of this ep rank's experts)] of this rank's part.
  double s[3] = {0, 0, 0};
  const size_t es = dtype_size(grads.dtype);
  for (const Segment& seg : segments_in(table, lo, hi)) {
    const ParamSpec& p = table[seg.param];
    const int slot = g.ep && p.expert >= 0 ? 2 : p.shard_dim < 0 ? 1 : 0;
    s[slot] += be.sum_squares(Tensor(static_cast<char*>(grads.data) + size_t(seg.begin) * es,
                                     grads.dtype, {seg.end - seg.begin}));
  }
  if (g.chunks) g.chunks->all_reduce(Tensor(s, DType::F64, {2}));  // chunks -> whole buffer
  if (g.ep) {  // experts: shards over tp, distinct experts over ep
    if (g.tp) g.tp->all_reduce(Tensor(s + 2, DType::F64, {1}));
    g.ep->all_reduce(Tensor(s + 2, DType::F64, {1}));
    s[1] += s[2];
  }
  if (g.tp) g.tp->all_reduce(Tensor(s, DType::F64, {1}));  // shards -> whole tensors
  if (g.pp && g.pp->size() > 1) {  // stages -> the whole model
    double total[1] = {s[0] + s[1]};
    g.pp->all_reduce(Tensor(total, DType::F64, {1}));
    return std::sqrt(total[0]);
  }
  return std::sqrt(s[0] + s[1]);
}

}  // namespace adgt
