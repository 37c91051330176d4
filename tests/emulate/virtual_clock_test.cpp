// The emulation's virtual clock (emulate.clock: virtual; docs/emulation.md,
// "Clocks") on 4 ranks of an emulated cluster of 2 nodes x 2 ranks
// (tests/emulate/two_nodes.yaml):
//   mpirun -np 4 adgt_virtual_clock_test tests/emulate/two_nodes.yaml
// On a virtual clock every time is exact: a message's receiver reads the
// sender's clock at the send plus message_time, a collective ends on every
// member at the last entry plus collective_time (after the group's previous
// one), a rank that sleeps in wall time loses no virtual time, one that
// computes gains its CPU time, and a slowed rank's compute counts factor x.
// The checks compare with the cluster model's functions computed here and
// with the thread CPU time measured here, so they fail when the emulation
// times anything else (wall time, the CPU time spent inside calls, ...).
#include <mpi.h>
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "parallel/cluster/collectives.hpp"
#include "parallel/emulate/clock.hpp"
#include "parallel/emulate/emulated_comm.hpp"
#include "parallel/emulate/slowdown.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;
using adgt::cluster::Collective;
using adgt::emulate::EmulatedComm;

namespace {

double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Burns `s` seconds of this thread's CPU time.
void compute_for(double s) {
  const double end = thread_cpu() + s;
  volatile double x = 0;
  while (thread_cpu() < end)
    for (int i = 0; i < 1000; ++i) x = x + 1;
}

bool near(double a, double b, double tol = 1e-9) { return std::abs(a - b) <= tol; }

// A plain MPI call of the test itself: its CPU time (MPI spins while it
// waits) is not the rank's compute, so the clock is paused as in an
// emulated call.
template <class F>
void uncounted(emulate::Clock& c, F&& f) {
  c.pause();
  f();
  c.resume();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    if (argc < 2 || mpi.size() != 4) {
      std::fprintf(stderr, "usage: mpirun -np 4 %s CLUSTER.yaml\n", argv[0]);
      return 64;
    }
    const int me = mpi.rank();
    const cluster::Cluster cl = cluster::load_cluster(argv[1]);
    auto st = std::make_shared<emulate::EmulatedRank>(cl, me, std::vector<int>{},
                                                      emulate::ClockKind::Virtual);
    auto world = MpiComm::world();
    EmulatedComm c(*world, st, {0, 1, 2, 3}, world->split(0, world->rank(), "world"));
    emulate::Clock& clock = st->clock;
    if (const char* d = std::getenv("ADGT_EMULATE_TRACE"))
      st->trace = std::fopen((std::string(d) + "/vc_" + std::to_string(me) + ".jsonl").c_str(), "w");
    const std::vector<int> all{0, 1, 2, 3};

    // 1. A barrier lines the clocks up: every member ends at the same time.
    c.barrier();
    const double t0 = clock.now();
    {
      double b[2] = {t0, -t0};
      uncounted(clock, [&] { MPI_Allreduce(MPI_IN_PLACE, b, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); });
      PCHECK(near(b[0], -b[1], 1e-4), "after a barrier the clocks differ by " << b[0] + b[1] << " s");
    }

    // 2. Wall time is not virtual time; CPU time is. Rank 1 sleeps 150 ms,
    // rank 3 computes 30 ms; then an all-reduce of 1 MB: it begins at rank
    // 3's entry (the last) and every member ends there plus the model's time.
    std::vector<float> buf(250000, float(me + 1));
    const double c_before = clock.now();
    double cpu_spent = 0;
    if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    if (me == 3) {
      const double c0 = thread_cpu();
      compute_for(0.03);
      cpu_spent = thread_cpu() - c0;
    }
    const double entry = clock.now();
    if (me == 1)
      PCHECK(entry - c_before < 0.005, "a 150 ms sleep moved the virtual clock by "
                                           << (entry - c_before) * 1e3 << " ms");
    if (me == 3)
      PCHECK(entry - c_before >= cpu_spent - 1e-6 && entry - c_before < cpu_spent + 0.005,
             "30 ms of compute (" << cpu_spent * 1e3 << " ms CPU) moved the clock by "
                                  << (entry - c_before) * 1e3 << " ms");
    double last_entry = entry;
    uncounted(clock,
              [&] { MPI_Allreduce(MPI_IN_PLACE, &last_entry, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); });
    c.all_reduce(Tensor(buf.data(), DType::F32, {int64_t(buf.size())}));
    const double want = last_entry + cluster::collective_time(cl, Collective::AllReduce, all, 1e6);
    PCHECK(near(clock.now(), want, 2e-4), "all-reduce ended at " << clock.now() - t0 << " s, model "
                                                                  << want - t0 << " s");
    PCHECK(buf[0] == 10.f && buf[249999] == 10.f, "all-reduce sum " << buf[0]);

    // 3. A message: the receiver's clock is the sender's at the send plus
    // message_time (here far ahead of the receiver, which waits).
    c.barrier();
    std::vector<float> msg(250000, 1.f);
    double sent_at = 0;
    if (me == 0) {
      compute_for(0.01);
      sent_at = clock.now();
      c.send(Tensor(msg.data(), DType::F32, {int64_t(msg.size())}), 2, 5);
      const double arr = sent_at + cluster::message_time(cl, 0, 2, 1e6);
      PCHECK(near(clock.now(), arr, 2e-4), "blocking send returned at +" << (clock.now() - sent_at) * 1e3
                                            << " ms, model " << (arr - sent_at) * 1e3 << " ms");
    }
    if (me == 2) c.recv(Tensor(msg.data(), DType::F32, {int64_t(msg.size())}), 0, 5);
    // After the message: MPI_Send may wait for its receive.
    uncounted(clock, [&] { MPI_Bcast(&sent_at, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); });
    if (me == 2) {
      const double arr = sent_at + cluster::message_time(cl, 0, 2, 1e6);
      PCHECK(near(clock.now(), arr, 2e-4), "recv returned at " << clock.now() - sent_at
                                                               << " s after the send, model " << arr - sent_at);
    }

    // 4. Two started all-reduces run one after the other on the group; the
    // wait of the second ends at entry + 2 x the model's time.
    std::vector<float> b1(250000, 1.f), b2(250000, 2.f);
    c.barrier();
    const double e0 = clock.now();
    Work w1 = c.start_all_reduce(Tensor(b1.data(), DType::F32, {250000}));
    Work w2 = c.start_all_reduce(Tensor(b2.data(), DType::F32, {250000}));
    w2.wait();
    w1.wait();
    const double two = e0 + 2 * cluster::collective_time(cl, Collective::AllReduce, all, 1e6);
    PCHECK(near(clock.now(), two, 2e-4), "two started all-reduces ended at +" << (clock.now() - e0) * 1e3
                                           << " ms, model " << (two - e0) * 1e3 << " ms");

    // 5. A slowed rank: factor 3 on 20 ms of compute adds 40 ms, and no wall sleep.
    {
      emulate::ComputeSlowdown slow(3, st);
      const double v0 = clock.now(), c0 = thread_cpu();
      slow.begin();
      compute_for(0.02);
      // The catch-up alone: on a virtual clock it moves the clock 2 x the
      // compute on and sleeps nothing (the wall clock would sleep 40 ms).
      const double w0 = wall_seconds();
      slow.catch_up();
      const double dw = wall_seconds() - w0;
      const double cpu = thread_cpu() - c0, dv = clock.now() - v0;
      PCHECK(dv >= 3 * cpu - 1e-4 && dv <= 3 * cpu + 0.005,
             "a 3x slow rank's 20 ms (" << cpu * 1e3 << " ms CPU) took " << dv * 1e3 << " virtual ms");
      // Wall time is printed, not bounded: a loaded host may deschedule the
      // rank for as long as the sleep would have taken.
      if (me == 0) std::printf("  a 3x slow rank's catch-up: %.3f ms of wall time\n", dw * 1e3);
    }

    MPI_Barrier(MPI_COMM_WORLD);
    const long failures = ptest::tally().failures;
    long total = failures;
    MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0 && total == 0)
      std::printf("virtual clock: ok on 4 ranks (%ld checks on rank 0)\n", ptest::tally().checks);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
