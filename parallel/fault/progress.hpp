// What each communicator of this process is doing, for the watchdog
// (parallel/fault/watchdog.hpp, docs/reliability.md "Hang and death detection").
//
// Every communicator registers one GroupSlot: its name, its members (as
// MPI_COMM_WORLD ranks, the launcher's numbering) and counters that the
// thread calling the communicator updates with relaxed atomic stores:
//   seq   collectives started on the group (every member starts the same ones
//         in the same order, so the counts are comparable across members);
//   p2p   sends and receives started (not comparable: each pair has its own);
//   wait  while the caller blocks in an operation: which one (op, its seq,
//         the peer of a send/recv) and a wait id (new for every wait; 0: none).
// The watchdog times a wait from the first tick that sees its id (so a wait is
// timed to within one tick, 0.1 s, and the hot path reads no clock). The
// per-operation cost is one counter increment and a few relaxed stores (about
// 2 ns; a clock read would cost 20-100 ns); the watchdog thread only reads.
// Registration and removal (communicator construction and destruction) take
// a mutex; the watchdog's snapshot takes the same mutex.
//
// Phases: the trainer marks the long operations that contain collectives
// (start-up until the first step ends, checkpoint save and load, evaluation);
// the watchdog gives waits inside them, or on a peer inside them, the long
// deadline. step_finished() feeds the automatic deadline (the slowest step).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace adgt::fault {

enum class Op : int32_t {
  None = 0, AllReduce, ReduceScatter, AllGather, Broadcast, Send, Recv, WaitSends, AllToAll,
  AllToAllv, Barrier, Gather, Other
};
const char* op_name(Op op);  // "all_reduce", ...; "none"
Op op_from_name(const std::string& s);  // inverse; Op::Other when unknown

struct GroupSlot {
  std::string key;           // unique over the job: "<name>/<members>/<k>" (k: k-th such group)
  std::string name;          // "tp", "dp", ...
  std::vector<int> members;  // MPI_COMM_WORLD ranks, in group-rank order
  std::atomic<int64_t> seq{0};            // collectives started
  std::atomic<int64_t> p2p{0};            // sends/recvs started
  std::atomic<int32_t> wait_op{0};        // Op while waiting
  std::atomic<int64_t> wait_seq{0};       // the op's seq (collective) or p2p count
  std::atomic<int32_t> wait_peer{-1};     // send/recv peer (MPI_COMM_WORLD rank), -1
  std::atomic<int64_t> wait_id{0};        // 0: not waiting; else this wait's id (written last)
  int64_t waits = 0;                      // waits so far (the calling thread's own counter)
};

// Registers a communicator; the slot lives until unregister_group.
std::shared_ptr<GroupSlot> register_group(const std::string& name, std::vector<int> members);
void unregister_group(const std::shared_ptr<GroupSlot>& slot);

int64_t steady_ns();  // std::chrono::steady_clock, ns

// While alive, `slot` shows a wait in `op` (#seq, towards `peer`). Nested
// scopes on a slot that already waits do nothing. A null slot: no-op.
class WaitScope {
 public:
  WaitScope(GroupSlot* slot, Op op, int64_t seq, int peer = -1) {
    if (!slot || slot->wait_id.load(std::memory_order_relaxed) != 0) return;
    slot_ = slot;
    slot->wait_op.store(int32_t(op), std::memory_order_relaxed);
    slot->wait_seq.store(seq, std::memory_order_relaxed);
    slot->wait_peer.store(peer, std::memory_order_relaxed);
    slot->wait_id.store(++slot->waits, std::memory_order_release);
  }
  ~WaitScope() {
    if (slot_) slot_->wait_id.store(0, std::memory_order_release);
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  GroupSlot* slot_ = nullptr;
};

// A consistent copy of one slot, for the watchdog.
struct GroupState {
  std::string key, name;
  std::vector<int> members;
  int64_t seq = 0, p2p = 0;
  Op wait_op = Op::None;
  int64_t wait_seq = 0;
  int wait_peer = -1;
  int64_t wait_id = 0;  // 0: not waiting
};
std::vector<GroupState> snapshot_groups();

// The run's phase, shown in the heartbeat; long phases get the long deadline.
enum class Phase : int32_t { Startup = 0, Train, CheckpointSave, CheckpointLoad, Eval, LayoutSwitch };
const char* phase_name(Phase p);
Phase phase_from_name(const std::string& s);
bool is_long_phase(Phase p);  // all but Train
Phase current_phase();
// Sets the phase for its lifetime; restores the previous one after.
class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase prev_;
};

// The trainer, after each step: counts it, keeps the slowest step time and
// leaves the start-up phase after the first one.
void step_finished(double seconds);
int64_t steps_finished();
double slowest_step_seconds();

// Called by the watchdog just before it ends the process (NCCL communicators
// abort themselves here). Returns an id for remove_abort_hook.
int add_abort_hook(std::function<void()> hook);
void remove_abort_hook(int id);
void run_abort_hooks();

}  // namespace adgt::fault
