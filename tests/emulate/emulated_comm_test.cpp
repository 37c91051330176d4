// EmulatedComm against the cluster model, on 4 ranks with an emulated
// cluster of 2 nodes x 2 ranks (tests/emulate/two_nodes.yaml):
//   mpirun -np 4 adgt_emulated_comm_test tests/emulate/two_nodes.yaml
// Each measured time must be at least the model's (message_time,
// collective_time of parallel/cluster/collectives.hpp): no load can make a
// sleep shorter. The upper bound, model x 1.3 + 3 ms, is printed beside each
// time and asserted only with --strict (scripts/bench.sh): a loaded host
// lengthens any wall-clock wait (the exact times are the virtual clock's test,
// virtual_clock_test.cpp). Likewise a started message or collective must not
// be complete before the model's time has passed: checked whenever the
// check itself runs before then.
// Payloads are integer-valued and must arrive exactly; the inner transport's
// byte counts must not see the emulation's own messages; every member must
// compute the same end for a collective. Prints every failure with its rank.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "parallel/cluster/collectives.hpp"
#include "parallel/measure/pipeline_times.hpp"
#include "parallel/emulate/clock.hpp"
#include "parallel/emulate/emulated_comm.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/engine/engine.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/mesh/process_groups.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;
using adgt::cluster::Collective;
using adgt::emulate::EmulatedComm;

namespace {

constexpr double kSlackFactor = 1.3, kSlackSeconds = 3e-3;
bool g_strict = false;  // --strict: the upper bounds are failures too
constexpr int64_t kFloats = 250000;  // 1 MB of f32

Tensor view(std::vector<float>& v) { return Tensor(v.data(), DType::F32, {int64_t(v.size())}); }
float val(int r, int64_t i) { return float((i * 7 + r * 13) % 101 - 50 + r); }

MPI_Comm as_mpi_handle(const Comm& c) { return dynamic_cast<const MpiComm&>(c).handle(); }

// Max over the group's MPI communicator (plain MPI, outside the emulation).
double group_max(double x, MPI_Comm g) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, g);
  return x;
}

// print: this rank reports the time (one rank per check).
void check_time(const char* what, double measured, double model, bool print) {
  PCHECK(measured >= model, what << ": took " << measured * 1e3 << " ms, less than the model's "
                                 << model * 1e3 << " ms");
  const bool over = measured > model * kSlackFactor + kSlackSeconds;
  if (g_strict)
    PCHECK(!over, what << ": took " << measured * 1e3 << " ms, more than the model's " << model * 1e3
                       << " ms x " << kSlackFactor << " + " << kSlackSeconds * 1e3 << " ms");
  if (print) {
    std::printf("  %-40s model %8.3f ms, measured %8.3f ms%s\n", what, model * 1e3, measured * 1e3,
                over ? " (over the slack: a loaded host)" : "");
    std::fflush(stdout);
  }
}

