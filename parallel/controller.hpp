// The one hook the training loop runs after every step (StepHook): first the
// observers (they read the step: the metrics log, later profilers), then the
// controllers (ARCHITECTURE.md, "decide on one rank, broadcast, log"): every
// rank observes (collective measurements, so the inputs agree), world rank 0
// alone decides, the decision is broadcast as JSON text, every rank applies
// the same one, and rank 0 writes {inputs, decision} to metrics.jsonl. A
// controller only moves work in time and space: it never changes the numbers
// a step computes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/comm.hpp"
#include "parallel/engine.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/schedule/costs.hpp"
#include "parallel/schedule/instruction.hpp"

namespace adgt {

// What the loop knows after a step; the same on every rank except the
// per-rank measurements marked so.
struct StepReport {
  int64_t step = 0;        // steps completed (1-based)
  int64_t first_step = 0;  // the step this run started from (resume)
  int64_t total_steps = 0; // train.steps
  double loss = 0, grad_norm = 0, lr = 0;
  bool applied = true;     // the update was applied (loss and norm finite)
  int64_t skipped_steps = 0;  // updates skipped so far in this run
  double seconds = 0;      // this rank: the step's wall time
  int64_t tp_bytes = 0, dp_bytes = 0, pp_bytes = 0;  // this rank: bytes sent in the step, per group
  // This rank: seconds the step spent inside blocking calls of its tp, pp and
  // ep groups (the compute waited on them: exposed communication); the dp
  // reduction's exposed part is the engine's dp_wait_s.
  double tp_seconds = 0, pp_seconds = 0, ep_seconds = 0;
  // Backend calls that waited for the device to hand the host a value in this
  // step (Backend::host_reads; -1 where not counted: the CPU backend).
  int64_t host_reads = -1;
};

class MetricsLog;

// Reads each step; every rank, after every step, before the controllers. May
// be collective over the world (every rank calls it with the same report).
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void observe(Engine& e, const StepReport& r, Comm& world) = 0;
};

class Controller {
 public:
  virtual ~Controller() = default;
  virtual std::string name() const = 0;
  // Every rank, after every step, before due(): local measurements only (no
  // communication), kept for the next observe(); e.g. the steps of a window
  // a decision reads, measured without a collective per step.
  virtual void record(Engine&, const StepReport&) {}
  // Whether to act after this step: a pure function of the report (so every rank agrees).
  virtual bool due(const StepReport& r) const = 0;
  // Every rank; may be collective over the world. The decision's inputs.
  virtual nlohmann::json observe(Engine& e, const StepReport& r, Comm& world) = 0;
  // World rank 0 only: the decision, from the inputs alone.
  virtual nlohmann::json decide(const nlohmann::json& inputs) = 0;
  // Every rank, with the decision rank 0 made. Throws on a decision it cannot apply.
  // A decision may also ask for a layout change: "layout_request": run-file
  // overrides such as ["parallel.stage_layers=[3,5]"]. It is broadcast with
  // the decision, so every rank has the same request; the trainer switches
  // the layout in memory at this step boundary (docs/reliability.md).
  virtual void apply(Engine& e, const nlohmann::json& decision) = 0;
};

// The layout change a step's decisions asked for ("layout_request"; the
// last controller's when several did), and which controller asked.
struct LayoutRequest {
  std::string by;
  std::vector<std::string> overrides;
  bool empty() const { return overrides.empty(); }
};

// Rank `root` of `comm` sends `text`; every rank returns it. Collective.
std::string broadcast_text(Comm& comm, const std::string& text, int root = 0);

// One cycle of every controller: record, and for the due ones observe, decide
// on rank 0, broadcast, apply. Returns, on world rank 0, the records to log: {"event":
// "controller", "controller", "step", "inputs", "decision"}; elsewhere empty.
// A decision with "quiet": true (it changed nothing) is not logged.
// `request` (may be null): the decisions' layout request, if any.
std::vector<nlohmann::json> run_controllers(const std::vector<Controller*>& cs, Engine& e,
                                            const StepReport& r, Comm& world,
                                            LayoutRequest* request = nullptr);

// The loop's one hook: observers in the order added, then the due controllers
// (run_controllers), their records written to `log` (rank 0's; nullptr
// elsewhere). It does not own them.
class StepHook {
 public:
  void add(Observer& o) { observers_.push_back(&o); }
  void add(Controller& c) { controllers_.push_back(&c); }
  // Returns the layout change the controllers' decisions asked for (empty: none).
  LayoutRequest after_step(Engine& e, const StepReport& r, Comm& world, MetricsLog* log);

