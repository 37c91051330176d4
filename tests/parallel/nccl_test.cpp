// NcclComm on integer-valued data with exact equality, one GPU per rank:
//   mpirun -np <GPUs> adgt_parallel_nccl_test
// Exits 77 (ctest: skipped, and says so) when this host has fewer visible
// GPUs than local ranks, e.g. on a machine without a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "kernels/backend.hpp"
#include "parallel/mesh/device_assign.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/comm/nccl_comm.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;

namespace {

// A device copy of a host vector; copied back by get().
struct DevVec {
  float* d = nullptr;
  int64_t n = 0;
  explicit DevVec(const std::vector<float>& h) : n(int64_t(h.size())) {
    ADGT_CUDA(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(float)));
    if (n) ADGT_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DevVec() { cudaFree(d); }
  Tensor t() const { return Tensor(d, DType::F32, {n}); }
  std::vector<float> get() const {
    std::vector<float> h(static_cast<size_t>(n));
    if (n) ADGT_CUDA(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

float val(int r, int64_t i) { return float((i * 7 + r * 13) % 101 - 50 + r); }

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    ptest::tally().rank = mpi.rank();
    auto world = MpiComm::world();
    const int visible = cuda_device_count();
    int enough = visible >= 1 && (visible >= mpi.launch().local_world || visible == 1) ? 1 : 0, all = 0;
    ADGT_MPI(MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all) {
      if (mpi.rank() == 0)
        std::printf("nccl test: skipped: a rank sees %d CUDA devices for %d local ranks\n", visible,
                    mpi.launch().local_world);
      return 77;
    }
    const int dev = pick_local_device(mpi.launch(), visible, false);
    NcclComm nccl(*world, dev);
    const int p = nccl.size(), r = nccl.rank();

    for (int64_t n : {int64_t(1), int64_t(1021), int64_t(4096 * 3)}) {
      std::vector<float> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = val(r, i);
      DevVec x(h);
      nccl.reset_stats();
      nccl.all_reduce(x.t());
      const std::vector<float> got = x.get();
      for (int64_t i = 0; i < n; ++i) {
        float s = 0;
        for (int q = 0; q < p; ++q) s += val(q, i);
        PCHECK(got[i] == s, "nccl all_reduce n=" << n << " [" << i << "] = " << got[i] << ", want " << s);
      }
      if (n % p == 0)
        PCHECK(nccl.stats().bytes == 2 * (p - 1) * (n / p) * 4, "all_reduce bytes " << nccl.stats().bytes);
    }
    {
      const int64_t n = 256;
      std::vector<float> h(n * p);
      for (int64_t i = 0; i < n * p; ++i) h[i] = val(r, i);
      DevVec in(h), out(std::vector<float>(size_t(n), 0.f));
      nccl.reduce_scatter(out.t(), in.t());
      const std::vector<float> got = out.get();
      for (int64_t i = 0; i < n; ++i) {
        float s = 0;
        for (int q = 0; q < p; ++q) s += val(q, r * n + i);
        PCHECK(got[i] == s, "nccl reduce_scatter [" << i << "] = " << got[i]);
      }
      DevVec mine(std::vector<float>(n, float(r + 1))), gathered(std::vector<float>(n * p));
      nccl.all_gather(gathered.t(), mine.t());
      const std::vector<float> g = gathered.get();
      for (int64_t i = 0; i < n * p; ++i) PCHECK(g[i] == float(i / n + 1), "nccl all_gather [" << i << "]");
      DevVec b(std::vector<float>(n, r == p - 1 ? 42.f : 0.f));
      nccl.broadcast(b.t(), p - 1);
      for (float v : b.get()) PCHECK(v == 42.f, "nccl broadcast got " << v);
    }
    if (p > 1) {
      DevVec out(std::vector<float>(100, float(r))), in(std::vector<float>(100, -1.f));
      const int next = (r + 1) % p, prev = (r - 1 + p) % p;
      if (r % 2 == 0) nccl.send(out.t(), next), nccl.recv(in.t(), prev);
      else nccl.recv(in.t(), prev), nccl.send(out.t(), next);
      for (float v : in.get()) PCHECK(v == float(prev), "nccl recv got " << v);
      // Every rank sends before it receives: only grouped point-to-point (the
      // queued isend goes out with the recv in one NCCL group) avoids a deadlock.
      DevVec in2(std::vector<float>(100, -1.f));
      const int64_t id = nccl.isend(out.t(), next);
      nccl.recv(in2.t(), prev);
      for (float v : in2.get()) PCHECK(v == float(prev), "nccl isend/recv got " << v);
      nccl.wait_sends();
      PCHECK(nccl.send_done(id), "nccl send_done after wait_sends");
    }
    {
      // An asynchronous all-reduce: the Work completes; exposed time is >= 0.
      DevVec x(std::vector<float>(4096, float(r + 1)));
      nccl.reset_stats();
      Work w = nccl.start_all_reduce(x.t());
      w.wait();
      for (float v : x.get()) PCHECK(v == float(p * (p + 1) / 2), "nccl start_all_reduce got " << v);
      PCHECK(nccl.stats().seconds >= 0 && nccl.stats().calls == 1, "nccl stats after one Work");
    }
    {
      auto cnt = [](int from, int to) { return int64_t((from + 2 * to) % 4 + (from == to ? 1 : 0)); };
      std::vector<int64_t> sc(p), sd(p), rc(p), rd(p);
      int64_t st = 0, rt = 0;
      for (int j = 0; j < p; ++j) sc[j] = cnt(r, j), sd[j] = st, st += sc[j], rc[j] = cnt(j, r), rd[j] = rt, rt += rc[j];
      std::vector<float> h(st);
      for (int j = 0; j < p; ++j)
        for (int64_t k = 0; k < sc[j]; ++k) h[sd[j] + k] = float(r * 1000 + j * 10 + k);
      DevVec in(h), out(std::vector<float>(rt, -1.f));
      nccl.all_to_allv(out.t(), rc, rd, in.t(), sc, sd);
      const std::vector<float> got = out.get();
      for (int j = 0; j < p; ++j)
        for (int64_t k = 0; k < rc[j]; ++k)
          PCHECK(got[rd[j] + k] == float(j * 1000 + r * 10 + k), "nccl all_to_allv from " << j);
    }
    nccl.barrier();
    long fails = ptest::tally().failures, total = 0;
    ADGT_MPI(MPI_Allreduce(&fails, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (r == 0) std::printf("nccl test: %s on %d ranks, %ld failures\n", total ? "FAILED" : "ok", p, total);
    return total ? 1 : 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}