// Group rank `from` sends 1 MB to `to`; the receiver checks the payload and
// the time from the sender's start to its own return. g: the group's MPI communicator.
// header: the bytes the group's transport counts beyond the payload (16 when
// the arrival and departure header goes through it, 0 with a private control
// channel). factor: emulate.slow_links' factor of the link (set by the caller
// in the sender's EmulatedRank::link_slowdown). The receiver's link time of
// the message (EmulatedRank::link_in) must be the model's exactly.
void test_send_recv(EmulatedComm& c, MPI_Comm g, emulate::EmulatedRank& st, int from, int to,
                    int64_t header, const char* what, double factor = 1) {
  const int me = c.rank();
  std::vector<float> x(kFloats);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = 0, t1 = 0;
  if (me == from) {
    for (int64_t i = 0; i < kFloats; ++i) x[size_t(i)] = val(from, i);
    const int64_t b0 = c.stats().bytes;
    t0 = wall_seconds();
    c.send(view(x), to, 5);
    t1 = wall_seconds();
    PCHECK(c.stats().bytes - b0 == kFloats * 4 + header,
           what << ": the group counted " << c.stats().bytes - b0 << " bytes sent, want "
                << kFloats * 4 + header);
  } else if (me == to) {
    st.link_in.clear();
    c.recv(view(x), from, 5);
    t1 = wall_seconds();
    int bad = 0;
    for (int64_t i = 0; i < kFloats; ++i) bad += x[size_t(i)] != val(from, i);
    PCHECK(bad == 0, what << ": " << bad << " elements differ");
  }
  const double start = group_max(me == from ? t0 : 0, g);
  const double model = factor * cluster::message_time(st.cluster, c.members()[size_t(from)],
                                                      c.members()[size_t(to)], kFloats * 4.0);
  if (me == to) {
    check_time(what, t1 - start, model, true);
    const auto it = st.link_in.find({c.name(), from});
    PCHECK(it != st.link_in.end() && it->second.messages == 1 &&
               std::fabs(it->second.seconds - model) <= 1e-9 * (1 + model) &&  // clock values ~1e5 s
               it->second.bytes == kFloats * 4.0,
           what << ": the receiver's link time of the message is "
                << (it == st.link_in.end() ? -1.0 : it->second.seconds) * 1e3 << " ms, want the model's "
                << model * 1e3 << " ms");
  }
  if (me == from) {  // a blocking send completes when its message has arrived
    PCHECK(t1 - t0 >= model, what << ": the send returned after " << (t1 - t0) * 1e3
                                  << " ms, before the message arrived (" << model * 1e3 << " ms)");
  }
}

// probe_link_times (parallel/measure/pipeline_times.hpp, the pipeline's link timing on
// real transports) over the emulated chain 0-1-2-3 (link 1 crosses the
// nodes): each link's probed time is the model's one-way time of the
// message, within check_time's slack; `slow`: link 1 emulate.slow_links 4x.
void test_probe(EmulatedComm& c, emulate::EmulatedRank& st, bool slow) {
  const int me = c.rank();
  std::vector<float> x(kFloats / 10);  // 100 KB: 12 ms across the nodes
  if (slow && (me == 1 || me == 2)) st.link_slowdown[me == 1 ? 2 : 1] = 4;
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<double> t =
      probe_link_times(c, view(x), false, 2, [] { return wall_seconds(); });
  st.link_slowdown.clear();
  PCHECK(t.size() == 3, "probe: " << t.size() << " links, want 3");
  for (int k = 0; k < 3 && k < int(t.size()); ++k) {
    const double model = (slow && k == 1 ? 4 : 1) *
                         cluster::message_time(st.cluster, c.members()[size_t(k)],
                                               c.members()[size_t(k + 1)], double(x.size()) * 4);
    const std::string what = std::string("probe link ") + std::to_string(k) + (slow ? " (link 1 4x)" : "");
    if (me == 0) check_time(what.c_str(), t[size_t(k)], model, true);
  }
}

// Two isends in a row to one peer: the second leaves when the first has arrived.
void test_isend_serialized(EmulatedComm& c, const emulate::EmulatedRank& st, int from, int to) {
  const int me = c.rank();
  std::vector<float> a(kFloats), b(kFloats);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = 0, t1 = 0;
  if (me == from) {
    for (int64_t i = 0; i < kFloats; ++i) a[size_t(i)] = val(1, i), b[size_t(i)] = val(2, i);
    t0 = wall_seconds();
    const int64_t ia = c.isend(view(a), to, 7);
    const int64_t ib = c.isend(view(b), to, 8);
    // Not blocking: neither send is done before a message's model time has
    // passed (checked when this check runs before then; a loaded host may
    // deschedule us for longer).
    const bool early = wall_seconds() - t0 < cluster::message_time(st.cluster, from, to, kFloats * 4.0);
    const bool done = c.send_done(ia) || c.send_done(ib);
    PCHECK(!early || !done, "an isend completed before its message arrived");
    c.wait_sends();
  } else if (me == to) {
    c.recv(view(b), from, 8);
    c.recv(view(a), from, 7);
    t1 = wall_seconds();
    int bad = 0;
    for (int64_t i = 0; i < kFloats; ++i) bad += a[size_t(i)] != val(1, i) || b[size_t(i)] != val(2, i);
    PCHECK(bad == 0, "two isends: " << bad << " elements differ");
  }
  const double start = group_max(me == from ? t0 : 0, MPI_COMM_WORLD);
  const cluster::Cluster& cl = st.cluster;
  const double model = 2 * cluster::message_time(cl, from, to, kFloats * 4.0);
  if (me == to) check_time("two isends to one peer", t1 - start, model, true);
}

