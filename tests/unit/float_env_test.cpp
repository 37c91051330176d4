// train.flush_denormals (kernels/cpu/float_env.hpp): FlushDenormals turns
// denormal inputs and results into zeros on the calling thread and on every
// OpenMP thread, and restores gradual underflow when it goes out of scope.
#include <catch2/catch.hpp>
#include <cblas.h>
#include <omp.h>

#include <cfloat>
#include <limits>
#include <vector>

#include "kernels/cpu/float_env.hpp"

namespace {

// volatile: the compiler must not fold the arithmetic at build time.
float scaled_denormal(float k) {
  volatile float d = std::numeric_limits<float>::denorm_min() * 64;  // a denormal
  volatile float r = d * k;
  return r;
}

}  // namespace

TEST_CASE("FlushDenormals flushes this thread and the OpenMP pool, then restores",
          "[float_env]") {
  if (!adgt::cpu::flush_denormals_supported()) {
    WARN("no flush-to-zero control on this CPU: nothing checked");
    return;
  }
  REQUIRE_FALSE(adgt::cpu::flushing_denormals());
  REQUIRE(scaled_denormal(2.0f) > 0);  // gradual underflow: a denormal result
  {
    adgt::cpu::FlushDenormals flush;
    CHECK(adgt::cpu::flushing_denormals());
    CHECK(scaled_denormal(2.0f) == 0.0f);  // DAZ: the input reads as zero
    volatile float tiny = FLT_MIN;
    volatile float half = tiny * 0.5f;  // FTZ: a denormal result is written as zero
    CHECK(half == 0.0f);
    const int n = omp_get_max_threads();
    std::vector<int> on(size_t(n), -1);
#pragma omp parallel num_threads(n)
    on[size_t(omp_get_thread_num())] = adgt::cpu::flushing_denormals() ? 1 : 0;
    for (int t = 0; t < n; ++t) CHECK(on[size_t(t)] == 1);
    // The GEMMs (OpenBLAS, OpenMP flavour): a denormal operand reads as zero.
    std::vector<float> a(64 * 64, std::numeric_limits<float>::denorm_min() * 1024), b(64 * 64, 3.0f),
        c(64 * 64, 1.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 64, 64, 1.0f, a.data(), 64,
                b.data(), 64, 0.0f, c.data(), 64);
    for (float x : c) CHECK(x == 0.0f);
    {
      adgt::cpu::FlushDenormals nested;  // already on: leaves it on at its end
    }
    CHECK(adgt::cpu::flushing_denormals());
  }
  CHECK_FALSE(adgt::cpu::flushing_denormals());
  CHECK(scaled_denormal(2.0f) > 0);
  const int n = omp_get_max_threads();
  std::vector<int> on(size_t(n), -1);
#pragma omp parallel num_threads(n)
  on[size_t(omp_get_thread_num())] = adgt::cpu::flushing_denormals() ? 1 : 0;
  for (int t = 0; t < n; ++t) CHECK(on[size_t(t)] == 0);
  {
    adgt::cpu::FlushDenormals off(false);  // train.flush_denormals: false changes nothing
    CHECK_FALSE(adgt::cpu::flushing_denormals());
  }
}
