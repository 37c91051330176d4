// The CUDA runtime calls of the exact attention ops (kernels/cuda/
// attention_kernels.cuh) beyond sim_cuda.hpp's: the device attribute query
// behind a dynamic shared-memory opt-in. The emulated device is device 0 and
// gives the emulation's limit (sim_runtime.hpp, kMaxSmem: sm_90's 227 KiB).
// Include after sim_cuda.hpp, before the kernel header.
#pragma once
#include "tests/tools/cuda_sim/sim_cuda.hpp"

// Static shared memory is not measured by the emulation: reported as none.
struct cudaFuncAttributes {
  size_t sharedSizeBytes = 0;
};
template <class K>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, K) {
  *a = {};
  return cudaSuccess;
}
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin || device != 0)
    adgt::cuda_sim::fail("cudaDeviceGetAttribute: only the shared-memory opt-in of device 0");
  *value = int(adgt::cuda_sim::kMaxSmem);
  return cudaSuccess;
}
