// The CUDA backend's optimizer methods; the kernels and the ops that launch
// them are in optimizer_kernels.cuh. sum_squares's read-back (a device-to-host
// copy and its synchronisation) stays here.
#include "kernels/cuda/optimizer_kernels.cuh"

namespace adgt {

double CudaBackend::sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (!n) return 0.0;
  // The result goes to the reduce scratch's slot after the partials (see
  // cuda::sum_squares_into), then to the host.
  const int64_t nparts = cuda::sumsq_parts(n);
  auto* part = static_cast<double*>(scratch(kScratchReduce, size_t(nparts + 1) * sizeof(double)));
  cuda::sum_squares_into(cuda::op_ctx(*this), part + nparts, x);
  double total = 0;
  to_host(&total, part + nparts, sizeof total);
  return total;
}

void CudaBackend::sum_squares_ranges(Tensor out, const Tensor& x,
                                     const std::vector<int64_t>& bounds) {
  cuda::sum_squares_ranges(cuda::op_ctx(*this), out, x, bounds);
}

void CudaBackend::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) {
  cuda::adamw(cuda::op_ctx(*this), param, grad, m, v, h);
}

void CudaBackend::adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                             const AdamWHyper& h) {
  if (param.dtype != DType::F32 || lowp.dtype != DType::BF16) {
    Backend::adamw_cast(param, grad, m, v, lowp, h);  // adamw, then cast
    return;
  }
  cuda::adamw_cast(cuda::op_ctx(*this), param, grad, m, v, lowp, h);
}

}  // namespace adgt
