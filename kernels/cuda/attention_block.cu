// The CUDA backend's blockwise attention with log-sum-exp (ring attention's
// ops): bf16 blocks on the flash kernels where flash_path allows
// (flash_attention.cuh, block_params; head_dim 64 or 128), the rest on the
// exact kernels of attention_block_kernels.cuh; the backend's stream and
// scratch.
#include <algorithm>

#include "kernels/cuda/attention_block_kernels.cuh"
#include "kernels/cuda/flash_attention.cuh"

namespace adgt {

bool CudaBackend::block_flash(const AttentionBlock& b, const Tensor& q,
                              std::initializer_list<const void*> tensors) {
  if (q.dtype != DType::BF16 || (b.mask == BlockMask::causal && b.Tq != b.Tk))
    return false;
  return flash_path(AttentionShape{b.B, std::max(b.Tq, b.Tk), b.n_heads, b.n_kv_heads, b.head_dim},
                    tensors);
}

void CudaBackend::attention_block_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const AttentionBlock& b) {
  if (block_flash(b, q, {out.data, q.data, k.data, v.data})) {
    const char* op = "attention_block_forward (flash)";
    check_attention_block(b, q, k, v, op);
    check_block_outputs(b, out, lse, q.dtype, op);
    cuda::flash_attention_block_forward(stream_, out.ptr<uint16_t>(), lse.ptr<float>(),
                                        q.ptr<uint16_t>(), k.ptr<uint16_t>(), v.ptr<uint16_t>(), b);
    return;
  }
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
  if (block_flash(b, q, {dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data})) {
    const char* op = "attention_block_backward (flash)";
    check_attention_block(b, q, k, v, op);
    check_block_outputs(b, out, lse, q.dtype, op);
    check_block_grads(dq, dk, dv, dout, q, k, op);
    float* D = static_cast<float*>(scratch(kScratchFlash, cuda::flash_attention_block_scratch_bytes(b)));
    cuda::flash_attention_block_backward(stream_, dq.ptr<uint16_t>(), dk.ptr<uint16_t>(),
                                         dv.ptr<uint16_t>(), dout.ptr<uint16_t>(), q.ptr<uint16_t>(),
                                         k.ptr<uint16_t>(), v.ptr<uint16_t>(), out.ptr<uint16_t>(),
                                         lse.ptr<float>(), D, b, accumulate_dq);
    return;
  }
  cuda::attention_block_backward_exact(cuda::op_ctx(*this), dq, dk, dv, dout, q, k, v, out, lse, b,
                                       accumulate_dq);
}

}  // namespace adgt
