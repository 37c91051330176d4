// Test-only deliberate device fault (fault_probe.hpp).
#include "kernels/cuda/fault_probe.hpp"

#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
namespace {
__global__ void fault_probe_kernel(float* p, int64_t far) { p[far + threadIdx.x] = 1.f; }
}  // namespace

void cuda_fault_probe(CudaBackend& be) {
  Buffer small(be, 256);
  cuda::launch(kFaultProbeOp, fault_probe_kernel, 1, 32, 0, be.stream(),
               static_cast<float*>(small.data()), int64_t(1) << 38);  // 1 TiB of floats away
}
}  // namespace adgt
