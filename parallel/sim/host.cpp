// Measuring the scheduler's slice (host.hpp).
#include "parallel/sim/host.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "kernels/clock.hpp"

namespace adgt::sim {
double measure_scheduler_slice(int procs, double seconds) {
  std::vector<pid_t> kids;
  for (int i = 1; i < procs; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      volatile double x = 0;
      const double end = wall_seconds() + seconds + 0.2;
      while (wall_seconds() < end) x = x + 1;
      _exit(0);
    }
    if (pid > 0) kids.push_back(pid);
  }
  // Run lengths: stretches of this loop without a gap longer than 50 us.
  double start = wall_seconds(), last = start, run_start = start, total = 0;
  int runs = 0;
  const double end = start + seconds;
  while (last < end) {
    const double t = wall_seconds();
    if (t - last > 50e-6) {
      total += last - run_start;
      ++runs;
      run_start = t;
    }
    last = t;
  }
  for (pid_t k : kids) kill(k, SIGKILL);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  if (runs == 0) return 0;  // never switched out: every process had a core
  return total / runs;
}

double sync_wait(double slice, int procs, int cores) {
  if (cores <= 0 || procs <= cores) return 0;
  return slice * double(procs) / double(cores) / 3.0;
}

}  // namespace adgt::sim
