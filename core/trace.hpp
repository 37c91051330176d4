// Timelines (docs/trace.md): the spans and instants of one process's steps,
// recorded while log.trace's steps run and written as a Chrome trace (the
// JSON Object Format that Perfetto and chrome://tracing open), one process
// track per rank. adgt-sim writes its predicted step in the same format.
//
// One recorder per process (trace::recorder()): the pieces that record —
// the trainer's phases, the pipeline executor's instructions, the traced
// communicators' collectives — run on the training thread and call it
// directly, as they would call NVTX; while recording is off every call
// returns at once without reading a clock. Times are seconds on the clock
// the recorder was started with (the step's clock: the emulation's virtual
// clock where it has one, else the wall clock), from the origin given then.
#pragma once
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/layout.hpp"
#include "kernels/backend.hpp"

namespace adgt::trace {

// Tracks of a rank (Chrome trace "threads"): what the training thread does,
// and the blocking collectives it calls (inside its spans).
inline constexpr int kMainTrack = 0;
inline constexpr int kCommTrack = 1;

struct Event {
  std::string name;
  std::string cat;    // step, compute, pipeline, wait, comm, optimizer, checkpoint, eval, control, ...
  int track = kMainTrack;
  double start = 0;   // seconds from the recorder's origin
  double end = -1;    // < 0: an instant (a decision, a checkpoint commit)
  std::string args;   // a JSON object's text, "" for none
  bool instant() const { return end < 0; }
};

class Recorder {
 public:
  // Recording starts: times are clock() - origin from here on.
  void start(std::function<double()> clock, double origin);
  void stop();  // recording ends; the events stay until take()
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // The clock's time from the origin (0 while off).
  double now() const;
  // A span [t0, t1] (seconds from the origin) or an instant at t. Ignored while off.
  void span(std::string name, std::string_view cat, double t0, double t1, int track = kMainTrack,
            std::string args = {});
  void instant(std::string name, std::string_view cat, std::string args = {}, int track = kMainTrack);
  // The events recorded so far, in the order recorded; the recorder keeps none.
  std::vector<Event> take();
  // A backend whose named ranges (Backend::range_push/pop: NVTX on CUDA)
  // every Span also opens and closes, recording or not; nullptr: none.
  void set_ranges(Backend* be) { ranges_.store(be, std::memory_order_relaxed); }
  Backend* ranges() const { return ranges_.load(std::memory_order_relaxed); }

 private:
  std::atomic<Backend*> ranges_{nullptr};
  std::atomic<bool> on_{false};
  std::function<double()> clock_;
  double origin_ = 0;
  std::mutex mu_;
  std::vector<Event> events_;
};

// The process's recorder.
Recorder& recorder();

// A span from its construction to its destruction on the recorder's clock
// (and a profiler range of the same name where the recorder has a backend
// with ranges); nothing (no clock read) while recording is off.
class Span {
 public:
  Span(std::string_view name, std::string_view cat, int track = kMainTrack);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  void set_args(std::string json) { args_ = std::move(json); }

 private:
  bool on_ = false;
  Backend* ranges_ = nullptr;
  std::string name_, cat_, args_;
  int track_ = kMainTrack;
  double t0_ = 0;
};

// The name of a rank's track: "rank 5 (tp 1, pp 2, dp 0)" (cp and ep where > 1).
std::string rank_name(int world_rank, const Layout& lay, const RankCoords& c);

// One rank's part of a Chrome trace: its process (pid = world rank) and
// track names, then its events, as the comma-separated JSON objects of the
// traceEvents array (no brackets). `process`: the track group's name
// ("rank 3 (tp 0, pp 1, dp 1)"); `sort`: its place in the viewer.
std::string chrome_events(int pid, const std::string& process, int sort, const std::vector<Event>& events,
                          const std::vector<std::pair<int, std::string>>& track_names);
// The whole file from ranks' parts (chrome_events), in order; `about`: a
// JSON object's text for "otherData" (the run, the steps traced).
std::string chrome_trace(const std::vector<std::string>& parts, const std::string& about);

}  // namespace adgt::trace
