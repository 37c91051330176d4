// The CUDA backend's mixture-of-experts combine methods; the kernels, the
// checks and the ops that launch them are in combine_kernels.cuh.
#include "kernels/cuda/combine_kernels.cuh"

namespace adgt {

void CudaBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                               bool accumulate) {
  cuda::combine_rows(cuda::op_ctx(*this), out, y, pos, w, accumulate);
}

void CudaBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                        const Tensor& pos, const Tensor& w) {
  cuda::combine_rows_backward(cuda::op_ctx(*this), dy, dw, dout, y, pos, w);
}

}  // namespace adgt
