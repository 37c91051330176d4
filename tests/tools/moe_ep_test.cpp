// Expert parallelism of the mixture-of-experts block against one process:
//   mpirun -np P adgt_moe_ep_test
// Every rank builds the same global weights and the union of all ranks' tokens
// (rank r holds its own rows of it), runs the ep=P layer (MpiComm over the
// world) on its rows and, in the same process, an ep=1 layer on the union.
// Two micro-batches are in flight (forward A, forward B, backward B,
// backward A). Compared, per dtype, within a relative tolerance (f64 1e-10,
// f32 1e-5): outputs and dx of this rank's rows, the aux loss, the load
// histogram and dropped counts (exact), this rank's experts' gradients, and the
// router gradient summed over the ranks. Cases: dropless with unequal token
// counts per rank, capacity drops (equal counts; the reference uses
// capacity_segment = rows per rank), aux-loss-free bias; each with the
// contiguous, a strided and a shuffled placement table, and the contiguous
// table with replicas (core/model/moe_replicas.hpp: expert 0 on every rank,
// the last expert also on rank 0, the second on the last rank with a zero
// share): the same comparisons, the shadows' gradients must arrive at the
// owners (returned once, after the second backward), and a forward before
// sync_replicas is refused.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/model/moe.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;

namespace {

template <class T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::F32;
}
template <>
DType dtype_of<double>() {
  return DType::F64;
}

template <class T>
std::vector<T> randn(size_t n, uint64_t seed, double scale) {
  Rng r(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T(scale * r.normal());
  return v;
}

template <class T>
Tensor T2(T* p, int64_t r, int64_t c) {
  return Tensor(p, dtype_of<T>(), {r, c});
}

// Global weights of every expert, stacked; views of a subset of experts.
template <class T>
struct Weights {
  int64_t E, C, F;
  std::vector<T> gate, w1, w2, w3;  // (E,C), (E,F,C), (E,C,F), (E,F,C)
  Weights(int64_t e, int64_t c, int64_t f, uint64_t seed)
      : E(e),
        C(c),
        F(f),
        gate(randn<T>(size_t(E * C), seed, 0.7)),
        w1(randn<T>(size_t(E * F * C), seed + 1, 0.4)),
        w2(randn<T>(size_t(E * C * F), seed + 2, 0.4)),
        w3(randn<T>(size_t(E * F * C), seed + 3, 0.4)) {}
  void zero() {
    for (auto* v : {&gate, &w1, &w2, &w3}) std::fill(v->begin(), v->end(), T(0));
  }
  MoeParams view(const std::vector<int64_t>& experts) {
    MoeParams p;
    p.gate = T2(gate.data(), E, C);
    for (int64_t e : experts) {
      p.w1.push_back(T2(w1.data() + e * F * C, F, C));
      p.w3.push_back(T2(w3.data() + e * F * C, F, C));
      p.w2.push_back(T2(w2.data() + e * C * F, C, F));
    }
    return p;
  }
};

// max |a - b| / max |b| over a range (b the reference).
template <class T>
double rel_err(const T* a, const T* b, int64_t n) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  return ref > 0 ? err / ref : err;
}

// "replicated": replicas over the contiguous table (none with one rank).
ExpertReplicas make_replicas(const std::string& kind, const ExpertPlacement& pl) {
  const int P = pl.ep();
  const int64_t E = pl.n_experts();
  if (kind != "replicated" || P == 1) return ExpertReplicas();
  std::vector<std::vector<int>> h(static_cast<size_t>(E));
  std::vector<std::vector<double>> s(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) h[size_t(e)] = {pl.owner(e)}, s[size_t(e)] = {1.0};
  h[0].clear(), s[0].clear();
  for (int q = 0; q < P; ++q) h[0].push_back(q), s[0].push_back(q == 0 ? 0.4 : 0.6 / (P - 1));
  h[size_t(E - 1)] = {pl.owner(E - 1), 0}, s[size_t(E - 1)] = {0.3, 0.7};
  h[1] = {pl.owner(1), P - 1}, s[1] = {1.0, 0.0};
  if (pl.owner(1) == P - 1) h[1] = {pl.owner(1)}, s[1] = {1.0};
  return ExpertReplicas(pl, h, s, int(E / P) + 2);
}

