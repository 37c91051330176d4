// The OpenMP/BLAS threads each CPU rank runs its ops with (docs/simulator.md,
// "Ranks sharing cores"). libgomp's default is every core of the host in every
// process, so N ranks on a host of C cores ran N x C threads, and each rank's
// ops were timed (by the simulator's profile) on C threads they never had.
// adgt-train now gives each rank max(1, cores / ranks on its host) threads
// unless OMP_NUM_THREADS says otherwise, and the simulator and the planner
// profile the ops at that count and share the host's cores between ranks
// that each want that many.
#pragma once
#include <string>

namespace adgt {

// Cores this process may run on (its CPU affinity: 1 under mpirun's
// --bind-to core), at least 1.
int usable_cores();

struct RankThreads {
  int threads = 1;
  bool from_env = false;  // OMP_NUM_THREADS (or OPENBLAS_NUM_THREADS) gave it
  std::string why;        // "OMP_NUM_THREADS=1", "2 cores / 2 ranks on this host"
};

// The threads of one of `ranks_on_host` CPU ranks: OMP_NUM_THREADS when set
// (a positive integer; the first of a list), else max(1, cores / ranks_on_host)
// over `cores` (0: the host's, and at most the cores this process is bound to:
// srun --cpus-per-task=8 gives 8, mpirun --bind-to core 1).
RankThreads rank_threads(int ranks_on_host, int cores = 0);

// Sets this process's OpenMP (and OpenBLAS, when it keeps its own count)
// threads to `threads`; returns the count it had.
int set_cpu_threads(int threads);

// Sets the threads for the scope, restores them after (the dry run profiles
// ops at the ranks' count, not its own).
class ScopedCpuThreads {
 public:
  explicit ScopedCpuThreads(int threads) : was_(set_cpu_threads(threads)) {}
  ~ScopedCpuThreads() { set_cpu_threads(was_); }
  ScopedCpuThreads(const ScopedCpuThreads&) = delete;
  ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

 private:
  int was_;
};

}  // namespace adgt
