// Ring attention (parallel/cp/) under mpirun on P ranks, the cp group being
// the world:   mpirun -np P adgt_parallel_ring_attention_test
//
// Every rank builds the same random full (B, T, H, KV, hd) q, k, v and dout
// from a seed, takes its two chunks (r and 2P-1-r, Megatron's load balance),
// runs the ring forward and backward on the CPU backend, and compares its
// chunks of out, dq, dk and dv with the single-process attention_forward /
// attention_backward on the whole sequence (the CPU backend's T x T kernel):
// f64 within 1e-12, f32 within 1e-5 (max abs error). Grouped-query heads
// (H/KV = 2); chunks of 37 and 70 tokens (not multiples of the kernel's
// 64-row block; 70 crosses it); B = 2. In f64 also on the emulated device
// (device memory, K/V staged through the host by DeviceComm), which must give
// the CPU's numbers bit for bit. And with packed documents: token ids with an
// end-of-document id every few tokens (documents crossing the chunks' and the
// ranks' edges), cp::document_starts over the group must give each local
// token its document's start in the whole sequence, and the ring masked by
// them must equal the whole-sequence attention masked by the same starts
// (AttentionShape::doc_start). And over a transport that, like NCCL,
// matches the messages between two ranks by their order, not their tags
// (OrderedComm: every tag 0; isends queued until the next exchange, receive
// or wait, as NcclComm issues them): K/V blocks and dK/dV accumulators have
// the same size, so a ring that sent them in another order than its
// neighbour receives them would swap them; the results must be the tagged
// run's bit for bit. Prints every failure with its rank
// and, on rank 0, the worst errors over all ranks; exits non-zero on any.
#include "parallel/cp/ring_attention.hpp"

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/emulated/emulated_backend.hpp"
#include "parallel/comm/device_comm.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/cp/chunks.hpp"
#include "tests/parallel/check.hpp"
#include "tests/unit/attention_fixture.hpp"

using namespace adgt;
using namespace adgt::attn_test;

namespace {

// This rank's rows of x (B, T, w): per sequence chunk r then chunk 2P-1-r,
// c rows each: the (B, 2c, w) local layout of parallel/cp/chunks.hpp.
template <class T>
std::vector<T> local_rows(const std::vector<T>& x, int64_t B, int64_t T_, int64_t w, int64_t c,
                          int r, int P) {
  std::vector<T> out;
  out.reserve(size_t(B * 2 * c * w));
  for (int64_t b = 0; b < B; ++b)
    for (int chunk : cp::rank_chunks(r, P))
      out.insert(out.end(), x.begin() + (b * T_ + chunk * c) * w,
                 x.begin() + (b * T_ + (chunk + 1) * c) * w);
  return out;
}

template <class T>
struct Local {
  std::vector<T> out, dq, dk, dv;
  int skipped_fwd = 0, skipped_bwd = 0;  // blocks skipped (packed documents)
};

// Point-to-point matched by order, as on NCCL (see the top): tags dropped,
// isends queued and issued, in order, at the next exchange, receive or
// wait_sends. Everything else is the inner transport's.
class OrderedComm final : public Comm {
 public:
  explicit OrderedComm(Comm& inner) : c_(inner) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string name() const override { return c_.name(); }
  void all_reduce(Tensor t, ReduceOp op) override { c_.all_reduce(t, op); }
  void reduce_scatter(Tensor out, const Tensor& in) override { c_.reduce_scatter(out, in); }
  void all_gather(Tensor out, const Tensor& in) override { c_.all_gather(out, in); }
  void broadcast(Tensor t, int root) override { c_.broadcast(t, root); }
  void send(const Tensor& t, int peer, int) override { flush(), c_.send(t, peer, 0); }
  void recv(Tensor t, int peer, int) override { flush(), c_.recv(t, peer, 0); }
  int64_t isend(const Tensor& t, int peer, int) override {
    queued_.push_back({t, peer});
    return 0;
  }
  void wait_sends() override { flush(), c_.wait_sends(); }
  bool rendezvous_sends() const override { return true; }
  void all_to_all(Tensor out, const Tensor& in) override { c_.all_to_all(out, in); }
  void all_to_allv(Tensor out, const std::vector<int64_t>& rc, const std::vector<int64_t>& rd,
                   const Tensor& in, const std::vector<int64_t>& sc,
                   const std::vector<int64_t>& sd) override {
    c_.all_to_allv(out, rc, rd, in, sc, sd);
  }
  void barrier() override { c_.barrier(); }
  Work start_exchange(const std::vector<Message>& out, int to, const std::vector<Message>& in,
                      int from) override {
    flush();
    return Comm::start_exchange(out, to, in, from);  // isends (queued: flushed in wait)
  }

