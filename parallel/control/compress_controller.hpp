// The gradient-compression controller of parallel.grad_compression=auto
// (docs/compression.md, "Controller"): every parallel.compress_interval steps
// every rank measures the signals of parallel/compress/choice.hpp
// (collectively, so the inputs agree); world rank 0 chooses a level per bucket
// with choose_levels(); the decision is broadcast and applied with
// GradReducer::set_level on every rank (run_controllers of
// parallel/control/hook.hpp, which logs {inputs, decision}).
#pragma once
#include <memory>

#include "core/config.hpp"
#include "parallel/compress/choice.hpp"
#include "parallel/control/hook.hpp"

namespace adgt::compress {

// parallel.grad_compression=auto: the controller (every compress_interval
// steps). Turns on the reducer's norm tracking.
std::unique_ptr<Controller> make_compress_controller(const RunConfig& cfg, Engine& e);

}  // namespace adgt::compress
