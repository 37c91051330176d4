// Run-time backend choice.
#include "kernels/backend.hpp"

#include "kernels/check.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#ifdef ADGT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace adgt {

#ifndef ADGT_HAVE_CUDA
int cuda_device_count() { return 0; }
#endif

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuBackend>();
#ifdef ADGT_HAVE_CUDA
  if (device == "auto") {
    if (cuda_device_count() > 0) return std::make_unique<CudaBackend>();
    return std::make_unique<CpuBackend>();
  }
  if (device == "cuda") {
    ADGT_CHECK(cuda_device_count() > 0,
               "train.device=cuda: no CUDA device is visible (check the driver and "
               "CUDA_VISIBLE_DEVICES); use train.device=cpu or auto");
    return std::make_unique<CudaBackend>();
  }
#else
  if (device == "auto") return std::make_unique<CpuBackend>();  // no CUDA backend in this build
  if (device == "cuda") {
    ADGT_CHECK(false, "train.device=cuda: this binary was built without CUDA (nvcc was not found "
                      "at configure time); use train.device=cpu or auto, or rebuild with the "
                      "CUDA toolkit installed");
  }
#endif
  ADGT_CHECK(false, "unknown device '" << device << "'; use auto, cpu or cuda");
}

}  // namespace adgt
