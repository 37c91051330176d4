// The hierarchical reduction over sites (parallel/comm/site_comm.hpp) under
// mpirun with N ranks:   mpirun -np N adgt_parallel_site_comm_test
//
// For every way of putting the N ranks on 2 (and, where N allows, 3) sites —
// in blocks and interleaved — the SiteComm's all-reduce, reduce-scatter and
// all-gather are checked against their definitions on integer-valued data
// (exact in every dtype, so equality is exact: the same bits as the flat
// MpiComm), started several at a time and completed in a rank-dependent
// order, and on random data against the flat ring within the rounding of a
// different summation order (the measured bound is printed). The cross-site
// group's bytes are the WAN bytes: each member's 1/k shard once per
// direction of the 2-member exchange. Exits non-zero on any failure.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/comm/ring.hpp"
#include "parallel/comm/site_comm.hpp"
#include "tests/parallel/check.hpp"
#include "tests/parallel/int_data.hpp"

using namespace adgt;
using ptest::dtype_of;
using ptest::val;
using ptest::view;

namespace {

struct Case {
  std::string name;
  std::vector<int> site;  // per world rank
};

template <class T> void check_all_reduce(SiteComm& sc, int64_t n, const std::string& where) {
  const int p = sc.size(), r = sc.rank();
  std::vector<T> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = T(val(r, i));
  sc.all_reduce(view(x));
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, i);
    bad += x[size_t(i)] != T(s);
  }
  PCHECK(bad == 0, where << " all_reduce " << dtype_name(dtype_of<T>()) << " n=" << n << ": "
                         << bad << " elements differ from the exact sum");
}

// Several collectives started at once, completed in a rank-dependent order,
// with rank-dependent delays between the calls.
void check_started(SiteComm& sc, const std::string& where) {
  const int p = sc.size(), r = sc.rank();
  const int64_t m = 37, n = 1001;
  std::vector<float> a(n), b(static_cast<size_t>(p * m)), c(static_cast<size_t>(m)), d(static_cast<size_t>(m)), e(static_cast<size_t>(p * m));
  for (int64_t i = 0; i < n; ++i) a[size_t(i)] = float(val(r, i));
  for (int64_t i = 0; i < p * m; ++i) b[size_t(i)] = float(val(r, i + 5));
  for (int64_t i = 0; i < m; ++i) d[size_t(i)] = float(val(r, i + 9));
  std::vector<Work> w;
  w.push_back(sc.start_all_reduce(view(a)));
  std::this_thread::sleep_for(std::chrono::microseconds(200 * ((r * 7) % 5)));
  w.push_back(sc.start_reduce_scatter(view(c), view(b)));
  w.push_back(sc.start_all_gather(view(e), view(d)));
  std::vector<float> f(64);
  for (int64_t i = 0; i < 64; ++i) f[size_t(i)] = float(val(r, i + 3));
  sc.all_reduce(view(f));  // a blocking one while three are pending
  for (int k = 0; k < 3; ++k) {
    const size_t j = size_t((k + r) % 3);
    if (r % 2) {
      while (!w[j].test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      w[j].wait();
    }
  }
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, i);
    bad += a[size_t(i)] != float(s);
  }
  for (int64_t i = 0; i < m; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, r * m + i + 5);
    bad += c[size_t(i)] != float(s);
  }
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < m; ++i) bad += e[size_t(q * m + i)] != float(val(q, i + 9));
  for (int64_t i = 0; i < 64; ++i) {
    int64_t s = 0;
    for (int q = 0; q < p; ++q) s += val(q, i + 3);
    bad += f[size_t(i)] != float(s);
  }
  PCHECK(bad == 0, where << " started collectives: " << bad << " elements wrong");
}

