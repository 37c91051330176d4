// The blocks of the ring: which rank's K/V a cp rank holds at each step and
// which (query half, key half) blocks it computes with them, with which mask
// (chunks.hpp's load balance and mask rule). Pure functions of (rank, P,
// step); ring_attention.cpp runs them.
//
// Step s = 0..P-1: rank r holds the K/V of rank src = (r - s) mod P, i.e.
// key chunks {src, 2P-1-src}; its queries are chunks {r, 2P-1-r}. What it
// computes follows from the mask rule alone:
//   s = 0 (src = r):  q0 x k0 causal, q1 x k0 full, q1 x k1 causal;
//   src < r:          q0 x k0 full,   q1 x k0 full   (all queries, early keys);
//   src > r:          q1 x k0 full,   q1 x k1 full   (late queries, all keys).
// Every step after the first is two c x c full blocks on every rank: the
// load is the same on all ranks at every step.
#pragma once
#include <vector>

#include "kernels/backend.hpp"

namespace adgt::cp {

// The rank whose K/V rank `rank` holds at step `step`: (rank - step) mod P.
int ring_source(int rank, int P, int step);

struct RingBlock {
  int q_half = 0, k_half = 0;    // 0: the first chunk of the local pair, 1: the second
  int q_chunk = 0, k_chunk = 0;  // the global chunks
  BlockMask mask = BlockMask::full;
};

// The blocks of `rank` at `step`, in (q_half, k_half) order.
std::vector<RingBlock> ring_step_blocks(int rank, int P, int step);

}  // namespace adgt::cp
