// MPI start-up and shutdown, the MPI check macro, and the error exit for mains.
//
//   int main(int argc, char** argv) {
//     try {
//       adgt::MpiEnv mpi(&argc, &argv);
//       auto pg = adgt::make_process_groups(layout);
//       ...
//     } catch (const std::exception& e) {
//       adgt::fatal(e);  // "error: rank R (host H): ..." and MPI_Abort: every rank exits non-zero
//     }
//   }
#pragma once
#include <mpi.h>

#include <exception>
#include <stdexcept>
#include <string>

#include "parallel/comm/launch.hpp"

namespace adgt {

// Initialises MPI (MPI_Init_thread, MPI_THREAD_FUNNELED: only the main thread
// calls MPI) and sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, so a failed call
// returns an error code that ADGT_MPI turns into an exception; communicators
// made from it inherit the handler. Finalizes on destruction, except while an
// exception propagates (then fatal() ends the job with MPI_Abort). The launch is
// detected first (launch()), so a wrong launch (srun without --mpi=pmix, an
// unknown launcher) fails with adgt's message before MPI_Init fails with its own.
class MpiEnv {
 public:
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }   // in MPI_COMM_WORLD
  int size() const { return size_; }
  const LaunchInfo& launch() const { return launch_; }

 private:
  LaunchInfo launch_;
  int rank_ = 0, size_ = 1;
  bool owns_ = false;  // false when MPI was already initialised by someone else
};

// "rank R, host H" for messages; before MPI starts R comes from the
// launcher's variables (OMPI_COMM_WORLD_RANK, SLURM_PROCID), else "?".
std::string rank_host();
int world_rank_or(int fallback);  // MPI_COMM_WORLD rank, fallback when MPI is not running

// An error that every rank of MPI_COMM_WORLD throws at the same point (a
// layout that does not match the launch, a device shared by two ranks).
// fatal() then lets every rank print it before the job ends.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void mpi_failed(const char* call, int code, const char* file, int line);

// The error exit for mains: prints "error: rank R (host H): <what>" to stderr,
// then MPI_Abort(MPI_COMM_WORLD, 1) when MPI runs with more than one rank (so
// every rank ends, non-zero, at once: no rank waits forever for a failed one),
// else exit(1). For a CollectiveError the ranks first meet (a non-blocking
// barrier, at most 10 s) so each one's message is out, then finalize and
// exit(1) together; if some rank does not arrive, MPI_Abort as above.
[[noreturn]] void fatal(const std::exception& e);

}  // namespace adgt

// Every MPI call goes through this: a failure throws std::runtime_error naming
// the call, the MPI error string, the rank, the host, the file and the line.
#define ADGT_MPI(call)                                                        \
  do {                                                                        \
    const int adgt_mpi_rc_ = (call);                                          \
    if (adgt_mpi_rc_ != MPI_SUCCESS)                                          \
      ::adgt::mpi_failed(#call, adgt_mpi_rc_, __FILE__, __LINE__);            \
  } while (0)
