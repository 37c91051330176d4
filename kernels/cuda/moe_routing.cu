// The CUDA backend's mixture-of-experts routing methods; the kernels, the
// checks and the ops that launch them are in moe_routing_kernels.cuh.
#include "kernels/cuda/moe_routing_kernels.cuh"

namespace adgt {

void CudaBackend::moe_route(const MoeRouting& r, const Tensor& logits, const Tensor& bias) {
  cuda::moe_route(cuda::op_ctx(*this), r, logits, bias);
}

void CudaBackend::moe_dispatch_plan(Tensor pos, Tensor send_tok, Tensor stats,
                                    const Tensor& choice, const Tensor& probs, const Tensor& slot,
                                    const MoeCapacity& cap) {
  cuda::moe_dispatch_plan(cuda::op_ctx(*this), pos, send_tok, stats, choice, probs, slot, cap);
}

void CudaBackend::moe_router_backward(Tensor dlogits, const MoeRouting& r, const Tensor& dw,
                                      const Tensor& aux_dp, double a) {
  cuda::moe_router_backward(cuda::op_ctx(*this), dlogits, r, dw, aux_dp, a);
}

}  // namespace adgt
