#include "parallel/fault/verdict.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

namespace adgt::fault {

namespace {
std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 10 ? "%.1f" : "%.0f", s);
  return b;
}

bool is_p2p(Op op) { return op == Op::Send || op == Op::Recv; }

Culprit named(Cause c, int launcher, const PeerView& v) {
  Culprit u;
  u.cause = c;
  u.launcher_rank = launcher;
  if (v.hb) {
    u.rank = v.hb->rank;
    u.host = v.hb->host;
    u.pid = v.hb->pid;
    u.long_phase = is_long_phase(v.hb->phase);
  }
  u.age_s = v.age_s;
  return u;
}

int layout_rank(int launcher, const std::function<PeerView(int)>& peer) {
  const PeerView v = peer(launcher);
  return v.hb ? v.hb->rank : -1;
}

std::string rank_word(int launcher, int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : "launcher rank " + std::to_string(launcher);
}

// The culprit of `w`'s wait, following chains; `on_chain`: ranks visited.
Culprit examine(const Heartbeat& w, const std::function<PeerView(int)>& peer, double stale_s,
                std::vector<int>& chain) {
  chain.push_back(w.launcher_rank);
  const HeartbeatGroup* g = w.group(w.wait_group);
  std::vector<int> cands;
  if (is_p2p(w.wait_op) && w.wait_peer >= 0)
    cands = {w.wait_peer};
  else if (g)
    for (int m : g->members)
      if (m != w.launcher_rank) cands.push_back(m);
  // 1. dead, stopped, stale, no heartbeat: the process is not running (or not seen).
  const Cause order[] = {Cause::Dead, Cause::Stopped, Cause::Stale, Cause::NoHeartbeat};
  for (Cause want : order)
    for (int c : cands) {
      const PeerView v = peer(c);
      Cause got = Cause::None;
      if (v.hb && v.hb->state == "done") continue;  // ended cleanly: judged below
      if (v.live == Liveness::Dead) got = Cause::Dead;
      else if (!v.hb) got = Cause::NoHeartbeat;
      else if (v.age_s > stale_s) got = v.live == Liveness::Stopped ? Cause::Stopped : Cause::Stale;
      else if (v.live == Liveness::Stopped) got = Cause::Stopped;
      if (got != want) continue;
      Culprit u = named(got, c, v);
      u.chain = chain;
      u.chain.push_back(c);
      if (got == Cause::NoHeartbeat)
        u.detail = "has written no heartbeat (not started yet, or log.dir is not shared between "
                   "its host and this one)";
      else if (got == Cause::Dead)
        u.detail = "died: its process is gone (last heartbeat " + secs(v.age_s) + " s ago)";
      else if (got == Cause::Stopped)
        u.detail = "stopped progressing: no heartbeat for " + secs(v.age_s) +
                   " s (process stopped, SIGSTOP?)";
      else if (v.live == Liveness::InIo) {
        // Not hung: the disk is slow. Its heartbeat writer waits on the same
        // filesystem; the long deadline applies (a stuck mount still ends the run).
        u.long_phase = true;
        u.detail = "stopped progressing: no heartbeat for " + secs(v.age_s) +
                   " s while its process waits on the disk (a thread in uninterruptible I/O: "
                   "a slow or stuck filesystem under log.dir or checkpoint.dir)";
      } else
        u.detail = "stopped progressing: no heartbeat for " + secs(v.age_s) + " s" +
                   (v.live == Liveness::Running
                        ? " (its process runs but does not heartbeat: starved or swapping?)"
                        : " (on another host: dead, stopped or unreachable)");
      return u;
    }
  // 2. alive peers that do not take part in the operation. One that entered
  // it (a non-blocking start) but waits on nothing is named only when no
  // other is found: it may simply not have reached its wait yet.
  Culprit fallback;
  for (int c : cands) {
    const PeerView v = peer(c);
    const Heartbeat& p = *v.hb;
    bool participates;
    std::string where;
    if (is_p2p(w.wait_op)) {
      participates = false;  // the send/recv peer waits elsewhere or computes
    } else {
      const HeartbeatGroup* pg = p.group(w.wait_group);
      const int64_t its = pg ? pg->seq : 0;
      participates = its >= w.wait_seq && p.waiting && p.wait_group == w.wait_group &&
                     p.wait_seq == w.wait_seq;
      if (!participates && its >= w.wait_seq && !p.waiting) {
        if (fallback.cause == Cause::None && p.state != "done") {
          fallback = named(Cause::Busy, c, v);
          fallback.chain = chain;
          fallback.chain.push_back(c);
          fallback.detail = "stopped progressing: it started " + g->name + " " +
                            op_name(w.wait_op) + " #" + std::to_string(w.wait_seq) +
                            " but waits in no communication operation (phase " +
                            phase_name(p.phase) + ", step " + std::to_string(p.step) + ")";
        }
        continue;
      }
      if (!participates && its < w.wait_seq)
        where = "it has not entered " + g->name + " " + op_name(w.wait_op) + " #" +
                std::to_string(w.wait_seq) + " (its last is #" + std::to_string(its) + ")";
      else if (!participates)
        where = "it waits on a different operation";
    }
    if (participates) continue;
    Culprit u = named(Cause::Busy, c, v);
    if (p.state == "done") {
      u.cause = Cause::Exited;
      u.detail = "has exited (its run ended) while this rank waits on it";
      u.chain = chain;
      u.chain.push_back(c);
      return u;
    }
    if (p.waiting) {
      if (std::find(chain.begin(), chain.end(), c) != chain.end()) {
        u.cause = Cause::Cycle;
        u.chain = chain;
        u.chain.push_back(c);
        std::string ranks;
        for (size_t i = 0; i < u.chain.size(); ++i)
          ranks += (i ? " -> " : "") + rank_word(u.chain[i], layout_rank(u.chain[i], peer));
        u.detail = "deadlock: the waits form a cycle " + ranks;
        return u;
      }
      return examine(p, peer, stale_s, chain);  // follow: it waits on someone else
    }
    u.cause = where.rfind("it has not", 0) == 0 || is_p2p(w.wait_op) ? Cause::Behind : Cause::Busy;
    u.chain = chain;
    u.chain.push_back(c);
    u.detail = "stopped progressing: " + (where.empty() ? std::string("it") : where + " and") +
               " waits in no communication operation (phase " + phase_name(p.phase) + ", step " +
               std::to_string(p.step) + "; a stuck device or a long computation)";
    return u;
  }
  if (fallback.cause != Cause::None) return fallback;
  Culprit none;
  none.chain = chain;
  none.detail = "no peer identified: every peer of the wait takes part in it (a transport fault?)";
  return none;
}
}  // namespace