// A blocking all-reduce of 1 MB (or its started form): from the last entry to the return.
void test_all_reduce(EmulatedComm& c, MPI_Comm g, const emulate::EmulatedRank& st, bool async,
                     int count, const char* what) {
  const int p = c.size();
  std::vector<std::vector<float>> x(static_cast<size_t>(count), std::vector<float>(kFloats, 0.0f));
  for (int k = 0; k < count; ++k)
    for (int64_t i = 0; i < kFloats; ++i) x[size_t(k)][size_t(i)] = val(st.world_rank + k, i);
  MPI_Barrier(MPI_COMM_WORLD);
  const double entry = wall_seconds();
  if (!async) {
    c.all_reduce(view(x[0]));
  } else {
    std::vector<Work> w;
    for (int k = 0; k < count; ++k) w.push_back(c.start_all_reduce(view(x[size_t(k)])));
    // Not complete before the model's time has passed since the start
    // (checked when the check runs before then).
    const double one = cluster::collective_time(st.cluster, Collective::AllReduce, c.members(), kFloats * 4.0);
    const auto not_done_early = [&](const char* when) {
      const bool early = wall_seconds() - entry < one;
      const bool done = w.back().test();
      PCHECK(!early || !done, what << ": complete " << when << ", before the model's " << one * 1e3 << " ms");
    };
    not_done_early("right after the start");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // "compute"
    not_done_early("after 10 ms");
    for (Work& wk : w) wk.wait();
  }
  const double end = wall_seconds();
  const double last_entry = group_max(entry, g);
  const double model =
      count * cluster::collective_time(st.cluster, Collective::AllReduce, c.members(), kFloats * 4.0);
  check_time(what, end - last_entry, model, c.rank() == 0 && st.world_rank == 0);
  int bad = 0;
  for (int k = 0; k < count; ++k)
    for (int64_t i = 0; i < kFloats; ++i) {
      float s = 0;
      for (int q = 0; q < p; ++q) s += val(c.members()[size_t(q)] + k, i);
      bad += x[size_t(k)][size_t(i)] != s;
    }
  PCHECK(bad == 0, what << ": " << bad << " elements differ");
  // Every member resolved the same end.
  double e[2] = {c.last_collective_end(), -c.last_collective_end()};
  MPI_Allreduce(MPI_IN_PLACE, e, 2, MPI_DOUBLE, MPI_MAX, g);
  PCHECK(e[0] == -e[1], what << ": the members' emulated ends differ by " << (e[0] + e[1]) * 1e3 << " ms");
}

