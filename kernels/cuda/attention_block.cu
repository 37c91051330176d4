// The CUDA backend's blockwise attention with log-sum-exp (ring attention's
// ops): the launchers of attention_block_kernels.cuh on the backend's stream
// and scratch.
#include "kernels/cuda/attention_block_kernels.cuh"

namespace adgt {

void CudaBackend::attention_block_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const AttentionBlock& b) {
  cuda::attention_block_forward_exact(cuda::op_ctx(*this), out, lse, q, k, v, b);
}

void CudaBackend::attention_merge(Tensor out, Tensor lse, const Tensor& out_b,
                                  const Tensor& lse_b) {
  cuda::attention_merge_exact(cuda::op_ctx(*this), out, lse, out_b, lse_b);
}

void CudaBackend::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& lse,
                                           const AttentionBlock& b, bool accumulate_dq) {
  cuda::attention_block_backward_exact(cuda::op_ctx(*this), dq, dk, dv, dout, q, k, v, out, lse, b,
                                       accumulate_dq);
}

}  // namespace adgt
