// parallel.adapt: schedule (docs/adaptation.md): the dynamic pipeline
// schedule. After every step each rank's per-stage F, B and W times (from
// the executor's own timeline, before any collective) are agreed over the
// world (the maximum), and one change detector per stage
// (change_detector.hpp) reads the stage's F + B + W; one more per pipeline
// link reads the mean time of a message on it (measured_link_times: under
// the link emulation, which times each message; real links are not timed
// yet). When the detectors' warm-up ends, and again whenever one flags a
// sustained change, rank 0 re-plans the schedule from the measured times
// (each link's own message time, pp::StageCosts::link; schedule_choice.hpp) and
// every rank switches to it at the same step boundary. A step that changes
// nothing is not logged; a re-plan is, with the times it used, the
// candidates' predicted makespans, the predicted before and after, and the
// step time measured before it (the next steps' times are on their step
// lines). The schedule moves work in time only: the losses are the plain
// run's.
//
// Its warm-up mode, for the list-scheduled pipelines (parallel.schedule
// greedy or zb-v, whatever parallel.adapt says): after the run's second step
// the configured schedule is generated again from the F, B and W measured on
// that step, by the generator that planned the first steps from the FLOP
// cost model. The one schedule re-planner: with parallel.adapt off it does
// that alone.
#pragma once
#include <memory>

#include "core/config.hpp"
#include "parallel/adapt/change_detector.hpp"
#include "parallel/control/hook.hpp"

namespace adgt::adapt {

// opts.threshold is parallel.adapt_threshold's (the rest as given). Made for
// a pipelined layout when parallel.adapt is not off or the schedule is
// list-scheduled.
std::unique_ptr<Controller> make_schedule_adapter(const RunConfig& cfg,
                                                  DetectorOptions opts = {});

}  // namespace adgt::adapt
