#include "parallel/cp/ring_schedule.hpp"

#include "kernels/check.hpp"
#include "parallel/cp/chunks.hpp"

namespace adgt::cp {

int ring_source(int rank, int P, int step) {
  ADGT_CHECK(P >= 1 && rank >= 0 && rank < P && step >= 0 && step < P,
             "ring attention: rank " << rank << " step " << step << " outside a ring of " << P);
  return ((rank - step) % P + P) % P;
}

std::vector<RingBlock> ring_step_blocks(int rank, int P, int step) {
  const std::array<int, 2> q = rank_chunks(rank, P);
  const std::array<int, 2> k = rank_chunks(ring_source(rank, P, step), P);
  std::vector<RingBlock> blocks;
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh)
      if (const std::optional<BlockMask> m = chunk_pair_mask(q[qh], k[kh]))
        blocks.push_back({qh, kh, q[qh], k[kh], *m});
  return blocks;
}

}  // namespace adgt::cp
