#include "parallel/dp/grad_norm.hpp"

#include <cmath>

#include "core/optimizer.hpp"

namespace adgt {

double global_grad_norm(Backend& be, const std::vector<ParamSpec>& table, Tensor grads, int64_t lo,
                        int64_t hi, const GradNormGroups& g) {
  // [sum over tensor-parallel shards, sum over replicated tensors, expert
  // weights (tp shards of this ep rank's experts)] of this rank's part.
  // Every segment's sum on the device, then one host read; added on the
  // host in segment order (the same sums as one sum_squares per segment).
  double s[3] = {0, 0, 0};
  const std::vector<Segment> segs = segments_in(table, lo, hi);
  std::vector<int64_t> bounds;
  for (const Segment& seg : segs) bounds.insert(bounds.end(), {seg.begin, seg.end});
  std::vector<double> sums(segs.size());
  if (!segs.empty()) {
    Buffer dev(be, sums.size() * sizeof(double));
    be.sum_squares_ranges(Tensor(dev.data(), DType::F64, {int64_t(sums.size())}), grads, bounds);
    be.to_host(sums.data(), dev.data(), sums.size() * sizeof(double));
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    const ParamSpec& p = table[segs[i].param];
    const int slot = g.ep && p.expert >= 0 ? 2 : p.shard_dim < 0 ? 1 : 0;
    s[slot] += sums[i];
  }
  if (g.chunks) g.chunks->all_reduce(Tensor(s, DType::F64, {2}));  // chunks -> whole buffer
  if (g.ep) {  // experts: pieces over their replicas, shards over tp, distinct experts over ep
    if (g.expert_chunks) g.expert_chunks->all_reduce(Tensor(s + 2, DType::F64, {1}));
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
