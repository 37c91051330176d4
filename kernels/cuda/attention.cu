// The CUDA backend's attention methods: bf16 takes the FlashAttention-2 style
// kernels of flash_attention.cu where they apply (flash_path), everything else
// the exact kernels and the ops that launch them, attention_kernels.cuh (f32,
// f64, and bf16's fallback through fp32 copies).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/attention_path.hpp"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/flash_attention.cuh"

namespace adgt {

namespace {

// ADGT_ATTENTION: unset, "" or "flash" = the flash kernels where they apply;
// "exact" = the exact kernels for bf16 too (comparisons, debugging).
bool force_exact() {
  const char* e = std::getenv("ADGT_ATTENTION");
  if (!e || !*e || std::strcmp(e, "flash") == 0) return false;
  ADGT_CHECK(std::strcmp(e, "exact") == 0,
             "ADGT_ATTENTION=" << e << " not understood; use ADGT_ATTENTION=flash (default) or "
                               << "ADGT_ATTENTION=exact");
  return true;
}

}  // namespace

int64_t CudaBackend::attention_saved_elems(const AttentionShape& s) const {
  return cuda::attention_lse_elems(s);
}

void CudaBackend::attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionShape& s) {
  if (!cuda::attention_forward_checks(out, saved, q, k, v, s)) return;
  if (q.dtype == DType::BF16 && flash_path(s, {out.data, q.data, k.data, v.data})) {
    cuda::flash_attention_forward(stream_, out.ptr<uint16_t>(), saved.ptr<float>(),
                                  q.ptr<uint16_t>(), k.ptr<uint16_t>(), v.ptr<uint16_t>(), s);
    return;
  }
  // f32/f64, or bf16's fallback (logged once by flash_path).
  cuda::attention_forward_exact(cuda::op_ctx(*this), out, saved, q, k, v, s);
}

bool CudaBackend::flash_path(const AttentionShape& s, std::initializer_list<const void*> tensors) {
  // The one rule (kernels/attention_path.hpp); a fallback is logged the first
  // time each reason takes it.
  bool aligned = true;
  for (const void* t : tensors) aligned = aligned && cuda::aligned16(t);
  const AttentionPath p = cuda_attention_path(
      s, force_exact(), cuda::flash_attention_device_ok(device_, s.head_dim), aligned);
  if (p.flash) return true;
  if (!attention_fallbacks_.insert(p.reason).second) return false;
  std::fprintf(stderr,
               "warning: cuda attention: bf16 B=%ld T=%ld H=%ld KV=%ld head_dim=%ld runs the exact "
               "fp32 kernel instead of the flash kernels (%s): %.2f GiB of fp32 scratch and a "
               "slower kernel; head_dim 64 or 128 takes the flash path\n",
               long(s.B), long(s.T), long(s.n_heads), long(s.n_kv_heads), long(s.head_dim),
               p.reason.c_str(), double(p.fallback_bytes) / double(1 << 30));
  return false;
}

void CudaBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& saved,
                                     const AttentionShape& s) {
  if (!cuda::attention_backward_checks(dq, dk, dv, dout, q, k, v, out, saved, s)) return;
  if (q.dtype == DType::BF16 &&
      flash_path(s, {dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data})) {
    float* D = static_cast<float*>(scratch(kScratchFlash, cuda::flash_attention_scratch_bytes(s)));
    cuda::flash_attention_backward(stream_, dq.ptr<uint16_t>(), dk.ptr<uint16_t>(),
                                   dv.ptr<uint16_t>(), dout.ptr<uint16_t>(), q.ptr<uint16_t>(),
                                   k.ptr<uint16_t>(), v.ptr<uint16_t>(), out.ptr<uint16_t>(),
                                   saved.ptr<float>(), D, s);
    return;
  }
  // f32/f64, or bf16's fallback (logged once by flash_path).
  cuda::attention_backward_exact(cuda::op_ctx(*this), dq, dk, dv, dout, q, k, v, out, saved, s);
}

}  // namespace adgt
