// The per-rank watchdog thread (docs/reliability.md "Hang and death
// detection"). It never calls MPI (the main thread and the pipeline's helper
// thread own it); it reads the communicators' progress (progress.hpp), writes
// this rank's heartbeat about once a second into a directory all ranks share,
// and ends the process, non-zero, naming the rank that stopped, when
//   - this rank has waited in one operation longer than the deadline
//     (verdict.hpp) and the heartbeats name the peer it waits on;
//   - the peer it waits on has died (same host: its pid is gone), after 1 s;
//   - a stop signal (SIGTERM from the launcher after a rank died) arrived
//     while this rank waits in an operation and some rank's process is gone
//     or its heartbeat stale: at once, before the launcher's SIGKILL;
//   - another rank wrote a verdict (verdict.<token>): it prints its own view.
// Before it ends the process it waits (at most 3 s) until every live rank has
// seen the verdict, so each prints its line, and runs the abort hooks (NCCL).
//
// Messages (stderr, one write each):
//   error: rank 0 (host h): watchdog: rank 3 (host h, pid 1234) stopped
//   progressing: no heartbeat for 31 s (process stopped, SIGSTOP?); rank 0
//   waits in group dp (ranks 0,1,2,3) all_reduce #418 for 30.2 s >
//   train.collective_timeout_s=30
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "parallel/fault/verdict.hpp"

namespace adgt {
class Comm;
struct RunConfig;
}

namespace adgt::fault {

struct WatchdogOptions {
  std::string dir;    // the shared heartbeat directory
  std::string token;  // this run's (rank 0's, broadcast)
  int launcher_rank = 0, rank = 0, world = 1;
  std::string host;
  double collective_timeout_s = 0;  // train.collective_timeout_s (0: auto)
  std::function<int()> stop_signal;  // the pending stop signal, 0 none (may be empty)
  double tick_s = 0.1;   // checks
  double beat_s = 1.0;   // heartbeat writes
  double stale_s = 3.0;  // a heartbeat older than this is stale
  int exit_code = 1;     // as fatal() (parallel/comm/mpi_env.hpp)
};

class Watchdog {
 public:
  explicit Watchdog(WatchdogOptions o);
  ~Watchdog();  // stops the thread; the heartbeat says "done"
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void run();
  Heartbeat current(int64_t* since_ns) const;  // this rank, from the registry
  PeerView view(int launcher, const Heartbeat& me);
  [[noreturn]] void fire(const Culprit& c, const Heartbeat& me, double waited_s,
                         const std::string& why);
  [[noreturn]] void follow(const std::string& verdict, const Heartbeat& me);
  [[noreturn]] void finish(const Heartbeat& me, int skip_launcher);
  void write_beat(Heartbeat& me);
  void say(const std::string& line) const;

  WatchdogOptions o_;
  int64_t beat_ = 0;
  std::atomic<bool> stop_{false};
  // The destructor wakes the ticking thread at once (a run's end no longer
  // waits out the last tick: up to 0.1 s of every rank's exit).
  std::mutex wake_mu_;
  std::condition_variable wake_;
  std::thread thread_;
  std::map<int, std::optional<Heartbeat>> cache_;  // peers read in this evaluation
  // Group key -> (wait id, steady ns of the first tick that saw it).
  mutable std::map<std::string, std::pair<int64_t, int64_t>> seen_;
};

// Collective over `world` (the layout-ordered world: rank 0 makes the run's
// token and broadcasts it): a running watchdog for this rank, heartbeats
// under <log.dir>/.heartbeat. ADGT_WATCHDOG=0 in the environment: none.
std::unique_ptr<Watchdog> start_watchdog(const RunConfig& cfg, Comm& world, int launcher_rank,
                                         const std::string& host,
                                         std::function<int()> stop_signal);

}  // namespace adgt::fault
