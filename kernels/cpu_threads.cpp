// Threads per CPU rank (cpu_threads.hpp).
#include "kernels/cpu_threads.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <omp.h>

// OpenBLAS's own thread count: a pthreads build of OpenBLAS ignores OpenMP's
// (the OpenMP build follows it). Weak: absent from other BLAS libraries.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace adgt {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(std::thread::hardware_concurrency()));
}

namespace {
// A positive integer at the start of an environment variable (OMP_NUM_THREADS
// may be a list for nested levels: "4,2" -> 4); 0 when unset or not one.
int env_threads(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && n > 0 && n < 1 << 16 ? int(n) : 0;
}
}  // namespace

RankThreads rank_threads(int ranks_on_host, int cores) {
  RankThreads r;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (const int n = env_threads(name)) {
      r.threads = n;
      r.from_env = true;
      r.why = std::string(name) + "=" + std::to_string(n);
      return r;
    }
  }
  ranks_on_host = std::max(1, ranks_on_host);
  // This process's cores when the launcher bound it to fewer than the host's
  // (srun --cpus-per-task, mpirun --bind-to core or socket): at most those.
  const int bound = cores > 0 ? cores : usable_cores();
  if (cores <= 0) cores = std::max(bound, int(std::thread::hardware_concurrency()));
  r.threads = std::max(1, std::min(bound, cores / ranks_on_host));
  r.why = std::to_string(cores) + (cores == 1 ? " core / " : " cores / ") + std::to_string(ranks_on_host) +
          (ranks_on_host == 1 ? " rank" : " ranks") + " on this host";
  if (bound < cores)
    r.why += ", at most the " + std::to_string(bound) + " this rank is bound to";
  return r;
}

int set_cpu_threads(int threads) {
  const int was = omp_get_max_threads();
  threads = std::max(1, threads);
  omp_set_num_threads(threads);
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
  return was;
}

}  // namespace adgt