// The run's set-up: tp=2 x dp=2 groups wrapped by wrap_emulated_groups (tp
// inside a node, dp across), their members, a dp all-reduce's time, and the
// rank table's emulation column.
void test_groups(const char* cluster_file) {
  RunConfig cfg;
  cfg.parallel.tp = 2;
  cfg.parallel.dp = 2;
  cfg.emulate.cluster = cluster_file;
  cfg.emulate.slow_ranks = "3:2";
  ProcessGroups pg = make_process_groups(layout_of(cfg));
  const int me = pg.world->rank();
  auto emu = emulate::setup_emulation(cfg, pg.world.get(), me);
  const std::string table = rank_table(pg, "cpu", "mpi", emu.get());
  if (me == 0) {
    PCHECK(table.find("  emulation: cluster two-nodes (") != std::string::npos &&
               table.find("compute slowdown rank 3 x2") != std::string::npos,
           "no emulation line in the rank table:\n" << table);
    PCHECK(table.find("collectives  emulated\n") != std::string::npos &&
               table.find("mpi          node 1, compute x2\n") != std::string::npos,
           "no emulated column in the rank table:\n" << table);
    std::printf("%s", table.c_str());
  }
  ParallelContext ctx;
  ctx.tp = pg.tp.get(), ctx.dp = pg.dp.get(), ctx.pp = pg.pp.get();
  ctx.ep = pg.ep.get(), ctx.edp = pg.edp.get(), ctx.world = pg.world.get();
  ctx.world_rank = me;
  ctx.layout = pg.layout;
  auto owned = emulate::wrap_emulated_groups(ctx, *emu);
  PCHECK(owned.size() == 6, owned.size() << " wrapped groups, want 6");
  PCHECK(ctx.slowdown == &emu->slowdown && emu->slowdown.factor() == (me == 3 ? 2.0 : 1.0),
         "slowdown factor " << emu->slowdown.factor());
  auto* dp = dynamic_cast<EmulatedComm*>(ctx.dp);
  auto* tp = dynamic_cast<EmulatedComm*>(ctx.tp);
  PCHECK(dp && tp && ctx.dp != pg.dp.get(), "the groups are not wrapped");
  if (!dp || !tp) return;
  PCHECK(tp->members() == group_ranks(*ctx.layout, Group::tp, me) &&
             dp->members() == (std::vector<int>{me % 2, me % 2 + 2}),
         "members of rank " << me);
  test_all_reduce(*dp, as_mpi_handle(*pg.dp), *emu->state, false, 1, "dp all-reduce 1 MB of a tp2 x dp2 run");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    g_strict = argc > 2 && std::string(argv[2]) == "--strict";
    if (argc < 2 || mpi.size() != 4) {
      std::fprintf(stderr, "usage: mpirun -np 4 %s CLUSTER.yaml [--strict]\n", argv[0]);
      return 64;
    }
    auto st = std::make_shared<emulate::EmulatedRank>(cluster::load_cluster(argv[1]), mpi.rank());
    auto world = MpiComm::world();
    EmulatedComm c(*world, st, {0, 1, 2, 3}, world->split(0, world->rank(), "world"));

    const MPI_Comm w = MPI_COMM_WORLD;
    test_send_recv(c, w, *st, 0, 2, 0, "send/recv 1 MB across nodes");
    test_send_recv(c, w, *st, 3, 2, 0, "send/recv 1 MB within a node");
    // emulate.slow_links: rank 0's link to rank 2 4x slower (as at_step sets it).
    if (world->rank() == 0) st->link_slowdown[2] = 4;
    test_send_recv(c, w, *st, 0, 2, 0, "send/recv 1 MB across nodes, link 4x slower", 4);
    st->link_slowdown.clear();
    test_probe(c, *st, false);
    test_probe(c, *st, true);
    test_isend_serialized(c, *st, 1, 3);
    test_all_reduce(c, w, *st, false, 1, "all-reduce 1 MB, 4 ranks on 2 nodes");
    test_all_reduce(c, w, *st, true, 1, "started all-reduce 1 MB");
    test_all_reduce(c, w, *st, true, 2, "two started all-reduces (one stream)");
    {
      // One rank per node: groups {0, 2} and {1, 3}; the control channel is the group itself.
      auto pair = world->split(world->rank() % 2, world->rank(), "dp");
      EmulatedComm d(*pair, st, {world->rank() % 2, world->rank() % 2 + 2});
      test_all_reduce(d, pair->handle(), *st, false, 1, "all-reduce 1 MB, 2 ranks on 2 nodes");
      test_send_recv(d, pair->handle(), *st, 0, 1, 16, "send/recv 1 MB, header on the group");
    }
    test_groups(argv[1]);
    MPI_Barrier(MPI_COMM_WORLD);
    const long failures = ptest::tally().failures;
    long all = failures;
    MPI_Allreduce(&failures, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (mpi.rank() == 0 && all == 0)
      std::printf("emulated comm: ok on 4 ranks (%ld checks on rank 0)\n", ptest::tally().checks);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
