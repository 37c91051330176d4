// The pipeline-schedule IR: what each pipeline rank does, in order.
//
// A schedule is data (ARCHITECTURE.md): a generator (generators.hpp) writes
// one ordered list of instructions per pipeline rank, the validator
// (validate.hpp) checks it, the timeline (timeline.hpp) predicts its
// timeline, the printer (print.hpp) draws it, and one executor runs it.
//
// Stages and chunks. The model's layers are cut into S = pp * v consecutive
// stages (v = virtual_stages). Rank r holds chunks c = 0..v-1; chunk c of
// rank r is model stage
//
//     s = c * pp + r                       (rank = s % pp, chunk = s / pp)
//
// so with v = 1 rank r holds stage r, and with v = 2, pp = 4 rank 1 holds
// stages 1 and 5. That is the looped placement; the vee placement (ZB-V,
// v = 2) puts chunk 1 of rank r on stage 2pp-1-r instead
// (core/model/stage_map.hpp): Schedule::stage() and rank_of_stage() know
// which. Under vee rank pp-1 holds stages pp-1 and pp: the Send/Recv pair
// between them names the rank itself as its peer, and the executor hands
// the tensor over in memory. Stage 0 holds the embedding, stage S-1 the final norm, the
// head and the loss. A micro-batch's forward runs stages 0, 1, ..., S-1; its
// backward S-1, ..., 0.
//
// Communication. Activations go from stage s to s+1, gradients from s+1 to s.
// A Send/Recv names the chunk of the stage *on this rank* that produced
// (Send) or will consume (Recv) the tensor, and the peer rank that holds the
// adjacent stage. So SendAct(mb, chunk c) on rank r (stage s, looped:
// s = c*pp + r) matches RecvAct(mb, chunk c') on the rank holding stage s+1
// as its chunk c' (looped: rank (s+1) % pp, c' = (s+1) / pp), and SendGrad
// at stage s matches RecvGrad at stage s-1. Sends are buffered
// (non-blocking, completing without the receiver), receives block: see
// validate.hpp and docs/pipeline-schedules.md.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model/stage_map.hpp"

namespace adgt::pp {

using adgt::StagePlacement;

// A malformed schedule, a bad generator argument or a bad pipeline setting.
// The message names the setting (or the rank and instruction) and a fix.
struct ScheduleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Op : std::uint8_t {
  Forward,         // F: the stage's forward for one micro-batch; keeps its activations
  BackwardInput,   // B: gradient w.r.t. the stage input (what the previous stage waits for)
  BackwardWeight,  // W: gradient w.r.t. the stage's weights; after B, deferrable
  Backward,        // B and W fused, for schedules that do not split the backward
  SendAct,         // after F of a non-last stage: the output to the next stage's rank
  RecvAct,         // before F of a non-first stage: the input from the previous stage's rank
  SendGrad,        // after B of a non-first stage: the input gradient to the previous stage's rank
  RecvGrad,        // before B of a non-last stage: the output gradient from the next stage's rank
  ReduceGrads,     // the chunk's weight gradients are final for this step: start their
                   // data-parallel reduction (asynchronous; the trainer waits for it)
  WaitSends,       // last instruction of every rank: every send of the step has completed
};
constexpr int kNumOps = 10;

// One instruction. Fields that do not apply are -1: WaitSends has
// microbatch = chunk = peer = -1, ReduceGrads microbatch = peer = -1,
// compute instructions have peer = -1.
struct Instr {
  Op op = Op::WaitSends;
  int microbatch = -1;  // 0..m-1
  int chunk = -1;       // 0..v-1, this rank's chunk (its stage: Schedule::stage())
  int peer = -1;        // Send/Recv: the pipeline rank at the other end
  bool operator==(const Instr&) const = default;
};

struct Schedule {
  int pp = 1;              // pipeline ranks
  int microbatches = 1;    // m, per optimizer step
  int virtual_stages = 1;  // v, chunks per rank
  StagePlacement placement = StagePlacement::looped;  // vee: v = 2, ZB-V's stage order
  std::vector<std::vector<Instr>> ranks;  // ranks[r]: rank r's instructions, in order
  std::string name;        // the generator: "1f1b", "zb-h1", ...
  std::string detail;      // free text from the generator (greedy: the variant it kept)

  int num_stages() const { return pp * virtual_stages; }
  int stage(int rank, int chunk) const { return stage_of(placement, pp, rank, chunk); }
  int rank_of_stage(int s) const { return adgt::rank_of_stage(placement, pp, s); }
  int chunk_of_stage(int s) const { return adgt::chunk_of_stage(placement, pp, s); }
};

bool is_compute(Op op);  // Forward, BackwardInput, BackwardWeight, Backward
bool is_send(Op op);     // SendAct, SendGrad
bool is_recv(Op op);     // RecvAct, RecvGrad
// Releases the micro-batch's stored activations' main part: BackwardInput or Backward.
bool is_input_backward(Op op);
const char* op_name(Op op);  // "Forward", "RecvGrad", ...

// "Forward(mb 3, chunk 0)", "RecvGrad(mb 2, chunk 0) from rank 2",
// "SendAct(mb 1, chunk 1) to rank 0", "ReduceGrads(chunk 1)", "WaitSends".
std::string to_string(const Instr& in);

// A compute step as generators think of them; from_compute_order() adds the
// communication and the WaitSends.
struct ComputeStep {
  Op op;  // Forward, BackwardInput, BackwardWeight or Backward
  int microbatch;
  int chunk;
};

// Builds the IR from per-rank compute orders: RecvAct right before each F of
// a non-first stage, SendAct right after each F of a non-last stage, RecvGrad
// right before each B (Backward or BackwardInput) of a non-last stage,
// SendGrad right after each B of a non-first stage, WaitSends at the end
// of every rank. Placing each Recv just before its consumer is exact under the
// validator's semantics (buffered sends, blocking receives); an executor may
// post receives earlier.
Schedule from_compute_order(std::string name, int pp, int microbatches, int virtual_stages,
                            const std::vector<std::vector<ComputeStep>>& order,
                            StagePlacement placement = StagePlacement::looped);

// The schedule with a ReduceGrads(chunk c) on every rank right after the last
// weight-gradient instruction (Backward or BackwardWeight) of chunk c: the
// earliest point at which the chunk's data-parallel reduction can start, so
// it overlaps the rest of the rank's backward work. Any existing ReduceGrads
// are replaced.
Schedule with_grad_reductions(Schedule s);

// The message a SendAct, RecvAct, SendGrad or RecvGrad of rank `rank`
// carries: its kind, micro-batch and the stage that sends it (the same on
// both ends, so a send and its receive compare equal).
struct Message {
  bool grad;
  int mb;
  int src_stage;
  auto operator<=>(const Message&) const = default;
};
Message message_of(const Schedule& s, int rank, const Instr& in);
// A dense index of the message in [0, 2 x stages x micro-batches).
std::size_t message_slot(const Schedule& s, const Message& m);

}  // namespace adgt::pp
