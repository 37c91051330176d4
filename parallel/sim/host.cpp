// Measuring the scheduler's slice (host.hpp).
#include "parallel/sim/host.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <omp.h>

#include "kernels/clock.hpp"
#include "parallel/sim/profile.hpp"

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

double measure_memory_bandwidth(int threads) {
  threads = std::max(1, threads);
  const size_t n = size_t(64) << 20 >> 3;  // 64 MiB of doubles per array
  std::vector<double> a(n), b(n), c(n);
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {
    const double t0 = wall_seconds();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0 * c[i];
    const double t = wall_seconds() - t0;
    if (pass > 0 && t > 0) best = std::max(best, 3.0 * 8.0 * double(n) / t);
  }
  return best;
}

double SharedMemoryCosts::seconds(const Op& op, int bytes) {
  const double t = inner_.seconds(op, bytes);
  if (running_ <= 1 || bw_ <= 0) return t;
  return std::max(t, running_ * DeviceModelCosts::bytes_moved(op, bytes) / bw_);
}

std::unique_ptr<OpCosts> shared_memory_costs(const cluster::Cluster& cl, ProfileCosts& pc,
                                             bool model_clock) {
  if (cl.cores_per_node <= 0 || model_clock) return nullptr;
  const double running = std::min<double>(
      double(cl.devices_per_node), std::max(1.0, double(cl.cores_per_node) / double(cl.rank_threads())));
  if (running <= 1) return nullptr;
  return std::make_unique<SharedMemoryCosts>(pc, pc.memory_bandwidth(int(cl.cores_per_node)), running);
}

std::string SharedMemoryCosts::describe() const {
  if (running_ <= 1 || bw_ <= 0) return inner_.describe();
  char b[160];
  std::snprintf(b, sizeof b, "; the host's memory %.3g GB/s shared by %.3g ranks at once", bw_ / 1e9,
                running_);
  return inner_.describe() + b;
}

int64_t emulated_host_cores(const RunConfig& cfg) {
  if (cfg.emulate.cluster.empty() || cfg.emulate.clock != "wall") return 0;
  return std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
}

}  // namespace adgt::sim
