// The heartbeat file each rank's watchdog writes about once a second into a
// directory all ranks share (<log.dir>/.heartbeat/rank<launcher rank>.hb,
// replaced by an atomic rename), and the verdict file the first rank to find
// a stopped peer writes there (verdict.<token>). Plain text, one field a line:
//
//   adgt-heartbeat 1
//   token 1733000000123-4242        the run (rank 0's start, broadcast): old files are ignored
//   launcher_rank 3                 MPI_COMM_WORLD rank (the file name)
//   rank 3                          layout rank (the trainer's numbering)
//   host node07
//   pid 12345
//   beat 17                         heartbeats written so far
//   time_ns 1733000017000000000     system clock at the write
//   step 12                         steps finished
//   phase train                     startup | train | checkpoint_save | checkpoint_load | eval
//   state running                   running | done (exited cleanly) | verdict (saw a verdict)
//   wait dp/0,1,2,3/0 all_reduce 418 -1 2.5   group key, op, seq, peer, seconds; or "wait -"
//   group tp/0,1/0 tp 0,1 419 0     key, name, members (launcher ranks), seq, p2p
//   group dp/0,1,2,3/0 dp 0,1,2,3 418 0
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/fault/progress.hpp"

namespace adgt::fault {

struct HeartbeatGroup {
  std::string key, name;
  std::vector<int> members;  // launcher ranks
  int64_t seq = 0, p2p = 0;
};

struct Heartbeat {
  std::string token;
  int launcher_rank = -1, rank = -1;
  std::string host;
  int pid = 0;
  int64_t beat = 0;
  int64_t time_ns = 0;  // system clock
  int64_t step = 0;
  Phase phase = Phase::Startup;
  std::string state = "running";  // running | done | verdict
  bool waiting = false;
  std::string wait_group;  // group key
  Op wait_op = Op::None;
  int64_t wait_seq = 0;
  int wait_peer = -1;  // launcher rank of a send/recv peer
  double wait_s = 0;
  std::vector<HeartbeatGroup> groups;

  const HeartbeatGroup* group(const std::string& key) const;
};

std::string format_heartbeat(const Heartbeat& h);
// nullopt when the text is not a whole heartbeat (a torn or foreign file).
std::optional<Heartbeat> parse_heartbeat(const std::string& text);

std::string heartbeat_path(const std::string& dir, int launcher_rank);
std::string verdict_path(const std::string& dir, const std::string& token);

// Writes path.tmp.<pid> and renames it over path: readers see the old or the
// new file, never a torn one. False on any failure (the watchdog goes on).
bool write_file_atomic(const std::string& path, const std::string& text);
std::optional<std::string> read_small_file(const std::string& path);

int64_t system_ns();  // std::chrono::system_clock, ns

}  // namespace adgt::fault
