// Chunking and traffic of the ring collectives, shared by MpiComm (which runs
// them) and NcclComm (whose byte counters use the same formulas).
//
// A tensor of n elements over p ranks is cut into p contiguous chunks in rank
// order; when p does not divide n the first n % p chunks hold one element more.
// Ring neighbours: rank r sends to (r+1) % p and receives from (r-1+p) % p.
//   reduce-scatter: p-1 steps; at step s rank r sends chunk (r-s-1) mod p and
//     adds its own copy of chunk (r-s-2) mod p to what it received (received +
//     own, in that order). Chunk c is reduced once, along ranks c+1, c+2, ..., c,
//     and ends on rank c. Rank r sends n - count[r] elements.
//   all-gather: p-1 steps; at step s rank r sends chunk (r-s) mod p. Rank r
//     sends n - count[(r+1) % p] elements.
//   all-reduce = reduce-scatter then all-gather: every rank receives copies of
//     the same reduced chunks, so all ranks hold identical bits.
//   broadcast: a chain root, root+1, ..., root-1 (mod p); every rank but the
//     last of the chain sends the whole tensor once.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/comm.hpp"

namespace adgt {

struct RingChunks {
  std::vector<int64_t> count;   // (p) elements in chunk c
  std::vector<int64_t> offset;  // (p) first element of chunk c
  int64_t max_count() const { return count.empty() ? 0 : *std::max_element(count.begin(), count.end()); }
};

inline RingChunks ring_chunks(int64_t n, int p) {
  RingChunks c;
  c.count.resize(p);
  c.offset.resize(p);
  int64_t off = 0;
  for (int i = 0; i < p; ++i) {
    c.count[i] = n / p + (i < n % p ? 1 : 0);
    c.offset[i] = off;
    off += c.count[i];
  }
  return c;
}

// Elements rank r sends (multiply by the element size for bytes).
inline int64_t ring_reduce_scatter_sent(int64_t n, int p, int r) {
  return p == 1 ? 0 : n - ring_chunks(n, p).count[r];
}
inline int64_t ring_all_gather_sent(int64_t n, int p, int r) {
  return p == 1 ? 0 : n - ring_chunks(n, p).count[(r + 1) % p];
}
inline int64_t ring_all_reduce_sent(int64_t n, int p, int r) {
  return ring_reduce_scatter_sent(n, p, r) + ring_all_gather_sent(n, p, r);
}
inline int64_t chain_broadcast_sent(int64_t n, int p, int r, int root) {
  return (r + 1) % p == root ? 0 : n;  // p == 1: the root is its own successor, sends nothing
}

// Adds a call and its wall time to a communicator's stats (scope guard, shared
// by the MPI and NCCL communicators).
class Timed {
 public:
  explicit Timed(CommStats& s) : s_(s), t0_(std::chrono::steady_clock::now()) { ++s_.calls; }
  ~Timed() {
    s_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  CommStats& s_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace adgt
