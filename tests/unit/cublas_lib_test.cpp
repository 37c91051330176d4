// cuBLAS is opened at the CUDA backend's first call, not at program start
// (kernels/cuda/cublas_lib.hpp). Runs without a GPU: opening the library and
// asking its version need no device.
#include <catch2/catch.hpp>

#ifdef ADGT_HAVE_CUDA
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_lib.hpp"

namespace {

bool mapped(const std::string& lib) {
  std::ifstream f("/proc/self/maps");
  std::stringstream s;
  s << f.rdbuf();
  return s.str().find(lib) != std::string::npos;
}

}  // namespace

TEST_CASE("cuBLAS is opened at its first use, with its header's version", "[cuda]") {
  // Catch's discovery runs each case in its own process: nothing has called cuBLAS yet.
  CHECK_FALSE(mapped("libcublas"));
  const size_t lt = ADGT_CUBLAS(cublasLtGetVersion)();
  CHECK(mapped("libcublasLt.so"));
  CHECK(lt / 10000 == CUBLAS_VER_MAJOR);
  int v = 0;
  REQUIRE(ADGT_CUBLAS(cublasGetProperty)(MAJOR_VERSION, &v) == CUBLAS_STATUS_SUCCESS);
  CHECK(v == CUBLAS_VER_MAJOR);
  CHECK(mapped("libcublas.so"));
  CHECK(std::string(ADGT_CUBLAS(cublasGetStatusString)(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "the library was not initialized");
}

TEST_CASE("a cuBLAS function the library lacks is a named error", "[cuda]") {
  try {
    (void)adgt::cuda::cublas_symbol("cublasNoSuchFunction");
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    CHECK(m.find("libcublas.so.") != std::string::npos);
    CHECK(m.find("has no cublasNoSuchFunction") != std::string::npos);
  }
}
#endif
