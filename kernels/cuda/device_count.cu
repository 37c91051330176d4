// Visible CUDA devices; 0 when there is no driver or no GPU (no error raised).
#include <cuda_runtime.h>

namespace adgt {
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
}  // namespace adgt
