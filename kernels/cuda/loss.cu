// The CUDA backend's classifier methods; the kernels and the ops that launch
// them are in loss_kernels.cuh.
#include "kernels/cuda/loss_kernels.cuh"

namespace adgt {

void CudaBackend::cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                                double grad_scale) {
  cuda::cross_entropy(cuda::op_ctx(*this), logits, losses, targets, grad_scale);
}

void CudaBackend::ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                                   int64_t vocab_start, int64_t valid) {
  cuda::ce_partial_stats(cuda::op_ctx(*this), stats, logits, targets, vocab_start, valid);
}

void CudaBackend::ce_combine(Tensor combined, const Tensor& gathered) {
  cuda::ce_combine(cuda::op_ctx(*this), combined, gathered);
}

void CudaBackend::ce_finish(Tensor logits, Tensor losses, const Tensor& combined,
                            const Tensor& targets, int64_t vocab_start, int64_t valid,
                            double grad_scale) {
  cuda::ce_finish(cuda::op_ctx(*this), logits, losses, combined, targets, vocab_start, valid,
                  grad_scale);
}

}  // namespace adgt