std::vector<int> make_placement(const std::string& kind, int64_t E, int P) {
  std::vector<int> owner(static_cast<size_t>(E));
  const int64_t per = E / P;
  for (int64_t e = 0; e < E; ++e) owner[size_t(e)] = int(e / per);
  if (kind == "strided") {
    for (int64_t e = 0; e < E; ++e) owner[size_t(e)] = int(e % P);
  } else if (kind == "shuffled") {  // a fixed permutation of the contiguous table
    Rng r(12345);
    for (int64_t i = E - 1; i > 0; --i)
      std::swap(owner[size_t(i)], owner[size_t(r.next() % uint64_t(i + 1))]);
  }
  return owner;
}

struct Case {
  std::string name;
  MoeOptions opt;
  bool equal_rows;  // capacity cases: every rank has the same number of rows
  std::vector<double> bias;
};

template <class T>
void run_case(MpiComm& world, const Case& cs, const std::string& placement_kind) {
  const int P = world.size(), r = world.rank();
  const int64_t C = 8, F = 6, E = cs.opt.n_experts;
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-5;
  const std::string what =
      cs.name + " " + placement_kind + " " + dtype_name(dtype_of<T>()) + " ep=" + std::to_string(P);
  CpuBackend be;
  Weights<T> w(E, C, F, 1000 + E);
  // Rows per rank (two micro-batches A and B, different sizes) and offsets in the union.
  auto rows_of = [&](int q, int mb) -> int64_t {
    return cs.equal_rows ? 8 + 4 * mb : 5 + 3 * q + 2 * mb;
  };
  std::vector<int64_t> off[2], n_total(2, 0);
  int64_t max_rows = 0;
  for (int mb = 0; mb < 2; ++mb)
    for (int q = 0; q < P; ++q) {
      off[mb].push_back(n_total[size_t(mb)]);
      n_total[size_t(mb)] += rows_of(q, mb);
      max_rows = std::max(max_rows, rows_of(q, mb));
    }
  std::vector<T> x[2], R[2];
  for (int mb = 0; mb < 2; ++mb) {
    x[mb] = randn<T>(size_t(n_total[size_t(mb)] * C), 50 + mb, 1.0);
    R[mb] = randn<T>(size_t(n_total[size_t(mb)] * C), 60 + mb, 1.0);
  }
  const double scale[2] = {0.5, 0.25};

  // ---- the ep = P layer on this rank's rows ----
  const std::vector<int> table = make_placement(placement_kind, E, P);
  MoeLayer ep(be, dtype_of<T>(), max_rows, C, F, cs.opt, table, &world);
  ep.add_slot();
  ep.add_slot();
  if (!cs.bias.empty()) ep.set_bias(cs.bias);
  const std::vector<int64_t> mine = ep.local_experts();
  const ExpertReplicas reps = make_replicas(placement_kind, ExpertPlacement(E, P, table));
  if (reps.any()) {
    ep.set_replicas(reps);
    std::vector<T> o(size_t(rows_of(r, 0) * C));
    bool refused = false;
    try {
      ep.forward(0, T2(o.data(), rows_of(r, 0), C), T2(x[0].data() + off[0][size_t(r)] * C,
                                                        rows_of(r, 0), C), w.view(mine));
    } catch (const std::exception& e) {
      refused = std::string(e.what()).find("sync_replicas") != std::string::npos;
    }
    PCHECK(refused, what << ": a forward before sync_replicas was not refused");
    ep.sync_replicas(w.view(mine));
  }
  PCHECK(mine == ExpertPlacement(E, P, table).local_experts(r), what << ": local experts");
  Weights<T> g(E, C, F, 0);
  g.zero();
  std::vector<T> out[2], dx[2];
  double aux[2];
  MoeStats st[2];
  for (int mb = 0; mb < 2; ++mb) {
    const int64_t n = rows_of(r, mb);
    out[mb].assign(size_t(n * C), T(0));
    dx[mb].assign(size_t(n * C), T(0));
    aux[mb] = ep.forward(mb, T2(out[mb].data(), n, C),
                         T2(x[mb].data() + off[mb][size_t(r)] * C, n, C), w.view(mine));
    st[mb] = ep.stats(mb);
  }
  for (int mb = 1; mb >= 0; --mb) {
    const int64_t n = rows_of(r, mb);
    // With replicas the first backward keeps its shadow gradients; the
    // second (the step's last) returns both micro-batches' at once.
    ep.backward(mb, T2(dx[mb].data(), n, C), w.view(mine), g.view(mine),
                T2(R[mb].data() + off[mb][size_t(r)] * C, n, C), scale[mb], !reps.any() || mb == 0);
  }
  // The router gradient is a partial sum per rank.
  world.all_reduce(Tensor(g.gate.data(), dtype_of<T>(), {int64_t(g.gate.size())}));

  // ---- the reference: ep = 1 on the union, same micro-batch order ----
  std::vector<int64_t> all(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) all[size_t(e)] = e;
  Weights<T> gr(E, C, F, 0);
  gr.zero();
  std::vector<T> rout[2], rdx[2];
  double raux[2];
  MoeStats rst[2];
  std::vector<std::unique_ptr<MoeLayer>> ref;
  for (int mb = 0; mb < 2; ++mb) {
    // One reference layer per micro-batch when the capacity groups differ in size.
    MoeOptions o = cs.opt;
    if (cs.equal_rows) o.capacity_segment = rows_of(0, mb);
    ref.push_back(std::make_unique<MoeLayer>(be, dtype_of<T>(), n_total[size_t(mb)], C, F, o));
    ref.back()->add_slot();
    if (!cs.bias.empty()) ref.back()->set_bias(cs.bias);
    const int64_t n = n_total[size_t(mb)];
    rout[mb].assign(size_t(n * C), T(0));
    rdx[mb].assign(size_t(n * C), T(0));
    raux[mb] =
        ref.back()->forward(0, T2(rout[mb].data(), n, C), T2(x[mb].data(), n, C), w.view(all));
    rst[mb] = ref.back()->stats(0);
  }
  for (int mb = 1; mb >= 0; --mb) {
    const int64_t n = n_total[size_t(mb)];
    ref[size_t(mb)]->backward(0, T2(rdx[mb].data(), n, C), w.view(all), gr.view(all),
                              T2(R[mb].data(), n, C), scale[mb]);
  }

  // ---- compare ----
  for (int mb = 0; mb < 2; ++mb) {
    const int64_t n = rows_of(r, mb), o = off[mb][size_t(r)] * C;
    const double eo = rel_err(out[mb].data(), rout[mb].data() + o, n * C);
    const double ed = rel_err(dx[mb].data(), rdx[mb].data() + o, n * C);
    PCHECK(eo <= tol, what << " mb " << mb << ": output rel err " << eo);
    PCHECK(ed <= tol, what << " mb " << mb << ": dx rel err " << ed);
    PCHECK(std::abs(aux[mb] - raux[mb]) <= tol * std::abs(raux[mb]),
           what << " mb " << mb << ": aux " << aux[mb] << " vs " << raux[mb]);
    PCHECK(st[mb].load == rst[mb].load, what << " mb " << mb << ": load histogram differs");
    PCHECK(st[mb].tokens == rst[mb].tokens && st[mb].tokens == n_total[size_t(mb)],
           what << " mb " << mb << ": tokens " << st[mb].tokens);
    PCHECK(st[mb].dropped == rst[mb].dropped,
           what << " mb " << mb << ": dropped " << st[mb].dropped << " vs " << rst[mb].dropped);
    PCHECK(st[mb].imbalance == rst[mb].imbalance, what << ": imbalance");
    if (cs.opt.capacity_factor > 0) PCHECK(rst[mb].dropped > 0, what << ": the case drops nothing");
    // Backward moves the dispatch's and the return's volumes the other way;
    // the forward also sent the per-expert counts (f64, the plan's stats).
    // (Replicas: an all-gather of every rank's counts per expert.)
    const int64_t count_bytes = int64_t(P - 1) * (reps.any() ? E : E / P) * 8;
    PCHECK(P == 1 || ep.stats(mb).a2a_bytes > count_bytes, what << ": no all-to-all traffic");
    PCHECK(ep.stats(mb).a2a_bytes - count_bytes == ep.stats(mb).a2a_bytes_bwd,
           what << " mb " << mb << ": all-to-all bytes fwd " << ep.stats(mb).a2a_bytes << " bwd "
                << ep.stats(mb).a2a_bytes_bwd);
  }
  {  // the replicas served rows (sum over the ranks), and only with replicas
    std::vector<int32_t> d = {int32_t(st[0].shadow_rows + st[1].shadow_rows)};
    world.all_reduce(Tensor(d.data(), DType::I32, {1}));
    PCHECK(reps.any() ? d[0] > 0 : d[0] == 0, what << ": the replicas served " << d[0] << " rows");
  }
  {
    std::vector<int32_t> d = {int32_t(st[0].dropped_local)};
    world.all_reduce(Tensor(d.data(), DType::I32, {1}));
    PCHECK(d[0] == st[0].dropped,
           what << ": local drops sum to " << d[0] << ", not " << st[0].dropped);
  }
  const double eg = rel_err(g.gate.data(), gr.gate.data(), int64_t(g.gate.size()));
  PCHECK(eg <= tol, what << ": dWg rel err " << eg);
  for (int64_t e : mine) {
    const int64_t a = e * F * C;
    const double e1 = rel_err(g.w1.data() + a, gr.w1.data() + a, F * C);
    const double e2 = rel_err(g.w2.data() + a, gr.w2.data() + a, F * C);
    const double e3 = rel_err(g.w3.data() + a, gr.w3.data() + a, F * C);
    PCHECK(e1 <= tol && e2 <= tol && e3 <= tol,
           what << ": expert " << e << " grad rel err w1 " << e1 << " w2 " << e2 << " w3 " << e3);
  }
  // Experts this rank does not hold get no gradient here.
  for (int64_t e = 0; e < E; ++e) {
    if (std::find(mine.begin(), mine.end(), e) != mine.end()) continue;
    bool zero = true;
    for (const auto* v : {&g.w1, &g.w2, &g.w3})
      for (int64_t i = e * F * C; i < (e + 1) * F * C; ++i) zero = zero && (*v)[size_t(i)] == T(0);
    PCHECK(zero, what << ": expert " << e << " is not on this rank but has a gradient");
  }
  // Aux-free: the bias update from the ep load equals the reference's.
  if (cs.opt.aux_free) {
    ep.update_bias(st[0].load);
    ref[0]->update_bias(rst[0].load);
    PCHECK(ep.bias() == ref[0]->bias(), what << ": bias after update_bias");
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    auto world = MpiComm::world("ep");
    const int P = world->size();
    const int64_t E = 8;
    std::vector<Case> cases;
    {
      Case c{"dropless", {}, false, {}};
      c.opt.n_experts = E, c.opt.top_k = 2, c.opt.aux_loss_coef = 0.1;
      cases.push_back(c);
      Case d{"capacity", {}, true, {}};
      d.opt.n_experts = E, d.opt.top_k = 2, d.opt.aux_loss_coef = 0.1, d.opt.capacity_factor = 0.75;
      cases.push_back(d);
      Case a{"aux-free", {}, false, {}};
      a.opt.n_experts = E, a.opt.top_k = 3, a.opt.aux_loss_coef = 0, a.opt.aux_free = true;
      a.opt.bias_rate = 0.01;
      for (int64_t e = 0; e < E; ++e) a.bias.push_back(0.05 * double((e * 5) % 7) - 0.1);
      cases.push_back(a);
    }
    int runs = 0;
    for (const Case& c : cases)
      for (const char* pl : {"contiguous", "strided", "shuffled", "replicated"}) {
        run_case<double>(*world, c, pl);
        run_case<float>(*world, c, pl);
        runs += 2;
      }
    const auto& t = ptest::tally();
    long fails = t.failures, total = 0;
    ADGT_MPI(MPI_Allreduce(&fails, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (world->rank() == 0)
      std::printf("moe-ep: %s on %d ranks: %d cases, %ld checks on rank 0, %ld failures in all\n",
                  total ? "FAILED" : "ok", P, runs, t.checks, total);
    world.reset();
    return total ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
