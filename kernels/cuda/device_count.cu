// What the CUDA runtime says about devices (kernels/backend.hpp): the count,
// or the error that kept it from counting. "No device" is not an error.
#include <cuda_runtime.h>

#include <string>

#include "kernels/backend.hpp"

namespace adgt {
DeviceQuery cuda_device_query() {
  DeviceQuery q;
  const cudaError_t e = cudaGetDeviceCount(&q.count);
  if (e == cudaSuccess) return q;
  (void)cudaGetLastError();
  q.count = 0;
  if (e != cudaErrorNoDevice)
    q.error = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  return q;
}
}  // namespace adgt
