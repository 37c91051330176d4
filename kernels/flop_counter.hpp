// The matmul FLOPs the CPU backend has executed in this process: every GEMM
// of the CPU reference (kernels/cpu/blas.hpp: the linears, attention's score
// and value products, the experts) adds 2*M*N*K, on whichever thread runs it
// (OpenMP workers included). The emulation's model clock
// (parallel/emulate/clock.hpp, emulate.clock: model) times compute by it, so
// its times are a function of the work alone, the same on any machine under
// any load. One rank is one process; its training thread is the only one that
// computes while the clock reads it.
#pragma once
#include <atomic>
#include <cstdint>

namespace adgt {

inline std::atomic<uint64_t>& gemm_flops_executed() {
  static std::atomic<uint64_t> flops{0};
  return flops;
}

inline void count_gemm_flops(int64_t m, int64_t n, int64_t k) {
  gemm_flops_executed().fetch_add(uint64_t(2 * m * n * k), std::memory_order_relaxed);
}

}  // namespace adgt
