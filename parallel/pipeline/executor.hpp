// The pipeline executor: runs any schedule of parallel/schedule/ (one rank's
// instruction list) on this rank's model stages, over the pipeline group.
//
// Semantics are the validator's (validate.hpp): a Send is posted as a
// non-blocking send from a buffer of the executor's and completes later (all
// by WaitSends); a Recv blocks until its message is there. ReduceGrads
// hands the chunk's final weight gradients to the caller's callback. A micro-batch's
// activations live in a model slot of its chunk from its RecvAct/Forward to its
// Backward (or, split, to its BackwardWeight); slots are made on demand, so the
// memory held is what the schedule keeps in flight.
//
// Messages carry the tag 2 * (micro-batch * S + receiving stage) + kind
// (0 activation, 1 gradient), so every message of a step has its own tag.
// A Send/Recv pair between a rank and itself (the vee placement's turn on rank
// pp-1, ZB-V) is a copy in memory, on every transport.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/comm.hpp"
#include "core/model/model.hpp"
#include "parallel/pipeline/instruction.hpp"

namespace adgt {

namespace emulate {
class ComputeSlowdown;
}

// One compute instruction as it ran: seconds from the start of the step.
struct ExecutedInstr {
  pp::Instr instr;
  double start = 0, end = 0;  // seconds since the step's barrier (the emulation's virtual clock's time when it has one)
  // The compute's own time (seconds) where wall time misleads: on a host
  // backend with one thread per rank (ranks that share cores, where a piece's
  // wall time includes the time other ranks held the core), this thread's CPU
  // time times the rank's emulated slowdown factor — the time a dedicated
  // device of that speed would take. < 0: not measured (use end - start).
  double busy = -1;
  double own_seconds() const { return busy >= 0 ? busy : end - start; }
};

// One pipeline message of the last step as this rank saw it, on the
// timeline's clock (the emulation's virtual clock, else the host's steady
// clock, which every process of a host shares): a send when its isend was
// issued, a receive when it completed. `tag` is the same on both ends.
struct MessageTime {
  int peer = -1;
  int tag = -1;
  bool sent = false;
  double t = 0;
};

// Fills the host token ids of micro-batch mb: inputs and targets, (B*T) each.
using MicroBatchFetch = std::function<void(int mb, int32_t* inputs, int32_t* targets)>;
// What the executor tells the data-parallel gradient reduction about final
// gradients (GradReducer).
struct GradHooks {
  // At ReduceGrads(chunk): the chunk's weight gradients are final. fused_last:
  // they came from a fused Backward that already summed the chunk's tp
  // partials (SP norms, MoE routers) and reported its units through `unit`.
  std::function<void(int chunk, bool fused_last)> chunk;
  // During a chunk's last fused Backward (the one right before its
  // ReduceGrads): each gradient unit as it completes (Model::backward's
  // on_ready), so its bucket can start before the backward ends. Empty: none.
  std::function<void(int64_t, int64_t)> unit;
};

class PipelineExecutor {
 public:
  // `schedule` must have pp == pp_comm.size() and be valid (pp::validate);
  // `model` holds this rank's chunks (model.num_chunks() == virtual_stages).
  PipelineExecutor(Model& model, Backend& be, Comm& pp_comm, pp::Schedule schedule);

  const pp::Schedule& schedule() const { return sched_; }
  void set_schedule(pp::Schedule s);  // same pp, micro-batches and chunks

  // One optimizer step's forwards and backwards, accumulating gradients (+=)
  // of grad_scale * (mean loss of each micro-batch). Returns the sum of the
  // micro-batches' mean losses on the rank holding the head (0 elsewhere).
  // At ReduceGrads(c) it calls hooks.chunk (which starts the chunk's
  // data-parallel reduction), and during the chunk's last fused Backward
  // hooks.unit. Stops at WaitSends with every send completed; the caller
  // completes the gradient reduction and steps the optimizer.
  double run_step(const MicroBatchFetch& fetch, double grad_scale, const GradHooks& hooks = {});
  // Groups whose started collectives the executor moves along: between
  // instructions, and from its helper thread while this rank computes (when
  // no compute communicates). The data-parallel groups of GradReducer.
  void set_progress_comms(std::vector<Comm*> c) { progress_comms_ = std::move(c); }
  // The compute slowdown hook (parallel/emulate/slowdown.hpp) around each F,
  // B and W instruction; nullptr: none.
  void set_slowdown(emulate::ComputeSlowdown* s) { slow_ = s; }

