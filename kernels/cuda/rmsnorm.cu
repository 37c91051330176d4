// The CUDA backend's RMSNorm methods; the kernels and the ops that launch
// them are in rmsnorm_kernels.cuh.
#include "kernels/cuda/rmsnorm_kernels.cuh"

namespace adgt {

void CudaBackend::rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                  double eps) {
  cuda::rmsnorm_forward(cuda::op_ctx(*this), out, rstd, x, w, eps);
}

void CudaBackend::rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                   const Tensor& w, const Tensor& rstd) {
  cuda::rmsnorm_backward(cuda::op_ctx(*this), dx, dw, dout, x, w, rstd);
}

void CudaBackend::residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                           const Tensor& w, double eps) {
  if (x.dtype != DType::BF16) {
    Backend::residual_rmsnorm_forward(x, y, out, rstd, w, eps);
    return;
  }
  cuda::residual_rmsnorm_forward(cuda::op_ctx(*this), x, y, out, rstd, w, eps);
}

}  // namespace adgt