// Random data: the hierarchical sum against the flat ring's, both exact up to
// their different summation orders. Returns the largest |diff| / sum |x_q|.
template <class T> double rounding_vs_flat(SiteComm& sc, MpiComm& flat, int64_t n, uint64_t seed) {
  const int r = sc.rank();
  std::mt19937_64 gen(seed * 1000 + uint64_t(r));
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<T> x(static_cast<size_t>(n)), y, absx(static_cast<size_t>(n));
  for (auto& v : x) v = T(nd(gen) * std::exp(nd(gen)));
  for (int64_t i = 0; i < n; ++i) absx[size_t(i)] = std::abs(x[size_t(i)]);
  y = x;
  sc.all_reduce(view(x));
  flat.all_reduce(view(y));
  flat.all_reduce(view(absx));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(double(x[size_t(i)]) - double(y[size_t(i)])) /
                                std::max(double(absx[size_t(i)]), 1e-300));
  // Every member holds the same bits.
  std::vector<T> all(size_t(n) * size_t(sc.size()));
  flat.all_gather(view(all), view(x));
  int differ = 0;
  for (int q = 0; q < sc.size(); ++q)
    for (int64_t i = 0; i < n; ++i) differ += all[size_t(q) * size_t(n) + size_t(i)] != x[size_t(i)];
  PCHECK(differ == 0, differ << " elements differ between members");
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  auto world = MpiComm::world("world");
  const int W = world->size(), me = world->rank();
  ptest::tally().rank = me;

  // split_by_site's refusals.
  {
    std::string why;
    PCHECK(!split_by_site({3, 3, 3}, &why) && why == "the group's ranks are on one site", why);
    PCHECK(!split_by_site({0, 0, 1}, &why) &&
               why == "the sites hold unequal numbers of the group's ranks (2, 1)",
           why);
    const auto s = split_by_site({5, 2, 5, 2});
    PCHECK(s && s->sites == 2 && s->per_site == 2 && s->rank_at[0] == std::vector<int>({0, 2}) &&
               s->rank_at[1] == std::vector<int>({1, 3}),
           "split of {5,2,5,2}");
  }

  std::vector<Case> cases;
  if (W % 2 == 0) {
    Case block{"2 sites, blocks", {}}, inter{"2 sites, interleaved", {}};
    for (int r = 0; r < W; ++r) {
      block.site.push_back(r < W / 2 ? 0 : 1);
      inter.site.push_back(r % 2 == 0 ? 7 : 3);
    }
    cases.push_back(block);
    cases.push_back(inter);
  }
  if (W % 3 == 0) {
    Case three{"3 sites", {}};
    for (int r = 0; r < W; ++r) three.site.push_back((r * 5) % 3);
    cases.push_back(three);
  }
  double worst32 = 0, worst64 = 0;
  for (const Case& c : cases) {
    auto split = split_by_site(c.site);
    PCHECK(split.has_value(), c.name << ": no split");
    if (!split) continue;
    const int site = split->site[size_t(me)], place = split->place[size_t(me)];
    std::unique_ptr<Comm> local = world->split(site, place, "dp-site");
    std::unique_ptr<Comm> cross = world->split(place, site, "dp-wan");
    SiteComm sc(*world, *split, std::move(local), std::move(cross));
    for (int64_t n : {1, 2, 7, 64, 1000, 1003}) {
      check_all_reduce<float>(sc, n, c.name);
      check_all_reduce<double>(sc, n, c.name);
      check_all_reduce<int32_t>(sc, n, c.name);
    }
    // Reduce-scatter and all-gather, chunk r is group rank r's.
    for (int64_t m : {1, 5, 300}) {
      std::vector<double> in(static_cast<size_t>(W * m)), out(static_cast<size_t>(m)), g(static_cast<size_t>(W * m));
      for (int64_t i = 0; i < W * m; ++i) in[size_t(i)] = double(val(me, i));
      sc.reduce_scatter(view(out), view(in));
      int bad = 0;
      for (int64_t i = 0; i < m; ++i) {
        int64_t s = 0;
        for (int q = 0; q < W; ++q) s += val(q, me * m + i);
        bad += out[size_t(i)] != double(s);
      }
      sc.all_gather(view(g), view(out));
      for (int q = 0; q < W; ++q)
        for (int64_t i = 0; i < m; ++i) {
          int64_t s = 0;
          for (int u = 0; u < W; ++u) s += val(u, q * m + i);
          bad += g[size_t(q * m + i)] != double(s);
        }
      PCHECK(bad == 0, c.name << " reduce_scatter/all_gather m=" << m << ": " << bad << " wrong");
    }
    // WAN bytes: the cross group moves each member's shard (1/k of the
    // tensor) as a ring all-reduce over the S sites.
    {
      const int64_t n = 4000 * split->per_site;
      std::vector<float> x(size_t(n), 1.0f);
      sc.reset_stats();
      sc.all_reduce(view(x));
      const int64_t want = ring_all_reduce_sent(n / split->per_site, split->sites, site) * 4;
      PCHECK(sc.cross().stats().bytes == want,
             c.name << ": WAN bytes " << sc.cross().stats().bytes << ", want " << want);
    }
    check_started(sc, c.name);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      worst32 = std::max(worst32, rounding_vs_flat<float>(sc, *world, 5003, seed));
      worst64 = std::max(worst64, rounding_vs_flat<double>(sc, *world, 5003, seed));
    }
  }
  // The summation orders differ; each sum of W terms is within (W-1) eps of
  // exact relative to sum |x|, so the two within 2 (W-1) eps.
  const double eps32 = 5.96e-8, eps64 = 1.11e-16;
  PCHECK(worst32 <= 2 * (W - 1) * eps32, "f32 vs flat: " << worst32);
  PCHECK(worst64 <= 2 * (W - 1) * eps64, "f64 vs flat: " << worst64);

  long failures = ptest::tally().failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) {
    if (failures == 0)
      std::printf("site comm: ok on %d ranks (%zu site layouts; vs the flat ring: f32 %.3g, f64 "
                  "%.3g of sum |x|)\n",
                  W, cases.size(), worst32, worst64);
    else
      std::printf("site comm: %ld failures\n", failures);
  }
  return failures == 0 ? 0 : 1;
}
