// MpiComm's collectives and the process groups, under mpirun or srun with any
// number of ranks:   mpirun -np N adgt_parallel_collectives_test [--expect-launcher srun]
//
// Inputs are integer-valued, so every expected value below is computed
// directly from its definition and compared with exact equality; the
// floating-point ordering test rebuilds the documented reduction order by
// hand. Byte counters are compared with the analytic volumes of the ring
// algorithms. Prints every failure with its rank; exits non-zero on any.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/comm/launch.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/mesh/process_groups.hpp"
#include "tests/parallel/check.hpp"
#include "tests/parallel/int_data.hpp"

using namespace adgt;
using ptest::dtype_of;
using ptest::val;
using ptest::view;

namespace {

int64_t val_max(int r, int64_t i) { return (i * 3 + r * 5) % 23 - 11; }

// Elements of chunk c when n elements are cut over p ranks (first n % p get one more).
int64_t chunk_count(int64_t n, int p, int c) { return n / p + (c < n % p ? 1 : 0); }

template <class T> void test_all_reduce(MpiComm& comm, int64_t n) {
  const int p = comm.size(), r = comm.rank();
  const char* ty = dtype_name(dtype_of<T>());
  std::vector<T> x(n), m(n);
  for (int64_t i = 0; i < n; ++i) x[i] = T(val(r, i)), m[i] = T(val_max(r, i));
  comm.reset_stats();
  comm.all_reduce(view(x), ReduceOp::Sum);
  const int64_t es = sizeof(T);
  // Reduce-scatter sends every chunk but r, all-gather every chunk but r+1.
  const int64_t want_bytes = p == 1 ? 0 : 2 * n - chunk_count(n, p, r) - chunk_count(n, p, (r + 1) % p);
  if (n % p == 0) PCHECK(want_bytes == 2 * (p - 1) * (n / p), "formula");
  PCHECK(comm.stats().bytes == want_bytes * es,
         "all_reduce " << ty << " n=" << n << ": sent " << comm.stats().bytes << " bytes, want "
                       << want_bytes * es << " (2(p-1)/p x " << n * es << ")");
  PCHECK(comm.stats().calls == 1, "calls " << comm.stats().calls);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, i);
    if (x[i] != T(s) && bad++ < 3)
      PCHECK(x[i] == T(s), "all_reduce sum " << ty << " n=" << n << " [" << i << "] = " << x[i] << ", want " << s);
  }
  PCHECK(bad == 0, bad << " wrong elements");
  comm.all_reduce(view(m), ReduceOp::Max);
  bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t mx = val_max(0, i);
    for (int q = 1; q < p; ++q) mx = std::max(mx, val_max(q, i));
    if (m[i] != T(mx) && bad++ < 3)
      PCHECK(m[i] == T(mx), "all_reduce max " << ty << " n=" << n << " [" << i << "] = " << m[i] << ", want " << mx);
  }
  PCHECK(bad == 0, bad << " wrong elements");
}

// Non-integer fp32: the result must follow the documented order exactly
// (chunk c summed along ranks c+1, c+2, ..., c as ((x_{c+1} + x_{c+2}) + ...) + x_c),
// be bit-identical on every rank, and identical when repeated.
void test_float_order(MpiComm& comm, int64_t n) {
  const int p = comm.size(), r = comm.rank();
  auto x_of = [](int q, int64_t i) { return float(std::sin(0.37 * double(i) + 1.3 * q) * 1e3 / (q + 1)); };
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = y[i] = x_of(r, i);
  comm.all_reduce(view(x));
  comm.all_reduce(view(y));
  PCHECK(std::memcmp(x.data(), y.data(), n * sizeof(float)) == 0, "repeated all_reduce differs");
  int bad = 0;
  int64_t off = 0;
  for (int c = 0; c < p; ++c) {
    for (int64_t i = off; i < off + chunk_count(n, p, c); ++i) {
      float acc = x_of((c + 1) % p, i);
      for (int k = 2; k <= p; ++k) acc = acc + x_of((c + k) % p, i);
      if (p == 1) acc = x_of(0, i);
      if (std::memcmp(&acc, &x[i], 4) != 0 && bad++ < 3)
        PCHECK(false, "fp32 order: [" << i << "] = " << x[i] << ", documented order gives " << acc);
    }
    off += chunk_count(n, p, c);
  }
  PCHECK(bad == 0, bad << " elements differ from the documented order");
  std::vector<float> all(n * p);
  comm.all_gather(view(all), view(x));
  for (int q = 0; q < p; ++q)
    PCHECK(std::memcmp(all.data() + q * n, x.data(), n * sizeof(float)) == 0,
           "rank " << q << "'s all_reduce result differs in its bits from rank " << r << "'s");
}