  // Forward only (evaluation) of one batch through every stage in order;
  // returns the mean loss on the rank holding the head (0 elsewhere).
  double forward_only(const int32_t* inputs, const int32_t* targets);

  // The last run_step's compute instructions with their times, in list order.
  const std::vector<ExecutedInstr>& timeline() const { return timeline_; }
  double last_step_seconds() const { return step_s_; }  // barrier to the last instruction
  double last_busy_seconds() const;                      // sum of compute durations
  // Sum of the compute's own times (ExecutedInstr::busy where measured, else
  // end - start): what a rank's speed is judged by, free of the time it
  // waited for a core on a shared host (the re-plan's and HERMP's input).
  double last_compute_seconds() const;
  // Time the last step spent in its receives (RecvAct, RecvGrad): waiting for
  // a neighbour's message, on the virtual clock of an emulation (else wall);
  // -1 where receives do not block the host (a device backend).
  double last_wait_seconds() const { return wait_s_; }
  // The last run_step's messages (MessageTime), where receives block the
  // host (last_wait_seconds() >= 0); else empty.
  const std::vector<MessageTime>& message_times() const { return msg_times_; }
  // The most micro-batch activations this rank held at once in the last
  // run_step, summed over its chunks (a chunk's slot in use from its
  // RecvAct/Forward to its Backward or BackwardWeight): what the schedule's
  // pp::held_activations counts, as the executor ran it.
  int64_t last_peak_held() const { return peak_held_; }

 private:
  // run_step's parts: the step's shared state (executor.cpp), a receive timed
  // on the step's clock, a send noted, one compute instruction's run (the
  // helper thread, the slowdown hook, its busy time), its timeline entry, the
  // four kinds of instruction, and the timeline and checks after the step.
  struct StepRun;
  double clock_now(const StepRun& st) const;
  void recv_timed(StepRun& st, Tensor t, int peer, int tg);
  void note_sent(StepRun& st, int peer, int tg);
  template <class Piece>
  double compute(StepRun& st, bool helper, Piece&& piece);
  void timeline_entry(StepRun& st, const ExecutedInstr& e, int m0, double v0);
  void exec_transfer(StepRun& st, size_t i, const pp::Instr& in, int stage);
  void exec_forward(StepRun& st, const pp::Instr& in);
  void exec_backward(StepRun& st, size_t i, const pp::Instr& in, int stage);
  void exec_backward_weight(StepRun& st, const pp::Instr& in);
  void finish_step(StepRun& st);

  int tag(int kind, int mb, int receiving_stage) const;
  int slot_for(int chunk, int mb);      // assigns a free slot on first use
  void release_slot(int chunk, int mb);
  Tensor send_buffer(const Tensor& like);  // a buffer whose previous send has completed
  void isend_copy(const Tensor& t, int peer, int tag);
  // A buffer of `bytes` from `pool` (or a new one).
  Buffer take_buffer(std::vector<Buffer>& pool, size_t bytes);
  // The vee placement's turn on rank pp-1 (stages pp-1 and pp on one rank):
  // a Send to this rank itself copies `t` into a buffer of `pool` kept under
  // its tag; the matching Recv takes it (take_over). No transport, no link.
  void hand_over(const Tensor& t, int tag, std::vector<Buffer>& pool);
  Buffer take_over(int tag, const pp::Instr& in);

  Model& model_;
  Backend& be_;
  Comm& comm_;
  pp::Schedule sched_;
  int rank_;
  std::vector<std::map<int, int>> slot_of_;   // [chunk]: micro-batch -> slot
  std::vector<std::vector<int>> free_slots_;  // [chunk]
  struct SendBuf {
    Buffer buf;
    int64_t id = -1;  // -1 free, -2 reserved, else the isend using it (Comm ids)
  };
  std::vector<SendBuf> sends_;
  std::map<std::pair<int, int>, Buffer> grads_in_;   // (chunk, mb) -> received output gradient
  std::vector<Buffer> free_grads_;                   // consumed ones, for the next RecvGrad
  std::map<int, Buffer> self_msgs_;                  // tag -> a message this rank sent itself
  std::vector<Buffer> free_self_;                    // activations handed over and consumed
  std::vector<int32_t> in_, tg_;
  std::vector<ExecutedInstr> timeline_;
  std::vector<Comm*> progress_comms_;
  emulate::ComputeSlowdown* slow_ = nullptr;
  double step_s_ = 0;
  double wait_s_ = 0;
  std::vector<MessageTime> msg_times_;
  int64_t held_ = 0, peak_held_ = 0;  // slots in use now / at most, this step
};

}  // namespace adgt
