#include "parallel/cp/chunks.hpp"

#include <algorithm>

#include "core/model/document_starts.hpp"
#include "kernels/check.hpp"

namespace adgt::cp {

std::array<int, 2> rank_chunks(int rank, int P) {
  ADGT_CHECK(P >= 1 && rank >= 0 && rank < P,
             "context parallelism: rank " << rank << " outside 0.." << P - 1);
  return {rank, 2 * P - 1 - rank};
}

int64_t chunk_tokens(int64_t T, int P) {
  ADGT_CHECK(P >= 1 && T > 0 && T % (2 * P) == 0,
             "context parallelism: cp=" << P << " splits the sequence into 2*cp=" << 2 * P
                                        << " chunks, which must divide seq_len=" << T
                                        << "; use a seq_len that is a multiple of " << 2 * P);
  return T / (2 * P);
}

std::vector<int64_t> chunk_positions(int rank, int P, int64_t local_T) {
  const int64_t c = chunk_tokens(local_T * P, P);
  const std::array<int, 2> ch = rank_chunks(rank, P);
  std::vector<int64_t> pos(static_cast<size_t>(local_T));
  for (int64_t t = 0; t < local_T; ++t) pos[size_t(t)] = ch[size_t(t / c)] * c + t % c;
  return pos;
}

void local_tokens(const int32_t* full, int32_t* local, int64_t B, int64_t T, int rank, int P) {
  const int64_t c = chunk_tokens(T, P);
  const std::array<int, 2> ch = rank_chunks(rank, P);
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      std::copy_n(full + b * T + ch[size_t(h)] * c, c, local + b * 2 * c + h * c);
}

namespace {
// local_tokens' inverse for one rank: its two chunks of each sequence back
// into `full` (B x T).
void local_chunks_to_full(const int32_t* local, int32_t* full, int64_t B, int64_t T, int rank, int P) {
  const int64_t c = chunk_tokens(T, P);
  const std::array<int, 2> ch = rank_chunks(rank, P);
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      std::copy_n(local + b * 2 * c + h * c, c, full + b * T + ch[size_t(h)] * c);
}
}  // namespace

std::vector<int32_t> document_starts(Comm& cp, const int32_t* local, int64_t B, int64_t local_T,
                                     int32_t eos) {
  const int P = cp.size();
  const int64_t n = B * local_T, T = local_T * P;
  std::vector<int32_t> all(size_t(P * n)), full(size_t(B * T));
  cp.all_gather(Tensor(all.data(), DType::I32, {P * n}),
                Tensor(const_cast<int32_t*>(local), DType::I32, {n}));
  for (int i = 0; i < P; ++i)  // rank i's tokens back into the whole sequences
    local_chunks_to_full(all.data() + i * n, full.data(), B, T, i, P);
  std::vector<int32_t> start(full.size());
  sequence_document_starts(full.data(), B, T, eos, start.data());
  std::vector<int32_t> mine(static_cast<size_t>(n));
  local_tokens(start.data(), mine.data(), B, T, cp.rank(), P);
  return mine;
}

std::optional<BlockMask> chunk_pair_mask(int qc, int kc) {
  if (kc == qc) return BlockMask::causal;
  if (kc < qc) return BlockMask::full;
  return std::nullopt;
}

}  // namespace adgt::cp