template <class T> void test_reduce_scatter_all_gather(MpiComm& comm, int64_t n) {
  const int p = comm.size(), r = comm.rank();
  const int64_t es = sizeof(T);
  std::vector<T> in(n * p), out(n);
  for (int64_t i = 0; i < n * p; ++i) in[i] = T(val(r, i));
  comm.reset_stats();
  comm.reduce_scatter(view(out), view(in));
  PCHECK(comm.stats().bytes == (p - 1) * n * es,
         "reduce_scatter n=" << n << ": sent " << comm.stats().bytes << ", want " << (p - 1) * n * es);
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, r * n + i);
    PCHECK(out[i] == T(s), "reduce_scatter [" << i << "] = " << out[i] << ", want " << s);
  }
  std::vector<T> mine(n), all(n * p);
  for (int64_t i = 0; i < n; ++i) mine[i] = T(val(r, i) * 3 + r);
  comm.reset_stats();
  comm.all_gather(view(all), view(mine));
  PCHECK(comm.stats().bytes == (p - 1) * n * es,
         "all_gather n=" << n << ": sent " << comm.stats().bytes << ", want " << (p - 1) * n * es);
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < n; ++i)
      PCHECK(all[q * n + i] == T(val(q, i) * 3 + q),
             "all_gather chunk " << q << " [" << i << "] = " << all[q * n + i]);
}

void test_broadcast(MpiComm& comm, int64_t n, int root) {
  const int p = comm.size(), r = comm.rank();
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = r == root ? float(i % 1000 + root) : -1.f;
  comm.reset_stats();
  comm.broadcast(view(x), root);
  const int64_t want = (r + 1) % p == root ? 0 : n * 4;  // every rank but the chain's last sends it once
  PCHECK(comm.stats().bytes == want, "broadcast root " << root << ": sent " << comm.stats().bytes << ", want " << want);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += x[i] != float(i % 1000 + root);
  PCHECK(bad == 0, "broadcast root " << root << " n=" << n << ": " << bad << " wrong elements");
}

void test_send_recv_ring(MpiComm& comm) {
  const int p = comm.size(), r = comm.rank();
  if (p == 1) return;
  const int64_t n = 1000 + r;  // sizes differ per sender
  std::vector<double> out(n), in(1000 + (r - 1 + p) % p);
  for (int64_t i = 0; i < n; ++i) out[i] = double(r * 100000 + i);
  comm.reset_stats();
  const int next = (r + 1) % p, prev = (r - 1 + p) % p;
  if (r % 2 == 0) {
    comm.send(view(out), next, 7);
    comm.recv(view(in), prev, 7);
  } else {
    comm.recv(view(in), prev, 7);
    comm.send(view(out), next, 7);
  }
  PCHECK(comm.stats().bytes == n * 8, "send: sent " << comm.stats().bytes << ", want " << n * 8);
  for (size_t i = 0; i < in.size(); ++i)
    PCHECK(in[i] == double(prev * 100000 + int64_t(i)), "recv [" << i << "] = " << in[i]);
}

