// Megatron's load balance for causal context parallelism: the sequence of T
// tokens is cut into 2P chunks of c = T / (2P) tokens, and cp rank r holds
// chunks r and 2P-1-r (an early and a late chunk), so every rank has the same
// amount of causal attention work. With P = 2: rank 0 holds chunks 0 and 3,
// rank 1 chunks 1 and 2.
//
// A rank's local tensors hold its two chunks side by side along the
// sequence, per sequence of the batch: local (B, 2c, ...) = [chunk r | chunk
// 2P-1-r]. "Half" 0 is the first of the two, half 1 the second.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/comm.hpp"
#include "kernels/backend.hpp"

namespace adgt::cp {

// The two global chunks cp rank `rank` of `P` holds: {rank, 2P-1-rank}.
std::array<int, 2> rank_chunks(int rank, int P);

// Tokens per chunk: T / (2P). Throws, naming the fix, unless 2P divides T.
int64_t chunk_tokens(int64_t T, int P);
// The position in the sequence of each of cp rank `rank`'s local_T = 2c
// tokens (its two chunks side by side): the rotary positions of its model.
std::vector<int64_t> chunk_positions(int rank, int P, int64_t local_T);
// This cp rank's tokens of a micro-batch: from `full` (B sequences of T
// tokens, row-major) the rank's two chunks of each sequence, side by side
// (B x 2c): what the model of the rank takes as its inputs and targets.
void local_tokens(const int32_t* full, int32_t* local, int64_t B, int64_t T, int rank, int P);

// Packed documents under cp: for each of this rank's local tokens (`local`,
// B x local_T, its two chunks of each sequence) the position in the whole
// sequence where its document begins (core/model/document_starts.hpp's rule
// over the whole sequences). Collective over `cp`: an all-gather of the local tokens (a
// document may begin in another rank's chunk).
std::vector<int32_t> document_starts(Comm& cp, const int32_t* local, int64_t B, int64_t local_T,
                                     int32_t eos);

// The mask of query chunk qc against key chunk kc under causal attention:
// causal on the diagonal (qc == kc), full for an earlier key chunk (kc < qc),
// none (the block is skipped) for a later one.
std::optional<BlockMask> chunk_pair_mask(int qc, int kc);

}  // namespace adgt::cp
