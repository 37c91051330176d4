#include "parallel/comm/launch.hpp"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace adgt {

namespace {

const std::string* find(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("launch: " + msg); }

int parse_int(const std::string& key, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX)
    fail(key + "='" + value + "' is not an integer");
  return int(v);
}

int require_int(const EnvMap& env, const std::string& key, const std::string& launcher) {
  const std::string* v = find(env, key);
  if (!v) fail(launcher + " environment without " + key + "; is this process really started by " + launcher + "?");
  return parse_int(key, *v);
}

// Slurm's compressed per-node task counts: "2(x3),1" = nodes 0-2 run 2 tasks, node 3 runs 1.
int tasks_on_node(const std::string& key, const std::string& spec, int node) {
  int n = 0;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int count = 0, repeat = 1;
    auto paren = item.find("(x");
    if (paren == std::string::npos) {
      count = parse_int(key, item);
    } else {
      if (item.back() != ')') fail(key + "='" + spec + "' is not a Slurm task list like 2(x3),1");
      count = parse_int(key, item.substr(0, paren));
      repeat = parse_int(key, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node < n + repeat) return count;
    n += repeat;
  }
  fail(key + "='" + spec + "' has no entry for node " + std::to_string(node));
}

void check_ranges(const LaunchInfo& l, const std::string& vars) {
  if (l.world < 1 || l.rank < 0 || l.rank >= l.world || l.local_world < 1 || l.local_rank < 0 ||
      l.local_rank >= l.local_world || l.local_world > l.world) {
    std::ostringstream os;
    os << l.launcher << " gave rank " << l.rank << " of " << l.world << ", local rank "
       << l.local_rank << " of " << l.local_world << " (" << vars << "): inconsistent";
    fail(os.str());
  }
}

LaunchInfo from_mpirun(const EnvMap& env, const std::string& host) {
  LaunchInfo l;
  l.launcher = "mpirun";
  l.host = host;
  l.rank = require_int(env, "OMPI_COMM_WORLD_RANK", "mpirun");
  l.world = require_int(env, "OMPI_COMM_WORLD_SIZE", "mpirun");
  l.local_rank = require_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun");
  l.local_world = require_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun");
  check_ranges(l, "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE");
  return l;
}

LaunchInfo from_srun(const EnvMap& env, const std::string& host) {
  LaunchInfo l;
  l.launcher = "srun";
  l.host = host;
  l.rank = require_int(env, "SLURM_PROCID", "srun");
  l.world = find(env, "SLURM_STEP_NUM_TASKS") ? require_int(env, "SLURM_STEP_NUM_TASKS", "srun")
                                              : require_int(env, "SLURM_NTASKS", "srun");
  l.local_rank = require_int(env, "SLURM_LOCALID", "srun");
  if (const std::string* per_node = find(env, "SLURM_STEP_TASKS_PER_NODE")) {
    const int node = find(env, "SLURM_NODEID") ? require_int(env, "SLURM_NODEID", "srun") : 0;
    l.local_world = tasks_on_node("SLURM_STEP_TASKS_PER_NODE", *per_node, node);
  } else if (find(env, "SLURM_NTASKS_PER_NODE")) {
    l.local_world = require_int(env, "SLURM_NTASKS_PER_NODE", "srun");
  } else {
    fail("srun environment without SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE");
  }
  check_ranges(l, "SLURM_PROCID, SLURM_STEP_NUM_TASKS/SLURM_NTASKS, SLURM_LOCALID, "
                  "SLURM_STEP_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE");
  if (l.world > 1 && !find(env, "PMIX_RANK"))
    fail("srun started " + std::to_string(l.world) +
         " tasks without PMIx (PMIX_RANK is not set), so MPI cannot connect them; launch with "
         "`srun --mpi=pmix ...` (or set MpiDefault=pmix in slurm.conf)");
  return l;
}

// Variables of launchers adgt does not support, with whether their value says "several".
void refuse_unknown(const EnvMap& env) {
  static const char* kSeen[] = {"RANK",         "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "PMI_RANK",     "PMI_SIZE",   "PMIX_RANK",  "MV2_COMM_WORLD_SIZE",
                                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"};
  auto several = [&](const char* key) {
    const std::string* v = find(env, key);
    if (!v) return false;
    char* end = nullptr;
    long n = std::strtol(v->c_str(), &end, 10);
    return *end != '\0' || n > 1;  // a non-number counts as "several": refuse rather than guess
  };
  const bool slurm_batch = find(env, "SLURM_JOB_ID") && several("SLURM_NTASKS");
  const bool many = several("WORLD_SIZE") || several("PMI_SIZE") ||
                    several("MV2_COMM_WORLD_SIZE") || find(env, "PMIX_RANK") || slurm_batch;
  if (!many) return;
  std::string seen;
  for (const char* k : kSeen)
    if (const std::string* v = find(env, k)) seen += (seen.empty() ? "" : " ") + std::string(k) + "=" + *v;
  std::string hint;
  if (slurm_batch)
    hint = " (this looks like a Slurm batch script of several tasks: start the program with srun)";
  else if (find(env, "WORLD_SIZE"))
    hint = " (torchrun-style variables: adgt is not started by torchrun)";
  fail("unknown launcher: the environment says several processes (" + seen +
       ") but neither Open MPI's OMPI_COMM_WORLD_* nor a Slurm step's SLURM_STEP_ID is set" + hint +
       "; launch with `mpirun -np N ...` (Open MPI) or `srun --mpi=pmix -n N ...` (Slurm)");
}

}  // namespace

LaunchInfo detect_launch_from(const EnvMap& env, const std::string& host) {
  if (find(env, "OMPI_COMM_WORLD_SIZE")) return from_mpirun(env, host);
  if (find(env, "SLURM_STEP_ID") || find(env, "SLURM_STEPID")) return from_srun(env, host);
  refuse_unknown(env);
  LaunchInfo l;
  l.host = host;
  return l;
}

LaunchInfo detect_launch() {
  // The first answer (taken by MpiEnv before MPI_Init) is kept: MPI_Init itself
  // exports PMIX_* variables, even for a singleton run without a launcher, so a
  // later look at the environment would see a different launch.
  static const LaunchInfo first = detect_launch_from(environment(), host_name());
  return first;
}

EnvMap environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

}  // namespace adgt