template <class T> void test_all_to_all(MpiComm& comm, int64_t n) {
  const int p = comm.size(), r = comm.rank();
  auto v = [](int from, int to, int64_t i) { return T(from * 1000 + to * 10 + i % 10); };
  std::vector<T> in(n * p), out(n * p);
  for (int j = 0; j < p; ++j)
    for (int64_t i = 0; i < n; ++i) in[j * n + i] = v(r, j, i);
  comm.reset_stats();
  comm.all_to_all(view(out), view(in));
  PCHECK(comm.stats().bytes == (p - 1) * n * int64_t(sizeof(T)), "all_to_all bytes " << comm.stats().bytes);
  for (int j = 0; j < p; ++j)
    for (int64_t i = 0; i < n; ++i)
      PCHECK(out[j * n + i] == v(j, r, i), "all_to_all from " << j << " [" << i << "] = " << out[j * n + i]);
}

// Uneven counts, zeros included: rank r sends cnt(r, j) elements to rank j.
template <class T> void test_all_to_allv(MpiComm& comm) {
  const int p = comm.size(), r = comm.rank();
  auto cnt = [](int from, int to) { return int64_t((from + 2 * to) % 4 + (from == to ? 1 : 0)); };
  auto v = [](int from, int to, int64_t k) { return T(from * 1000 + to * 10 + k); };
  std::vector<int64_t> sc(p), sd(p), rc(p), rd(p);
  int64_t stot = 0, rtot = 0, sent = 0;
  for (int j = 0; j < p; ++j) {
    sc[j] = cnt(r, j), sd[j] = stot + 1, stot += sc[j] + 1;  // gaps between the ranges
    rc[j] = cnt(j, r), rd[j] = rtot + 2, rtot += rc[j] + 2;
    if (j != r) sent += sc[j];
  }
  std::vector<T> in(stot + 1, T(-1)), out(rtot + 2, T(-7));
  for (int j = 0; j < p; ++j)
    for (int64_t k = 0; k < sc[j]; ++k) in[sd[j] + k] = v(r, j, k);
  comm.reset_stats();
  comm.all_to_allv(view(out), rc, rd, view(in), sc, sd);
  PCHECK(comm.stats().bytes == sent * int64_t(sizeof(T)), "all_to_allv bytes " << comm.stats().bytes << ", want " << sent * int64_t(sizeof(T)));
  std::vector<T> want(rtot + 2, T(-7));
  for (int j = 0; j < p; ++j)
    for (int64_t k = 0; k < rc[j]; ++k) want[rd[j] + k] = v(j, r, k);
  for (size_t i = 0; i < out.size(); ++i)
    PCHECK(out[i] == want[i], "all_to_allv out[" << i << "] = " << out[i] << ", want " << want[i]);
}

