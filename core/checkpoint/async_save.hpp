// Asynchronous checkpoints (checkpoint.async: true; docs/reliability.md,
// "Asynchronous checkpoints"): the sharded save's three phases
// (core/checkpoint/sharded.hpp) spread over step boundaries. At the save step
// the caller has copied its state to host memory (a CheckpointState); start()
// runs the begin phase and hands the state to a background thread that writes
// and fsyncs this rank's rank_<R>.h5 while training goes on; poll() at each
// later step boundary asks every rank, with one all-reduce of one integer over
// the world, whether its write has finished, and once every rank's has, runs
// the commit phase (agreement, gather, index, COMPLETE, rename, prune) on the
// calling thread. At most one save is in flight.
//
// Threads: every communication happens on the calling (main) thread; the
// background thread makes no MPI call. HDF5 is not assumed thread-safe: while a
// write is in flight the background thread is the only one calling HDF5. The
// saver itself makes no HDF5 call on the calling thread before the writer has
// finished (the commit joins it first); the caller must not either (the
// trainer's step loop, evaluation, data and logging make none).
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "core/checkpoint/sharded.hpp"

namespace adgt {

class AsyncCheckpointSaver {
 public:
  // A committed save and its times (seconds).
  struct Committed {
    std::string dir;        // <root>/step_<N>
    int64_t step = 0;
    double begin_s = 0;     // start(): the begin phase (checks, temporary directory)
    double write_s = 0;     // the background write of this rank's file (fsync included)
    double wait_s = 0;      // waiting for this rank's writer (finish(); ~0 after a poll)
    double commit_s = 0;    // the commit phase
    double poll_s = 0;      // the polls' all-reduces while in flight, together
    int64_t polls = 0;      // how many step boundaries polled
  };

  AsyncCheckpointSaver() = default;
  // An exception path: abandon() (joins the writer, no communication).
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Collective over `world`. Begins the save of st (which the saver keeps
  // until the commit) and starts this rank's write on a background thread.
  // A save still in flight is first waited for and committed (finish()),
  // which is returned. An error of the begin phase (or of the previous save)
  // is thrown on every rank; nothing is then in flight.
  std::optional<Committed> start(CheckpointState st, const ShardLayout& lay, Comm& world, const std::string& root,
                                 int64_t keep);
  // Collective over `world`, at a step boundary (nothing when no save is in
  // flight, on every rank alike): one all-reduce of "my write has finished";
  // when every rank's has, commits and returns the save. A write that failed
  // on any rank: the temporary directory is removed and CheckpointError, with
  // the failing rank's message naming its file, is thrown on every rank.
  std::optional<Committed> poll(Comm& world);
  // Collective over `world`: waits for this rank's write and commits (or
  // throws as poll does). Nothing when no save is in flight.
  std::optional<Committed> finish(Comm& world);
  // Not collective: waits for this rank's writer and drops the save; rank 0
  // removes the temporary directory (no COMPLETE is ever written for it).
  void abandon() noexcept;

  bool in_flight() const { return active_; }
  // The last committed save's host buffers (params, exp_avg, exp_avg_sq;
  // their memory kept), for the next save to fill in place: copying into
  // memory already touched is several times faster than into fresh pages,
  // and that copy is the save's stall. Empty vectors before the first commit
  // and while a save is in flight. The saver holds one state's host copy
  // between saves.
  CheckpointState take_buffers();
  // Allocates and touches the staging buffers on a background thread
  // (params: `params` floats, exp_avg and exp_avg_sq: `moments` each), so
  // that even the first save copies into memory already mapped. Not
  // collective; take_buffers waits for it.
  void prepare_buffers(size_t params, size_t moments);
  int64_t step() const { return st_.step; }

 private:
  Committed commit(Comm& world);

  bool active_ = false;
  CheckpointState st_;  // the host copy being written
  CheckpointState spare_;  // the last written copy's buffers (take_buffers)
  std::thread preparer_;   // prepare_buffers' thread (fills spare_)
  ShardLayout lay_;
  ShardedSave save_;
  std::thread writer_;
  std::atomic<bool> written_{false};
  Committed times_;
};

}  // namespace adgt
