// Compute emulation (docs/emulation.md): a rank that computes `factor` times
// slower than it does (an injected straggler, or a node of the cluster with
// node_speed < 1). After each compute piece — a pipeline instruction (F, B,
// W), a micro-batch's forward or backward, the optimizer update — the rank
// sleeps (on a virtual clock: moves its clock on by) (factor - 1) x the
// piece's compute time: its wall time minus the time
// spent inside emulated Comm calls during it (tensor-parallel collectives, the
// MoE all-to-all), so only computing is slowed. A backward that starts
// gradient reductions as it goes catches up before each one starts (wrap()),
// so the reductions start when the slow device would start them. The numbers
// are untouched.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "kernels/backend.hpp"
#include "parallel/emulate/emulated_comm.hpp"

namespace adgt::emulate {

class ComputeSlowdown {
 public:
  // factor 1: every call returns at once. rank: the emulated comms' shared
  // state (their time is not compute); be: synchronized before a piece is
  // measured (a device backend runs asynchronously).
  explicit ComputeSlowdown(double factor = 1, std::shared_ptr<EmulatedRank> rank = nullptr,
                           Backend* be = nullptr);
  double factor() const { return factor_; }
  void set_factor(double f) { factor_ = f; }  // from the next piece on (>= 1)
  bool active() const { return factor_ > 1; }
  void set_backend(Backend* be) { be_ = be; }

  void begin();     // a compute piece starts now
  void catch_up();  // sleeps (factor-1) x the compute since begin() or the last catch_up()
  // A gradient-unit hook that catches up before each call (empty stays empty).
  std::function<void(int64_t, int64_t)> wrap(std::function<void(int64_t, int64_t)> hook);
  template <class F>
  void run(F&& piece) {
    begin();
    piece();
    catch_up();
  }
  double slept_seconds() const { return slept_; }  // in total
  // Whether the rank's emulation runs a virtual clock (emulate.clock:
  // virtual), and that clock's time (the wall clock without one).
  bool virtual_clock() const;
  double now() const;
  // Whether that clock is the model clock (compute = counted matmul FLOPs),
  // and what the rank's clock counts as compute, in seconds from an arbitrary
  // origin (Clock::compute_now; the thread's CPU time without an emulation).
  bool model_clock() const;
  double compute_now() const;

 private:
  double comm_seconds() const { return rank_ ? rank_->comm_seconds : 0.0; }
  double factor_ = 1;
  std::shared_ptr<EmulatedRank> rank_;
  Backend* be_ = nullptr;
  double t0_ = 0, comm0_ = 0, slept_ = 0;
};

}  // namespace adgt::emulate
