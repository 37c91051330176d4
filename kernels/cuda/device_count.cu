// What the CUDA runtime says about devices (kernels/backend.hpp): the count,
// or the error that kept it from counting. "No device" is not an error.
#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/backend.hpp"

namespace adgt {
DeviceQuery cuda_device_query() {
  DeviceQuery q;
  const cudaError_t e = cudaGetDeviceCount(&q.count);
  if (e == cudaSuccess) return q;
  (void)cudaGetLastError();
  q.count = 0;
  if (e != cudaErrorNoDevice) {
    q.error = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
    q.driver = nvidia_driver_present();
  }
  return q;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("cudaGetDeviceProperties(" + std::to_string(device) +
                             "): " + cudaGetErrorString(e));
  }
  char buf[64];
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return buf;
}
}  // namespace adgt