// A group of one copies and sends nothing.
// Started collectives (Comm::start_*): several pending at once on one group,
// waited in reverse order with a blocking call and a test() loop in between,
// give exactly the blocking results (integers: exact sums; floats: the same
// bits as the blocking all-reduce of the same data), and count their calls
// and bytes once.
void test_async(MpiComm& comm) {
  const int p = comm.size(), r = comm.rank();
  const int64_t n = 1000 + p;
  std::vector<int32_t> a(n), want(n, 0);
  std::vector<float> f(n), fb(n);
  std::vector<double> rs_in(static_cast<size_t>(n * p)), rs_out(static_cast<size_t>(n)),
      ag(static_cast<size_t>(n * p));
  for (int64_t i = 0; i < n; ++i) {
    a[i] = int32_t(val(r, i));
    for (int q = 0; q < p; ++q) want[i] += int32_t(val(q, i));
    f[i] = fb[i] = float(val(r, i)) / 7.0f + 1e-3f * float(i % 13);
  }
  for (int64_t i = 0; i < n * p; ++i) rs_in[size_t(i)] = double(val(r, i));
  comm.all_reduce(view(fb));  // the blocking reference for the float bits
  comm.reset_stats();
  std::vector<double> own(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) own[size_t(i)] = double(r * 1000 + i);
  Work w1 = comm.start_all_reduce(view(a));
  Work w2 = comm.start_all_reduce(view(f));
  Work w3 = comm.start_reduce_scatter(view(rs_out), view(rs_in));
  Work w4 = comm.start_all_gather(view(ag), view(own));
  double probe[1] = {double(r)};
  comm.all_reduce(Tensor(probe, DType::F64, {1}), ReduceOp::Max);  // blocking, while 4 are pending
  PCHECK(probe[0] == double(p - 1), "blocking max among pending works: " << probe[0]);
  for (int spin = 0; spin < 1000 && !w3.test(); ++spin) {
  }
  w4.wait();
  w3.wait();
  w2.wait();
  w1.wait();
  PCHECK(!w1.pending() && w1.test(), "a waited Work is complete");
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad += a[i] != want[i];
    bad += std::memcmp(&f[i], &fb[i], 4) != 0;
    double s = 0;
    for (int q = 0; q < p; ++q) s += double(val(q, r * n + i));
    bad += rs_out[size_t(i)] != s;
    for (int q = 0; q < p; ++q) bad += ag[size_t(q * n + i)] != double(q * 1000 + i);
  }
  PCHECK(bad == 0, "async collectives: " << bad << " wrong elements");
  PCHECK(comm.stats().calls == 5, "async calls " << comm.stats().calls << ", want 5");
  const int64_t want_bytes =
      p == 1 ? 0
             : ring_all_reduce_sent(n, p, r) * 4 * 2 + ring_reduce_scatter_sent(n * p, p, r) * 8 +
                   ring_all_gather_sent(n * p, p, r) * 8 + ring_all_reduce_sent(1, p, r) * 8;
  PCHECK(comm.stats().bytes == want_bytes, "async bytes " << comm.stats().bytes << ", want " << want_bytes);
}

void test_self_group() {
  MpiComm self(MPI_COMM_SELF, "self", false);
  PCHECK(self.size() == 1 && self.rank() == 0, "MPI_COMM_SELF size " << self.size());
  std::vector<float> a = {1, 2, 3}, b(3);
  self.all_reduce(view(a));
  self.reduce_scatter(view(b), view(a));
  PCHECK(a == std::vector<float>({1, 2, 3}) && b == a, "size-1 all_reduce / reduce_scatter");
  std::vector<float> c(3);
  self.all_gather(view(c), view(a));
  self.all_to_all(view(b), view(c));
  self.broadcast(view(b), 0);
  self.barrier();
  PCHECK(b == a, "size-1 all_gather / all_to_all / broadcast");
  PCHECK(self.stats().bytes == 0 && self.stats().calls == 6, "size-1 stats: bytes " << self.stats().bytes << " calls " << self.stats().calls);
}

