// Ring attention: causal grouped-query attention over a sequence split over
// the P ranks of the cp group, with Megatron's load balance (chunks.hpp: rank
// r holds chunks r and 2P-1-r of c tokens each). The K/V blocks travel around
// the ring while each rank computes on the one in hand, with the backend's
// blockwise ops (Backend::attention_block_forward, attention_merge,
// attention_block_backward). The numbers are those of attention_forward /
// attention_backward on the whole sequence up to the summation order.
//
// Shapes on each rank (local tensors hold the rank's two chunks side by side,
// chunks.hpp): q, out, dq, dout (B, 2c, H, hd); k, v, dk, dv (B, 2c, KV, hd);
// lse (2, B, H, c) in the statistics dtype (f32 for bf16 and f32, f64 for
// f64): per local chunk the log-sum-exp of its rows, written by the forward
// and read by the backward. All in the backend's memory. Only the KV heads
// travel (grouped-query attention sends H/KV times less than the queries).
//
// The schedule (r = this rank, src = (r - s) mod P: whose K/V is in hand at
// step s; ring_schedule.hpp lists the blocks of each step and their masks).
// K/V travel as one buffer: k's two chunks, then v's, each (B, c, KV, hd).
//
// Each step's messages go through one Comm::start_exchange (core/comm.hpp:
// on MPI the isends at once and the receives in wait(); on NCCL one group
// on the communication stream beside the step's compute). NCCL matches the
// messages between two ranks by order, so both sides keep one order: r-1's
// accumulator of its step s-1, then its K/V of step s.
// Forward, steps s = 0..P-1:
//   1. s < P-1: start the exchange: the K/V in hand to r+1 (tag kTagKv), the
//      next from r-1, so the transfer runs while this rank computes;
//   2. every block of ring_step_blocks(r, P, s): attention_block_forward of
//      the query chunk against the key chunk; the first block of a query
//      chunk (at s = 0) writes its (out, lse), every later one is merged in
//      with attention_merge;
//   3. s < P-1: wait for the exchange (the next K/V in the other buffer;
//      the buffer sent is refilled at the next step), swap the buffers.
// Backward, with the final out and lse of the forward. The dK/dV of a K/V
// block travel as an accumulator that each rank holding the block adds its
// blocks' dK/dV to, and that reaches the block's owner last; every transfer
// is timed to travel while the receiver computes:
//   step 0 (own K/V): exchange: them to r+1 (tag kTagKv), the next K/V from
//      r-1; the step's full block (q1 x k0) runs, its dK/dV kept in `own`;
//      wait.
//   steps s = 1..P-1 (the K/V of src = r-s): exchange: s < P-1 the K/V in
//      hand to r+1; from r-1, s > 1 src's accumulator (sent at the end of
//      r-1's step s-1) and s < P-1 the next K/V; the step's blocks run into
//      `mine`; wait (this step's K/V, the previous step's accumulator); the
//      accumulator = (s = 1: mine, else received + mine); isend it to r+1
//      (tag kTagDkv; on NCCL it leaves with the next exchange) — at s = P-1
//      that is src's owner: the way home.
//   then: exchange: r-1's last accumulator (this rank's K/V's) home; the own
//      K/V's two causal blocks run into `own` meanwhile; wait; own += it.
// dq accumulates in place over all blocks (the first computed block of a
// query chunk overwrites). So the dK/dV of a K/V block are summed as
// ((own full block + ranks src+1, ..., src+P-1 in order) + own causal
// blocks), the same on every run. Of the 2(P-1) transfers of the backward
// (P-1 K/V, P-1 accumulators), none waits on the compute's critical path
// when one block's compute takes at least one transfer (the overlap benchmark: scripts/bench_cp_overlap.py).
// Packed documents (RingShape::doc_start): a full block none of whose query
// rows sees a key of its key chunk (every row's document begins after the
// chunk) is skipped in both passes: its rows would be out 0 and lse -inf,
// which the merge leaves as they are, and its dK/dV 0. The K/V still travel
// (the next rank may need them). Diagonal (causal) blocks always run, so
// every query chunk has a computed block.
// The skip is decided from each query chunk's earliest document start,
// read to the host once per call (2 B c int32).
// Traffic per rank: P-1 K/V messages in each pass and P-1 dK/dV messages
// in the backward, each 4 B c KV hd elements. Deadlock-free: every rank
// posts the receives of a step before it waits for its sends.
#pragma once
#include <cstdint>

#include "core/comm.hpp"
#include "kernels/backend.hpp"

namespace adgt::cp {

constexpr int kTagKv = 1;   // K/V blocks
constexpr int kTagDkv = 2;  // dK/dV accumulators

struct RingShape {
  int64_t B = 0;      // sequences
  int64_t chunk = 0;  // tokens per chunk c = T / (2P) (chunk_tokens)
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // Packed documents: int32 (B, 2c) in the backend's memory, each local
  // token's document start as a position in the whole sequence (the model's
  // documents under cp, core/model/documents.cpp); every block then masks
  // keys before the query's document (AttentionBlock::q_doc_start, with the
  // key chunk's position). nullptr: plain causal.
  const int32_t* doc_start = nullptr;
};

// Elements of lse: 2 B H c.
int64_t ring_lse_elems(const RingShape& s);

// out and lse overwritten. Returns the blocks skipped on this rank (packed
// documents: see the top of this file).
int ring_attention_forward(Backend& be, Comm& cp, Tensor out, Tensor lse, const Tensor& q,
                           const Tensor& k, const Tensor& v, const RingShape& s);

// dq, dk, dv overwritten; out and lse are the forward's. Returns the blocks
// skipped on this rank (the forward's).
int ring_attention_backward(Backend& be, Comm& cp, Tensor dq, Tensor dk, Tensor dv,
                            const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, const Tensor& lse, const RingShape& s);

}  // namespace adgt::cp
