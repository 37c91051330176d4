#include "parallel/fault/watchdog.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/comm.hpp"
#include "core/config.hpp"

namespace adgt::fault {

namespace {
std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s);
  return b;
}

// Same host only: kill(pid, 0) tells a gone process; /proc tells a stopped one.
Liveness local_liveness(int pid) {
  if (pid <= 0) return Liveness::Unknown;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return Liveness::Dead;
  const auto stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return Liveness::Running;
  const size_t p = stat->rfind(") ");
  if (p == std::string::npos || p + 2 >= stat->size()) return Liveness::Running;
  const char st = (*stat)[p + 2];
  if (st == 'T' || st == 't') return Liveness::Stopped;
  if (st == 'Z' || st == 'X') return Liveness::Dead;
  // Any thread in an uninterruptible (disk) wait: the main thread in an
  // fsync, or the heartbeat writer behind the journal.
  if (st == 'D') return Liveness::InIo;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const auto ts = read_small_file(t.path().string() + "/stat");
    const size_t q = ts ? ts->rfind(") ") : std::string::npos;
    if (q != std::string::npos && q + 2 < ts->size() && (*ts)[q + 2] == 'D') return Liveness::InIo;
  }
  return Liveness::Running;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }
}  // namespace

Watchdog::Watchdog(WatchdogOptions o) : o_(std::move(o)) {
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  int64_t since = 0;
  Heartbeat me = current(&since);
  write_beat(me);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(wake_mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  int64_t since = 0;
  Heartbeat me = current(&since);
  me.state = "done";
  write_beat(me);
}

Heartbeat Watchdog::current(int64_t* since_ns) const {
  Heartbeat h;
  h.token = o_.token;
  h.launcher_rank = o_.launcher_rank;
  h.rank = o_.rank;
  h.host = o_.host;
  h.pid = int(::getpid());
  h.beat = beat_;
  h.time_ns = system_ns();
  h.step = steps_finished();
  h.phase = current_phase();
  *since_ns = 0;
  const int64_t now = steady_ns();
  for (const GroupState& g : snapshot_groups()) {
    h.groups.push_back({g.key, g.name, g.members, g.seq, g.p2p});
    if (g.wait_id == 0) continue;
    // A wait is timed from the first tick that sees its id.
    auto& [id, first] = seen_[g.key];
    if (id != g.wait_id) id = g.wait_id, first = now;
    // The oldest wait is the one the thread is blocked in (nested waits are
    // another group's progress inside it).
    if (*since_ns == 0 || first < *since_ns) {
      *since_ns = first;
      h.waiting = true;
      h.wait_group = g.key;
      h.wait_op = g.wait_op;
      h.wait_seq = g.wait_seq;
      h.wait_peer = g.wait_peer;
      h.wait_s = double(now - first) * 1e-9;
    }
  }
  return h;
}

void Watchdog::write_beat(Heartbeat& me) {
  me.beat = ++beat_;
  me.time_ns = system_ns();
  (void)write_file_atomic(heartbeat_path(o_.dir, o_.launcher_rank), format_heartbeat(me));
}

PeerView Watchdog::view(int l, const Heartbeat& me) {
  PeerView v;
  if (l == o_.launcher_rank) {
    v.hb = &me;
    v.live = Liveness::Running;
    return v;
  }
  auto it = cache_.find(l);
  if (it == cache_.end()) {
    std::optional<Heartbeat> hb;
    if (const auto text = read_small_file(heartbeat_path(o_.dir, l))) {
      hb = parse_heartbeat(*text);
      if (hb && hb->token != o_.token) hb.reset();  // an earlier run's
    }
    it = cache_.emplace(l, std::move(hb)).first;
  }
  if (!it->second) return v;
  v.hb = &*it->second;
  v.age_s = std::max(0.0, double(system_ns() - v.hb->time_ns) * 1e-9);
  if (v.hb->host == o_.host) v.live = local_liveness(v.hb->pid);
  return v;
}

void Watchdog::say(const std::string& line) const {
  const std::string s =
      "error: rank " + std::to_string(o_.rank) + " (host " + o_.host + "): watchdog: " + line + "\n";
  (void)!::write(2, s.data(), s.size());  // one write: lines of ranks do not interleave
}

void Watchdog::fire(const Culprit& c, const Heartbeat& me, double waited_s, const std::string& why) {
  const auto peer = [&](int l) { return view(l, me); };
  std::string msg = describe_culprit(c) + "; rank " + std::to_string(o_.rank) + " waits in " +
                    describe_wait(me, peer) + " for " + secs(waited_s) + " s" + why;
  std::ostringstream v;
  v << "token " << o_.token << "\nby " << o_.rank << "\nculprit " << c.rank << "\nculprit_launcher "
    << c.launcher_rank << "\nculprit_host " << c.host << "\ncause " << cause_name(c.cause) << "\nmessage " << msg << "\n";
  (void)write_file_atomic(verdict_path(o_.dir, o_.token), v.str());
  say(msg);
  finish(me, c.launcher_rank);
}

void Watchdog::follow(const std::string& verdict, const Heartbeat& me) {
  std::istringstream is(verdict);
  std::string line, msg, by = "?";
  int culprit_launcher = -1;
  while (std::getline(is, line)) {
    if (line.rfind("message ", 0) == 0) msg = line.substr(8);
    else if (line.rfind("by ", 0) == 0) by = line.substr(3);
    else if (line.rfind("culprit_launcher ", 0) == 0) culprit_launcher = std::atoi(line.c_str() + 17);
  }
  const auto peer = [&](int l) { return view(l, me); };
  std::string mine = me.waiting ? "this rank waits in " + describe_wait(me, peer) + " for " +
                                      secs(me.wait_s) + " s"
                                : std::string("this rank waits in no operation (phase ") +
                                      phase_name(me.phase) + ", step " + std::to_string(me.step) + ")";
  if (culprit_launcher == o_.launcher_rank) mine = "this rank is the one named (resumed?)";
  say(msg + " [found by rank " + by + "]; " + mine);
  finish(me, culprit_launcher);
}

void Watchdog::finish(const Heartbeat& me_in, int skip) {
  Heartbeat me = me_in;
  me.state = "verdict";
  write_beat(me);
  // Every live rank prints its own line before the launcher ends the job.
  const auto until = steady_ns() + int64_t(3e9);
  while (steady_ns() < until) {
    bool all = true;
    cache_.clear();
    for (int l = 0; l < o_.world && all; ++l) {
      if (l == o_.launcher_rank || l == skip) continue;
      const PeerView v = view(l, me);
      if (!v.hb || v.live == Liveness::Dead || v.live == Liveness::Stopped || v.age_s > o_.stale_s)
        continue;
      all = v.hb->state != "running";
    }
    if (all) break;
    sleep_s(0.05);
  }
  run_abort_hooks();
  if (::ftrylockfile(stdout) == 0) {
    std::fflush(stdout);  // recursive lock: fine while held
    ::funlockfile(stdout);
  }
  ::_exit(o_.exit_code);
}

void Watchdog::run() {
  const std::string vpath = verdict_path(o_.dir, o_.token);
  int64_t last_beat = steady_ns(), last_check = 0;
  while (!stop_.load()) {
    {
      std::unique_lock<std::mutex> lk(wake_mu_);
      if (wake_.wait_for(lk, std::chrono::duration<double>(o_.tick_s), [this] { return stop_.load(); }))
        break;
    }
    int64_t since = 0;
    Heartbeat me = current(&since);
    const int64_t now = steady_ns();
    const double waited = since ? double(now - since) * 1e-9 : 0;
    const int sig = o_.stop_signal ? o_.stop_signal() : 0;
    const bool urgent = me.waiting && (waited > 1.0 || sig);
    if (double(now - last_beat) * 1e-9 >= (urgent ? 0.25 : o_.beat_s)) {
      last_beat = now;
      write_beat(me);
      if (const auto v = read_small_file(vpath); v && v->find("token " + o_.token) == 0)
        follow(*v, me);
    }
    if (!me.waiting) continue;
    cache_.clear();
    const auto peer = [&](int l) { return view(l, me); };
    if (sig) {
      // The launcher is ending the job (a rank died): diagnose at once from the heartbeats.
      for (int l = 0; l < o_.world; ++l) {
        if (l == o_.launcher_rank) continue;
        const PeerView v = view(l, me);
        if (!v.hb || v.hb->state != "running") continue;
        Cause c = Cause::None;
        if (v.live == Liveness::Dead) c = Cause::Dead;
        else if (v.live == Liveness::Stopped) c = Cause::Stopped;
        else if (v.age_s > o_.stale_s) c = Cause::Stale;
        if (c == Cause::None) continue;
        Culprit u;
        u.cause = c;
        u.launcher_rank = l;
        u.rank = v.hb->rank;
        u.host = v.hb->host;
        u.pid = v.hb->pid;
        u.age_s = v.age_s;
        u.detail = c == Cause::Dead ? "died: its process is gone (last heartbeat " +
                                          secs(v.age_s) + " s ago)"
                   : c == Cause::Stopped ? "stopped progressing: process stopped (SIGSTOP?), no "
                                           "heartbeat for " + secs(v.age_s) + " s"
                                         : "stopped progressing: no heartbeat for " +
                                               secs(v.age_s) + " s";
        fire(u, me, waited, "; signal " + std::to_string(sig) + " arrived (the launcher ends the job)");
      }
    }
    // Once a wait passes 1 s: check the peers it waits on each second.
    if (waited < 1.0 || double(now - last_check) * 1e-9 < 1.0) continue;
    last_check = now;
    const Culprit c = find_culprit(me, peer, o_.stale_s);
    const Deadlines d = deadlines_for(o_.collective_timeout_s, slowest_step_seconds());
    if (!should_fire(waited, c, is_long_phase(me.phase), d)) continue;
    std::string why;
    if (c.cause != Cause::Dead && c.cause != Cause::Exited) {
      const bool long_wait = waited >= d.long_s;
      why = " > " + d.rule + (long_wait ? " (long phase: " + secs(d.long_s) + " s)" : "");
    }
    fire(c, me, waited, why);
  }
}

std::unique_ptr<Watchdog> start_watchdog(const RunConfig& cfg, Comm& world, int launcher_rank,
                                         const std::string& host, std::function<int()> stop_signal) {
  const char* env = std::getenv("ADGT_WATCHDOG");
  const bool on = !(env && std::string(env) == "0");
  // The token: rank 0's start time and pid, so an earlier run's files are ignored.
  int32_t tok[3] = {0, 0, on ? 1 : 0};
  if (world.rank() == 0) {
    const int64_t ms = system_ns() / 1000000;
    tok[0] = int32_t(ms / 1000 % 1000000000);
    tok[1] = int32_t(ms % 1000) * 100000 + int32_t(::getpid() % 100000);
  }
  world.broadcast(Tensor(tok, DType::I32, {3}), 0);
  if (!tok[2]) return nullptr;  // rank 0 decides, so all agree
  WatchdogOptions o;
  o.dir = (std::filesystem::path(cfg.log.dir) / ".heartbeat").string();
  o.token = std::to_string(tok[0]) + "-" + std::to_string(tok[1]);
  o.launcher_rank = launcher_rank;
  o.rank = world.rank();
  o.world = world.size();
  o.host = host;
  o.collective_timeout_s = cfg.train.collective_timeout_s;
  o.stop_signal = std::move(stop_signal);
  return std::make_unique<Watchdog>(std::move(o));
}

}  // namespace adgt::fault
