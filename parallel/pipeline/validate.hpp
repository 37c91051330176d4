// The schedule validator: a list that passes runs to the end on every rank.
//
// Communication semantics: buffered sends, blocking receives. A Send
// completes at once without the receiver (the executor posts it as MPI_Isend
// / a non-blocking NCCL send and waits for it later, before reusing the
// buffer and at the latest at WaitSends); a Recv blocks its rank until the
// matching message is there. This is what pipeline executors do in practice
// (Megatron's batched isend/irecv); with rendezvous (synchronous) sends a
// 1F1B list with a Send right after each compute would deadlock in the steady
// state, where neighbours send to each other at the same time. How many sends
// a rank has outstanding at once is time_schedule()'s max_outstanding_sends.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "parallel/pipeline/instruction.hpp"

namespace adgt::pp {

constexpr std::int64_t kNoMemoryLimit = std::numeric_limits<std::int64_t>::max();

// Throws ScheduleError naming the rank and instruction index (#i, 0-based
// position in the rank's list) of the first violation, checked in this order:
//  1. shape: pp ranks; micro-batch, chunk and peer in range; a Send/Recv only
//     where the stage has that neighbour and with the neighbour's rank as
//     peer; exactly one WaitSends per rank, last; ReduceGrads with a chunk
//     in range and micro-batch and peer -1;
//  2. matching: every Send has exactly one matching Recv on its peer (same
//     kind and micro-batch, adjacent stage) and every Recv one Send;
//  3. completeness: per rank, chunk and micro-batch exactly one Forward and
//     either one Backward or one BackwardInput and one BackwardWeight, and the
//     Send/Recv each of them needs; ReduceGrads either on no chunk or exactly
//     once on every chunk of the rank;
//  4. order on each rank: RecvAct before its Forward, Forward before its
//     SendAct and its backward, RecvGrad before its backward, the backward
//     before its SendGrad, BackwardInput before BackwardWeight, every weight
//     gradient (Backward or BackwardWeight) of a chunk before its
//     ReduceGrads; and at most
//     max_inflight activations in flight (Forward done, BackwardInput or
//     Backward not yet), counted in (micro-batch, chunk) units;
//  5. progress: the lists are run together (buffered sends, blocking
//     receives); if some ranks can go no further, the error is "deadlock:
//     rank 0 waits at #3 RecvGrad(mb 0, chunk 0) from rank 1, which waits at
//     #2 RecvAct(mb 1, chunk 0) from rank 0: a cycle", naming the first stuck
//     instruction of every stuck rank; data dependencies across ranks
//     (F(mb, s) after F(mb, s-1), B(mb, s) after B(mb, s+1)) are checked as
//     the lists run.
void validate(const Schedule& s, std::int64_t max_inflight = kNoMemoryLimit);

// Per rank, the most activations in flight at once (as in check 4).
std::vector<std::int64_t> peak_inflight(const Schedule& s);

// Per rank and chunk, the most micro-batches whose activations the executor
// holds at once: from a micro-batch's RecvAct or Forward to its Backward, or
// to its BackwardWeight when the backward is split (the weight gradient needs
// the layer inputs). What the memory estimate counts (parallel/cost/memory.hpp).
std::vector<std::vector<std::int64_t>> held_activations(const Schedule& s);
// The most a rank holds over all its chunks (the maximum over ranks).
std::int64_t max_held_activations(const Schedule& s);

}  // namespace adgt::pp
