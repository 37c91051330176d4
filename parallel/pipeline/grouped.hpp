// The schedule under NCCL's point-to-point semantics (NcclComm), beside the
// validator's buffered sends (validate.hpp).
//
// NcclComm queues a Send; the next Recv issues the queued sends and itself
// as one group (ncclGroupStart/End), and WaitSends issues what is left as a
// group of its own. Groups run in issue order on the communicator's one
// stream. A send and its receive complete only together (rendezvous: both
// must be in groups that are running), and a group ends when all of its
// operations have. Messages between two ranks match by order, not by tag:
// the n-th send from rank a to rank b is the n-th receive on b from a.
//
// A schedule that passes validate() can still hang or swap messages under
// these rules; validate_grouped() says whether it can run on NCCL. The
// pipeline executor checks it when its group's sends go to NCCL.
#pragma once

#include "parallel/pipeline/instruction.hpp"

namespace adgt::pp {

// Throws ScheduleError when s cannot run with grouped rendezvous sends:
//  - order: "NCCL matches messages by order: rank 0's send #2 to rank 1 is
//    SendAct(mb 2, chunk 0) (#9), but rank 1's receive #2 from rank 0 is
//    RecvAct(mb 1, chunk 1) (#12)";
//  - progress: "deadlock with grouped rendezvous sends (NCCL): rank 0's
//    group at #5 waits for ... on rank 1, whose running group is at #3".
// Assumes s passed validate() (shape and matching).
void validate_grouped(const Schedule& s);

// The same schedule with each rank's receives moved earlier, so that every
// rank's sends and receives follow one global order of the messages: the
// order in which the buffered-send run of validate() makes the sends. Then
// the first message not yet done always has both ends at the head of their
// ranks' streams, groups or not, and validate_grouped() passes. A receive
// moves to just before the first send (on its rank) that was made after its
// message; receives keep that order among themselves; computes and sends do
// not move. Under buffered sends the result runs like s (the same trace).
// Assumes s passed validate().
Schedule for_rendezvous(const Schedule& s);

}  // namespace adgt::pp