 private:
  void flush() {
    for (const auto& [t, peer] : queued_) c_.isend(t, peer, 0);
    queued_.clear();
  }
  Comm& c_;
  std::vector<std::pair<Tensor, int>> queued_;
};

// This rank's part of ring attention of p on backend `be` over `comm`.
// docs (optional): this rank's local tokens' document starts (B, 2c).
template <class T>
Local<T> run_ring(Backend& be, Comm& comm, const Problem<T>& p, int64_t c,
                  const std::vector<int32_t>* docs = nullptr) {
  const int P = comm.size(), r = comm.rank();
  const int64_t B = p.B, T_ = p.T, H = p.H, KV = p.KV, hd = p.hd, wq = H * hd, wk = KV * hd;
  cp::RingShape s{B, cp::chunk_tokens(T_, P), H, KV, hd};
  Mem<T> m(be);
  Mem<int32_t> mi(be);
  if (docs) s.doc_start = mi.put(*docs, {B, 2 * c}).ptr<int32_t>();
  const Tensor q = m.put(local_rows(p.q, B, T_, wq, c, r, P), {B, 2 * c, H, hd});
  const Tensor k = m.put(local_rows(p.k, B, T_, wk, c, r, P), {B, 2 * c, KV, hd});
  const Tensor v = m.put(local_rows(p.v, B, T_, wk, c, r, P), {B, 2 * c, KV, hd});
  const Tensor dout = m.put(local_rows(p.dout, B, T_, wq, c, r, P), {B, 2 * c, H, hd});
  const Tensor out = m.zeros({B, 2 * c, H, hd}), dq = m.zeros({B, 2 * c, H, hd});
  const Tensor dk = m.zeros({B, 2 * c, KV, hd}), dv = m.zeros({B, 2 * c, KV, hd});
  const Tensor lse = m.zeros({2, B, H, c});
  const int sf = cp::ring_attention_forward(be, comm, out, lse, q, k, v, s);
  const int sb = cp::ring_attention_backward(be, comm, dq, dk, dv, dout, q, k, v, out, lse, s);
  return {m.get(out), m.get(dq), m.get(dk), m.get(dv), sf, sb};
}

// Runs one case on the CPU backend (and, in f64, on the emulated device
// through the host-staged DeviceComm: the CPU's numbers bit for bit);
// returns this rank's worst error over out, dq, dk, dv.
template <class T>
double run_case(Comm& comm, int64_t c, double tol, bool masked) {
  const int P = comm.size(), r = comm.rank();
  const int64_t B = 2, H = 4, KV = 2, hd = 8, T_ = 2 * P * c, wq = H * hd, wk = KV * hd;
  const Problem<T> p(B, T_, H, KV, hd, 1234 + uint64_t(c));
  // Packed documents: token ids (t * 7 + 3b) mod 23, the end of a document
  // id 0 (every 23 tokens, at a different phase in each sequence).
  std::vector<int32_t> tokens(size_t(B * T_)), starts(size_t(B * T_)), mine;
  for (int64_t b = 0; b < B; ++b) {
    int32_t first = 0;
    for (int64_t t = 0; t < T_; ++t) {
      tokens[size_t(b * T_ + t)] = int32_t((t * 7 + 3 * b) % 23);
      if (t > 0 && tokens[size_t(b * T_ + t - 1)] == 0) first = int32_t(t);
      starts[size_t(b * T_ + t)] = first;
    }
  }
  if (masked) {
    mine = cp::document_starts(comm, local_rows(tokens, B, T_, 1, c, r, P).data(), B, 2 * c, 0);
    PCHECK(mine == local_rows(starts, B, T_, 1, c, r, P),
           "chunk " << c << ": cp::document_starts differs from the whole sequence's starts");
  }
  const Grads<T> want = reference(p, masked ? &starts : nullptr);
  CpuBackend be;
  const Local<T> got = run_ring(be, comm, p, c, masked ? &mine : nullptr);
  const std::string tys = std::string(dtype_name(dtype_of<T>())) + (masked ? " documents" : "");
  const char* ty = tys.c_str();
  const double eo = max_abs_diff(got.out, local_rows(want.out, B, T_, wq, c, r, P));
  const double eq = max_abs_diff(got.dq, local_rows(want.dq, B, T_, wq, c, r, P));
  const double ek = max_abs_diff(got.dk, local_rows(want.dk, B, T_, wk, c, r, P));
  const double ev = max_abs_diff(got.dv, local_rows(want.dv, B, T_, wk, c, r, P));
  PCHECK(eo <= tol, ty << " chunk " << c << ": out max error " << eo << " > " << tol);
  PCHECK(eq <= tol, ty << " chunk " << c << ": dq max error " << eq << " > " << tol);
  PCHECK(ek <= tol, ty << " chunk " << c << ": dk max error " << ek << " > " << tol);
  PCHECK(ev <= tol, ty << " chunk " << c << ": dv max error " << ev << " > " << tol);
  // Block skipping: documents of at most 23 tokens, shorter than a chunk,
  // leave a query chunk nothing to see two or more chunks back, while some
  // row of it sees the chunk just before (a document crosses that edge in
  // one of the two sequences): over the ranks, the (2P-1)(2P-2)/2 pairs of
  // chunks two or more apart are skipped (both passes alike), with the
  // numbers above unchanged; none without documents.
  PCHECK(got.skipped_fwd == got.skipped_bwd,
         ty << " chunk " << c << ": forward skipped " << got.skipped_fwd << " blocks, backward "
            << got.skipped_bwd);
  int skipped = got.skipped_fwd, all_skipped = 0;
  ADGT_MPI(MPI_Allreduce(&skipped, &all_skipped, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  if (!masked)
    PCHECK(skipped == 0, ty << " chunk " << c << ": " << skipped << " blocks skipped without documents");
  else
    PCHECK(all_skipped == (2 * P - 1) * (2 * P - 2) / 2,
           ty << " chunk " << c << ": " << all_skipped << " blocks skipped over the ranks, expected "
              << (2 * P - 1) * (2 * P - 2) / 2);
  if (masked && r == 0)
    std::printf("%s chunk %lld: %d blocks skipped over %d ranks\n", ty, (long long)c, all_skipped, P);
  {
    OrderedComm ordered(comm);
    const Local<T> o = run_ring(be, ordered, p, c, masked ? &mine : nullptr);
    PCHECK(o.out == got.out && o.dq == got.dq && o.dk == got.dk && o.dv == got.dv,
           ty << " chunk " << c << ": messages matched by order (as on NCCL) give other results "
                 "than by tag");
  }
  if (dtype_of<T>() == DType::F64) {
    EmulatedBackend emu(size_t(1) << 30);
    DeviceComm staged(comm, emu);
    const Local<T> e = run_ring(emu, staged, p, c, masked ? &mine : nullptr);
    PCHECK(e.out == got.out && e.dq == got.dq && e.dk == got.dk && e.dv == got.dv,
           ty << " chunk " << c << ": the emulated device's results differ from the CPU's");
  }
  return std::max(std::max(eo, eq), std::max(ek, ev));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    auto cp_group = MpiComm::world("cp");
    const int P = cp_group->size();
    double worst[2] = {0, 0};  // f64, f32
    for (int64_t c : {int64_t(37), int64_t(70)})
      for (bool masked : {false, true}) {
        worst[0] = std::max(worst[0], run_case<double>(*cp_group, c, 1e-12, masked));
        worst[1] = std::max(worst[1], run_case<float>(*cp_group, c, 1e-5, masked));
      }
    double all[2] = {0, 0};
    ADGT_MPI(MPI_Allreduce(worst, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const auto& t = ptest::tally();
    long fails = t.failures, total = 0;
    ADGT_MPI(MPI_Allreduce(&fails, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (cp_group->rank() == 0)
      std::printf(
          "ring attention: %s on %d ranks: max abs error f64 %.3g, f32 %.3g; %ld failures\n",
          total ? "FAILED" : "ok", P, all[0], all[1], total);
    cp_group.reset();
    return total ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
