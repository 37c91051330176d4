// What a pipelined step measured, agreed over the ranks: the F, B and W
// seconds per stage, the spread of single instructions' times, and each
// pipeline link's message time (from the step's messages, the emulation's
// link model, or a ping-pong probe). The controllers that re-plan from
// measured times read them here.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "kernels/backend.hpp"
#include "parallel/engine/engine.hpp"
#include "parallel/pipeline/costs.hpp"
#include "parallel/pipeline/executor.hpp"

namespace adgt {

// Elements of one pipeline message: a micro-batch's activations at a stage
// boundary, micro_batch x seq_len x d_model (what the link probes send and
// the re-plan's link model prices).
int64_t pipeline_message_elems(const RunConfig& cfg);

// Whether the pipeline uses the wrap link (pp rank pp - 1 to 0): the looped
// placement with two or more chunks.
bool pipeline_has_wrap_link(Engine& e);

// probe_link_times over the engine's pipeline group with one pipeline
// message (pipeline_message_elems, the model's dtype), 3 rounds on the wall
// clock: seconds per link, agreed over pp. Collective over pp.
std::vector<double> probe_pipeline_links(Engine& e);

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

}  // namespace adgt
