// The watchdog's pure rules (docs/reliability.md "Hang and death detection"):
// the deadlines, and which rank a wait is stuck on, from heartbeats.
//
// Deadline rule (train.collective_timeout_s = T):
//   normal = T                                   when T > 0
//          = max(30 s, 5 x the slowest step)     when T = 0 (auto)
//   long   = max(300 s, normal)  for waits in a long phase (start-up until the
//            first step ends, checkpoint save/load, evaluation) of this rank or
//            of the peer it waits on, when that peer is alive and busy.
// A wait on a dead peer (its process is gone) ends after 1 s; on a peer whose
// heartbeat is stale (stopped, dead on another host) at `normal`.
//
// The culprit of a wait (find_culprit): among the peers of the wait (the
// send/recv peer, or the group's other members), first a dead one, then one
// whose heartbeat is stale, then one with no heartbeat file; else a peer that
// has not entered the operation (its seq for the group is lower) or entered it
// but does not wait on it: when that peer itself waits in another group, the
// search follows it (the first rank of the chain that waits on nobody is the
// one that stopped progressing: a stuck device, a long computation); a chain
// that comes back to a rank already on it is a deadlock.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "parallel/fault/heartbeat.hpp"

namespace adgt::fault {

struct Deadlines {
  double normal_s = 30, long_s = 300;
  std::string rule;  // "train.collective_timeout_s=5", "auto: max(30 s, 5 x slowest step 1.2 s)"
};
Deadlines deadlines_for(double collective_timeout_s, double slowest_step_s);

// Unknown: another host. InIo: running, and one of its threads is in an
// uninterruptible disk wait (state D: an fsync or a rename behind a busy
// filesystem's journal, which can hold a checkpoint save and the heartbeat
// writer for tens of seconds on a loaded host).
enum class Liveness { Unknown, Running, Stopped, Dead, InIo };

struct PeerView {
  const Heartbeat* hb = nullptr;  // nullptr: no (valid, this run's) heartbeat file
  Liveness live = Liveness::Unknown;
  double age_s = 0;  // since its last heartbeat
};

enum class Cause { None, Dead, Stopped, Stale, NoHeartbeat, Behind, Busy, Exited, Cycle };
const char* cause_name(Cause c);

struct Culprit {
  Cause cause = Cause::None;
  int launcher_rank = -1;
  int rank = -1;  // layout rank; -1 when unknown
  std::string host;
  int pid = 0;
  double age_s = 0;
  bool long_phase = false;  // the culprit is alive and in a long phase
  std::string detail;       // the cause in words (no rank prefix)
  std::vector<int> chain;   // launcher ranks followed from the waiting rank
};

// `me`: the waiting rank's own heartbeat (waiting == true). `peer(l)`: the
// view of launcher rank l. `stale_s`: a heartbeat older than this is stale.
Culprit find_culprit(const Heartbeat& me, const std::function<PeerView(int)>& peer, double stale_s);

// Whether a wait of `waited_s` with this culprit ends the run now.
bool should_fire(double waited_s, const Culprit& c, bool me_long_phase, const Deadlines& d);

// "rank 3 (host h, pid 1234) stopped progressing: no heartbeat for 31 s (stopped, SIGSTOP?)"
std::string describe_culprit(const Culprit& c);
// "group dp (ranks 0,1,2,3) all_reduce #418", members by layout rank where known.
std::string describe_wait(const Heartbeat& me, const std::function<PeerView(int)>& peer);

}  // namespace adgt::fault
