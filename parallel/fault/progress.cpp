#include "parallel/fault/progress.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

namespace adgt::fault {

namespace {
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<GroupSlot>> slots;
  std::map<std::string, int> made;  // "<name>/<members>" -> groups made so far
  std::map<int, std::function<void()>> abort_hooks;
  int next_hook = 1;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the watchdog may outlive statics
  return *r;
}
std::atomic<int32_t> g_phase{int32_t(Phase::Startup)};
std::atomic<int64_t> g_steps{0};
std::atomic<int64_t> g_slowest_ns{0};

const char* const kOpNames[] = {"none",       "all_reduce", "reduce_scatter", "all_gather",
                                "broadcast",  "send",       "recv",           "wait_sends",
                                "all_to_all", "all_to_allv", "barrier",       "gather",
                                "other"};
const char* const kPhaseNames[] = {"startup", "train", "checkpoint_save", "checkpoint_load", "eval",
                                   "layout_switch"};
}  // namespace

const char* op_name(Op op) {
  const int i = int(op);
  return i >= 0 && i <= int(Op::Other) ? kOpNames[i] : "other";
}

Op op_from_name(const std::string& s) {
  for (int i = 0; i <= int(Op::Other); ++i)
    if (s == kOpNames[i]) return Op(i);
  return Op::Other;
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<GroupSlot> register_group(const std::string& name, std::vector<int> members) {
  auto s = std::make_shared<GroupSlot>();
  std::string m;
  for (size_t i = 0; i < members.size(); ++i) m += (i ? "," : "") + std::to_string(members[i]);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string base = name + "/" + m;
  s->key = base + "/" + std::to_string(r.made[base]++);
  s->name = name;
  s->members = std::move(members);
  r.slots.push_back(s);
  return s;
}

void unregister_group(const std::shared_ptr<GroupSlot>& slot) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.slots.erase(std::remove(r.slots.begin(), r.slots.end(), slot), r.slots.end());
}

std::vector<GroupState> snapshot_groups() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<GroupState> out;
  out.reserve(r.slots.size());
  for (const auto& s : r.slots) {
    GroupState g;
    g.key = s->key;
    g.name = s->name;
    g.members = s->members;
    g.seq = s->seq.load(std::memory_order_relaxed);
    g.p2p = s->p2p.load(std::memory_order_relaxed);
    // The wait's fields are stored before its id (release); re-read the id to
    // drop a wait that ended or changed while they were read.
    for (int tries = 0; tries < 3; ++tries) {
      const int64_t id = s->wait_id.load(std::memory_order_acquire);
      g.wait_op = Op(s->wait_op.load(std::memory_order_relaxed));
      g.wait_seq = s->wait_seq.load(std::memory_order_relaxed);
      g.wait_peer = s->wait_peer.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s->wait_id.load(std::memory_order_relaxed) == id) {
        g.wait_id = id;
        break;
      }
      g.wait_id = 0;
    }
    if (g.wait_id == 0) g.wait_op = Op::None, g.wait_seq = 0, g.wait_peer = -1;
    out.push_back(std::move(g));
  }
  return out;
}

const char* phase_name(Phase p) {
  const int i = int(p);
  return i >= 0 && i <= int(Phase::LayoutSwitch) ? kPhaseNames[i] : "train";
}

Phase phase_from_name(const std::string& s) {
  for (int i = 0; i <= int(Phase::LayoutSwitch); ++i)
    if (s == kPhaseNames[i]) return Phase(i);
  return Phase::Train;
}

bool is_long_phase(Phase p) { return p != Phase::Train; }
Phase current_phase() { return Phase(g_phase.load(std::memory_order_relaxed)); }

PhaseScope::PhaseScope(Phase p) : prev_(current_phase()) {
  g_phase.store(int32_t(p), std::memory_order_relaxed);
}
PhaseScope::~PhaseScope() { g_phase.store(int32_t(prev_), std::memory_order_relaxed); }

void step_finished(double seconds) {
  const int64_t ns = int64_t(seconds * 1e9);
  if (ns > g_slowest_ns.load(std::memory_order_relaxed))
    g_slowest_ns.store(ns, std::memory_order_relaxed);
  if (g_steps.fetch_add(1, std::memory_order_relaxed) == 0 && current_phase() == Phase::Startup)
    g_phase.store(int32_t(Phase::Train), std::memory_order_relaxed);
}
int64_t steps_finished() { return g_steps.load(std::memory_order_relaxed); }
double slowest_step_seconds() { return double(g_slowest_ns.load(std::memory_order_relaxed)) * 1e-9; }

int add_abort_hook(std::function<void()> hook) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.abort_hooks[r.next_hook] = std::move(hook);
  return r.next_hook++;
}

void remove_abort_hook(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.abort_hooks.erase(id);
}

void run_abort_hooks() {
  std::map<int, std::function<void()>> hooks;
  {
    Registry& r = registry();
    std::unique_lock<std::mutex> lock(r.mu, std::try_to_lock);  // never block the exit
    if (!lock.owns_lock()) return;
    hooks = r.abort_hooks;
  }
  for (auto& [id, h] : hooks) h();
}

}  // namespace adgt::fault
