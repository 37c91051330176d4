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
#include "parallel/engine/engine.hpp"
#include "parallel/measure/step_report.hpp"

namespace adgt {

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

// One decision by the rule every controller follows, also for those made
// outside the step loop (the attention kernel of a layout, a switch-file
// request): `decide` runs on world rank 0 alone (timed) with `inputs`, its
// JSON is broadcast, and every rank returns the same decision. On rank 0 a
// "console" text is printed once ("<name> at step <step>: <text>") and, unless
// the decision is "quiet" (it changed nothing), *record (may be null) gets the
// metrics record {"event": "controller", "controller": name, "step",
// "inputs", "decision", "decide_s"}; elsewhere *record is left empty.
nlohmann::json decide_broadcast(const std::string& name, int64_t step, Comm& world,
                                const nlohmann::json& inputs,
                                const std::function<nlohmann::json(const nlohmann::json&)>& decide,
                                nlohmann::json* record);

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

}  // namespace adgt
