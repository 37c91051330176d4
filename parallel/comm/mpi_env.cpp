#include "parallel/comm/mpi_env.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <thread>
#include <sstream>
#include <stdexcept>

namespace adgt {

namespace {
bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
}  // namespace

int world_rank_or(int fallback) {
  if (!mpi_running()) return fallback;
  int r = fallback;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS) return fallback;
  return r;
}

namespace {
// This process's rank as text: MPI's when MPI runs, else the launcher's
// variable (before MPI_Init or when the launch itself was refused), else "?".
std::string rank_label() {
  const int r = world_rank_or(-1);
  if (r >= 0) return std::to_string(r);
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "?";
}

// A single process's own Open MPI session directory base (see MpiEnv's
// constructor), removed when the process exits, error exits included.
std::string& private_session_base() {
  static std::string base;
  return base;
}

void remove_private_session_base() {
  std::error_code ec;
  if (!private_session_base().empty()) std::filesystem::remove_all(private_session_base(), ec);
}

// Open MPI 4.1 keeps every job's session files under one directory per host
// and user ($TMPDIR/ompi.HOST.UID), made by the first job to start and removed
// by the last to end: a process whose start meets another's end can find it
// made and gone again ("mkdir ...: File exists", orte_session_dir failed) and
// abort in MPI_Init. Seen with single-process runs started side by side. A
// single process has no peer to share session files with, so it gets a fresh
// base of its own; the variable is dropped again once MPI has read it, so
// nothing the process starts inherits it. A user's own setting wins.
// The base is named for the process (adgt-mpi.PID.XXXXXX); one whose
// process is gone (a SIGKILL skips the removal at exit) is removed by the
// next single process that starts, as tests/parallel/mpirun.sh does for
// launches.
void sweep_ended_session_bases(const std::string& dir) {
  std::error_code ec;
  const std::string prefix = "adgt-mpi.";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(digits));
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || st.st_uid != ::getuid() || !S_ISDIR(st.st_mode))
      continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);  // another sweep may meet it too: ignore
  }
}

void use_private_session_base() {
  if (std::getenv("OMPI_MCA_orte_tmpdir_base")) return;
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp && *tmp ? tmp : "/tmp";
  sweep_ended_session_bases(dir);
  std::string pattern = dir + "/adgt-mpi." + std::to_string(::getpid()) + ".XXXXXX";
  if (!::mkdtemp(pattern.data())) return;  // Open MPI's default then, as before
  private_session_base() = pattern;
  std::atexit(remove_private_session_base);
  ::setenv("OMPI_MCA_orte_tmpdir_base", pattern.c_str(), 1);
}
}  // namespace

std::string rank_host() { return "rank " + rank_label() + ", host " + host_name(); }

void mpi_failed(const char* call, int code, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "MPI error %d", code);
  std::ostringstream os;
  os << "MPI call failed: " << call << ": " << msg << " (" << rank_host() << ", " << file << ":"
     << line << ")";
  throw std::runtime_error(os.str());
}

MpiEnv::MpiEnv(int* argc, char*** argv) : launch_(detect_launch()) {
  int init = 0;
  ADGT_MPI(MPI_Initialized(&init));
  if (!init) {
    // Without a launcher (one process started by hand), Open MPI's singleton
    // start forks an orted daemon, which only MPI_Comm_spawn needs (adgt never
    // spawns): 0.1-0.2 s and a second process on every single-process run.
    // A user's own setting wins.
    if (launch_.launcher == "single") {
      ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
      use_private_session_base();
    }
    int provided = 0;
    // SERIALIZED lets the pipeline executor's progress thread push pending sends
    // while the main thread computes (never at the same time as the main thread).
    const int init_rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (!private_session_base().empty()) ::unsetenv("OMPI_MCA_orte_tmpdir_base");
    ADGT_MPI(init_rc);
    owns_ = true;
    if (provided < MPI_THREAD_FUNNELED)
      throw std::runtime_error("MPI: MPI_Init_thread provided thread level " +
                               std::to_string(provided) + " < MPI_THREAD_FUNNELED");
  }
  ADGT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ADGT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ADGT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  if (size_ != launch_.world || rank_ != launch_.rank) {
    std::ostringstream os;
    os << "launch: " << launch_.launcher << " says rank " << launch_.rank << " of "
       << launch_.world << " but MPI says rank " << rank_ << " of " << size_;
    if (launch_.launcher == "srun") os << "; launch with `srun --mpi=pmix`";
    else if (launch_.launcher == "single")
      os << "; this MPI was started by a launcher adgt does not recognise: use Open MPI's mpirun or srun --mpi=pmix";
    else os << "; the program and mpirun must come from the same Open MPI";
    throw std::runtime_error(os.str());
  }
}

MpiEnv::~MpiEnv() {
  // While an exception unwinds through main, MPI stays up: MPI_Finalize would
  // wait for ranks that may never get there, and fatal() needs MPI to abort.
  if (owns_ && mpi_running() && std::uncaught_exceptions() == 0) MPI_Finalize();
}

void fatal(const std::exception& e) {
  std::string line = "error: rank " + rank_label() + " (host " + host_name() + "): " + e.what() + "\n";
  std::fputs(line.c_str(), stderr);  // one write: lines of different ranks do not interleave
  std::fflush(stderr);
  std::fflush(stdout);
  int size = 1;
  if (!mpi_running() || MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS || size == 1)
    std::exit(1);
  if (dynamic_cast<const CollectiveError*>(&e)) {
    // Every rank is on its way here: wait (bounded) until all have printed,
    // then end together and cleanly.
    MPI_Request req;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      int done = 0;
      while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (done) {
        MPI_Finalize();
        std::exit(1);
      }
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

}  // namespace adgt
