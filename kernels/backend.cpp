// Run-time backend choice.
#include "kernels/backend.hpp"

#include "kernels/check.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt {

#ifndef ADGT_HAVE_CUDA
int cuda_device_count() { return 0; }
#endif

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuBackend>();
  if (device == "auto") {
    // The CUDA backend (issue 4) is not part of this build yet; auto falls
    // back to the CPU reference backend.
    return std::make_unique<CpuBackend>();
  }
  if (device == "cuda") {
    const int n = cuda_device_count();
    ADGT_CHECK(false, "train.device=cuda: the CUDA backend is not built into this binary yet "
                          << "(" << n << " CUDA device(s) visible); use train.device=cpu or auto");
  }
  ADGT_CHECK(false, "unknown device '" << device << "'; use auto, cpu or cuda");
}

}  // namespace adgt