 private:
  std::vector<Observer*> observers_;
  std::vector<Controller*> controllers_;
};

// Mean F, B and W seconds per model stage (pp x virtual_stages) of the last
// pipeline step, the maximum over the world: the same on every rank. Each
// instruction counts its compute's own time where the executor measures it
// (ExecutedInstr::busy: CPU time x emulated slowdown on ranks sharing cores),
// else its wall time.
// Collective over `world`; the engine must be pipelined. Its jitter is
// measured_jitter's of the same step.
pp::StageCosts measured_stage_costs(Engine& e, Comm& world);

// The spread of single instructions' times in a pipeline step
// (pp::StageCosts::jitter): per rank, each compute instruction's time over
// the median of its kind's (the same chunk and op) in `timeline`, as
// kJitterQuantiles quantiles; averaged over the ranks that ran compute.
// Empty when none did. Collective over `world` (one small all-reduce).
inline constexpr int kJitterQuantiles = 20;
std::vector<double> measured_jitter(const std::vector<ExecutedInstr>& timeline, Comm& world);

// Per pipeline link k (between pp ranks k and k + 1; k = pp - 1: the wrap
// link of pp rank pp - 1 and 0 that interleaved schedules use), the maximum
// over the world of:
//  - with emulate.cluster: the mean seconds a message of the last step took
//    on it (arrival − departure, as the link emulation times it:
//    EmulatedRank::link_in); 0 for a link no message crossed;
//  - with parallel.link_times: messages, where receives block the host (a
//    host backend): link_times_from_messages of the step's own messages
//    (PipelineExecutor::message_times), on the emulation's clock or the host's;
//  - else on real transports (auto, probe, or messages on a device): probe_link_times with
//    one activation message (the pipeline's message: micro-batch x seq_len x
//    d_model in the run's dtype).
// All 0 without a pipeline, and then nothing is exchanged; else collective
// over `world`.
std::vector<double> measured_link_times(Engine& e, Comm& world);

// A message's time per pipeline link (as measured_link_times numbers them)
// from one step's messages (`msgs`: this rank's sends and completed
// receives, PipelineExecutor::message_times). Each rank sends its send
// times to the peers it sent to; for each direction of a link the receiving
// rank takes the least (arrival − departure) over the messages of the step
// (a message its receiver was already waiting for: the transfer alone);
// the link's time is the mean of its two directions' least, which cancels
// any constant offset between the two ranks' clocks (as NTP does), so ranks
// on different hosts need no common clock. A link with messages one way
// only takes that way's least (exact on a shared clock). Collective over
// `pp` (a neighbour exchange and one all-reduce); the result is the same on
// every rank of the pipeline. `wrap`: the interleaved schedules' link pp - 1.
std::vector<double> link_times_from_messages(Comm& pp, const std::vector<MessageTime>& msgs, bool wrap);

// Ping-pong over each pipeline link of `pp` (link k: ranks k and k + 1; with
// `wrap`, link pp - 1: ranks pp - 1 and 0), `rounds` times with `msg` (any
// tensor this rank may overwrite, the same size on every rank): rank k sends,
// k + 1 returns it; a link's time is the fastest round's half. Even links
// first, then odd ones, then the wrap link, so no rank is in two at once.
// `now`: the clock (seconds). Returns the times per link (pp - 1 or pp of
// them) agreed over `pp` (the maximum). Collective over `pp`.
std::vector<double> probe_link_times(Comm& pp, Tensor msg, bool wrap, int rounds,
                                     const std::function<double()>& now);

// A schedule's per-rank instruction lists as JSON ([[op, microbatch, chunk,
// peer], ...] per rank: what a controller broadcasts), and back: the lists
// with `like`'s pp, micro-batches and chunks, validated (throws
// ScheduleError naming the broken rule).
nlohmann::json schedule_ranks_json(const pp::Schedule& s);
pp::Schedule schedule_from_json(const pp::Schedule& like, const std::string& name,
                                const std::string& detail, const nlohmann::json& ranks);

// parallel.schedule: greedy. After the run's second step (the first warms
// caches and buffers) it re-plans the pipeline schedule from the mean F, B and
// W time per stage measured on that step (the maximum over the world), with
// the same generator that planned the first steps from the FLOP cost model.
std::unique_ptr<Controller> make_greedy_replan(const RunConfig& cfg);

}  // namespace adgt