Deadlines deadlines_for(double t, double slowest_step_s) {
  Deadlines d;
  char b[160];
  if (t > 0) {
    d.normal_s = t;
    std::snprintf(b, sizeof b, "train.collective_timeout_s=%g", t);
  } else {
    d.normal_s = std::max(30.0, 5.0 * slowest_step_s);
    std::snprintf(b, sizeof b,
                  "train.collective_timeout_s=0: auto, max(30 s, 5 x slowest step %.2f s)",
                  slowest_step_s);
  }
  d.rule = b;
  d.long_s = std::max(300.0, d.normal_s);
  return d;
}

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::None: return "none";
    case Cause::Dead: return "dead";
    case Cause::Stopped: return "stopped";
    case Cause::Stale: return "stale";
    case Cause::NoHeartbeat: return "no_heartbeat";
    case Cause::Behind: return "behind";
    case Cause::Busy: return "busy";
    case Cause::Exited: return "exited";
    case Cause::Cycle: return "cycle";
  }
  return "none";
}

Culprit find_culprit(const Heartbeat& me, const std::function<PeerView(int)>& peer,
                     double stale_s) {
  std::vector<int> chain;
  if (!me.waiting) return {};
  return examine(me, peer, stale_s, chain);
}

bool should_fire(double waited_s, const Culprit& c, bool me_long_phase, const Deadlines& d) {
  if (c.cause == Cause::Dead || c.cause == Cause::Exited) return waited_s >= 1.0;
  if (waited_s < d.normal_s) return false;
  switch (c.cause) {
    case Cause::Stale:  // in a disk wait: the long deadline
      return !c.long_phase || waited_s >= d.long_s;
    case Cause::Stopped:
    case Cause::NoHeartbeat:
      return true;
    default:  // alive: a long phase here or there may legitimately take longer
      return !(me_long_phase || c.long_phase) || waited_s >= d.long_s;
  }
}

std::string describe_culprit(const Culprit& c) {
  if (c.cause == Cause::None || c.cause == Cause::Cycle) return c.detail;
  std::ostringstream os;
  os << rank_word(c.launcher_rank, c.rank);
  if (!c.host.empty()) os << " (host " << c.host << ", pid " << c.pid << ")";
  os << " " << c.detail;
  return os.str();
}

std::string describe_wait(const Heartbeat& me, const std::function<PeerView(int)>& peer) {
  if (!me.waiting) return "no communication operation";
  std::ostringstream os;
  const HeartbeatGroup* g = me.group(me.wait_group);
  os << "group " << (g ? g->name : me.wait_group);
  if (g) {
    os << " (ranks ";
    for (size_t i = 0; i < g->members.size(); ++i) {
      const int m = g->members[i];
      const int r = m == me.launcher_rank ? me.rank : layout_rank(m, peer);
      os << (i ? "," : "") << (r >= 0 ? std::to_string(r) : "L" + std::to_string(m));
    }
    os << ")";
  }
  os << " " << op_name(me.wait_op) << " #" << me.wait_seq;
  if (me.wait_peer >= 0)
    os << (me.wait_op == Op::Send ? " to " : " from ")
       << rank_word(me.wait_peer, layout_rank(me.wait_peer, peer));
  return os.str();
}

}  // namespace adgt::fault