// Sub-communicators: the members MPI_Comm_split gave each group are those of
// group_ranks() (checked against a brute-force grouping in
// tests/unit/layout_test.cpp), in that order, and exact group sums.
void test_groups(const Layout& d) {
  ProcessGroups pg = make_process_groups(d);
  const int r = pg.world->rank();
  PCHECK(pg.coords == coords_of(d, r), "coords of rank " << r);
  struct G { Comm* c; std::vector<int> members; int my; };
  std::vector<G> groups;
  for (auto [g, c] : {std::pair{Group::tp, pg.tp.get()}, std::pair{Group::dp, pg.dp.get()},
                      std::pair{Group::pp, pg.pp.get()}, std::pair{Group::ep, pg.ep.get()},
                      std::pair{Group::edp, pg.edp.get()}})
    groups.push_back({c, group_ranks(d, g, r), group_rank(d, g, r)});
  const std::string layout = "tp=" + std::to_string(d.tp) + " dp=" + std::to_string(d.dp) +
                             " pp=" + std::to_string(d.pp) + " ep=" + std::to_string(d.ep);
  for (G& g : groups) {
    const int n = int(g.members.size());
    PCHECK(g.c->size() == n && g.c->rank() == g.my,
           layout << " group " << g.c->name() << ": size " << g.c->size() << " rank " << g.c->rank() << ", want " << n << " " << g.my);
    std::vector<int32_t> me = {r}, all(n);
    g.c->all_gather(view(all), view(me));
    PCHECK(all == std::vector<int32_t>(g.members.begin(), g.members.end()),
           layout << " group " << g.c->name() << " of rank " << r << " has the wrong members");
    std::vector<double> x(5);
    for (int i = 0; i < 5; ++i) x[i] = (r + 1) * 1000.0 + i;
    g.c->all_reduce(view(x));
    for (int i = 0; i < 5; ++i) {
      double s = 0;
      for (int m : g.members) s += (m + 1) * 1000.0 + i;
      PCHECK(x[i] == s, layout << " " << g.c->name() << " all_reduce [" << i << "] = " << x[i] << ", want " << s);
    }
  }
  const std::string table = rank_table(pg, "cpu");
  if (r == 0) {
    int lines = 0;
    for (char ch : table) lines += ch == '\n';
    PCHECK(lines == d.world() + 2, "rank table has " << lines << " lines:\n" << table);
  } else {
    PCHECK(table.empty(), "rank table on rank " << r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    std::string expect_launcher;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--expect-launcher") expect_launcher = argv[i + 1];
    auto world = MpiComm::world();
    const int p = world->size();
    if (!expect_launcher.empty())
      PCHECK(mpi.launch().launcher == expect_launcher,
             "launcher '" << mpi.launch().launcher << "', want '" << expect_launcher << "'");
    PCHECK(mpi.launch().rank == world->rank() && mpi.launch().world == p, "launch vs MPI");

    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(p * 5), int64_t(1021), int64_t(840 * 3)}) {
      test_all_reduce<float>(*world, n);
      test_all_reduce<double>(*world, n);
      test_all_reduce<int32_t>(*world, n);
    }
    test_float_order(*world, 1003);
    for (int64_t n : {int64_t(1), int64_t(13), int64_t(256)}) {
      test_reduce_scatter_all_gather<float>(*world, n);
      test_reduce_scatter_all_gather<double>(*world, n);
      test_reduce_scatter_all_gather<int32_t>(*world, n);
    }
    test_broadcast(*world, 3 * (1 << 20) + 5, p - 1);  // crosses the 4 MiB pipelining piece
    test_broadcast(*world, 33, 0);
    test_send_recv_ring(*world);
    test_all_to_all<float>(*world, 3);
    test_all_to_all<int32_t>(*world, 1);
    test_all_to_allv<int32_t>(*world);
    test_all_to_allv<double>(*world);
    test_async(*world);
    world->barrier();
    test_self_group();

    // (tp, dp, pp, ep); each runs where it fits the world size.
    const int layouts[][4] = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {3, 1, 1, 1},
                              {1, 3, 1, 1}, {2, 2, 1, 1}, {1, 2, 2, 1}, {4, 2, 1, 1}, {2, 4, 1, 1},
                              {8, 1, 1, 1}, {2, 2, 2, 1}, {1, 2, 1, 2}, {1, 4, 1, 2}, {1, 4, 1, 4},
                              {2, 2, 1, 2}, {1, 2, 2, 2}, {2, 4, 1, 2}, {1, 8, 1, 2}};
    int layouts_run = 0;
    for (const auto& l : layouts) {
      Layout d;
      d.tp = l[0], d.dp = l[1], d.pp = l[2], d.ep = l[3];
      if (d.world() == p) test_groups(d), ++layouts_run;
    }

    const auto& t = ptest::tally();
    long fails = t.failures, total = 0, checks = t.checks;
    ADGT_MPI(MPI_Allreduce(&fails, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (world->rank() == 0)
      std::printf("collectives: %s on %d ranks (launcher %s): %ld checks on rank 0, %d layouts, %ld failures in all\n",
                  total ? "FAILED" : "ok", p, mpi.launch().launcher.c_str(), checks, layouts_run, total);
    world.reset();
    return total ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
