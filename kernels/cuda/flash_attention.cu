// Host launchers of the FlashAttention-2-style bf16 attention
// (flash_attention.cuh). The kernels and their design notes are in
// flash_attention_kernels.cuh, the inline-PTX wrappers they use in
// flash_ptx.cuh; tests/tools/flash_sim_test.cpp runs the same kernel source
// in a host emulation (ctest flash_attention_emulated).
#include <cuda_bf16.h>

// The host compilation pass sees the device-only helpers unused (warning 177).
#pragma nv_diag_suppress 177
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"

namespace adgt::cuda {
namespace {

FlashParams params_of(const AttentionShape& s) {
  FlashParams p = flash_params(s.T, s.n_heads, s.n_kv_heads, s.head_dim);
  p.doc = s.doc_start;  // document masking (device memory), or nullptr
  return p;
}

template <class K>
void set_smem(K kernel, size_t bytes, const char* op) {
  ADGT_CUDA_OP(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
               op);
}

dim3 grid_of(const AttentionShape& s, int64_t heads) {
  return dim3(unsigned((s.T + kBlock - 1) / kBlock), unsigned(heads), unsigned(s.B));
}

template <int HD>
void forward_hd(cudaStream_t st, uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                const uint16_t* v, const AttentionShape& s) {
  const char* op = "attention_forward (flash)";
  set_smem(flash_fwd_kernel<HD>, fwd_smem<HD>(), op);
  flash_fwd_kernel<HD><<<grid_of(s, s.n_heads), kThreads, fwd_smem<HD>(), st>>>(out, lse, q, k, v,
                                                                                 params_of(s));
  ADGT_LAUNCH_CHECK(op);
}

template <int HD>
void backward_hd(cudaStream_t st, uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                 const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* lse,
                 const float* D, const AttentionShape& s) {
  const FlashParams p = params_of(s);
  const char* op1 = "attention_backward (flash dk, dv)";
  set_smem(flash_bwd_dkdv_kernel<HD>, dkdv_smem<HD>(), op1);
  flash_bwd_dkdv_kernel<HD><<<grid_of(s, s.n_kv_heads), kThreads, dkdv_smem<HD>(), st>>>(
      dk, dv, q, k, v, dout, lse, D, p);
  ADGT_LAUNCH_CHECK(op1);
  const char* op2 = "attention_backward (flash dq)";
  set_smem(flash_bwd_dq_kernel<HD>, dq_smem<HD>(), op2);
  flash_bwd_dq_kernel<HD><<<grid_of(s, s.n_heads), kThreads, dq_smem<HD>(), st>>>(
      dq, q, k, v, dout, lse, D, p);
  ADGT_LAUNCH_CHECK(op2);
}

// D = rowsum(dout * out) per row (B, T rows, H heads), fp32 into D.
void launch_dsum(cudaStream_t st, float* D, const uint16_t* dout, const uint16_t* out, int64_t B,
                 int64_t T, int64_t H, int64_t hd, const char* op) {
  const int64_t rows = B * T * H;
  const int threads = 256;
  flash_bwd_dsum_kernel<<<grid_for(rows * 32, threads), threads, 0, st>>>(D, dout, out, rows, int(T),
                                                                          int(H), int(hd));
  ADGT_LAUNCH_CHECK(op);
}

// A ring block's kernels (FULL: every key visible; else the causal
// diagonal): grids of the query blocks (forward, dQ) and the key blocks
// (dK/dV) of their Tq and Tk.
template <int HD, bool FULL>
void block_forward_hd(cudaStream_t st, uint16_t* out, float* lse, const uint16_t* q,
                      const uint16_t* k, const uint16_t* v, const AttentionBlock& b) {
  const char* op = "attention_block_forward (flash)";
  FlashParams p = block_params(b.Tq, b.Tk, b.n_heads, b.n_kv_heads, b.head_dim, false);
  p.doc = b.q_doc_start;  // packed documents: each row's start; key 0 at k_pos
  p.doc_off = int(b.k_pos);
  set_smem(flash_fwd_kernel<HD, FULL>, fwd_smem<HD>(), op);
  const dim3 grid(unsigned((b.Tq + kBlock - 1) / kBlock), unsigned(b.n_heads), unsigned(b.B));
  flash_fwd_kernel<HD, FULL><<<grid, kThreads, fwd_smem<HD>(), st>>>(out, lse, q, k, v, p);
  ADGT_LAUNCH_CHECK(op);
}

template <int HD, bool FULL>
void block_backward_hd(cudaStream_t st, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                       const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                       const float* lse, const float* D, const AttentionBlock& b, bool acc_dq) {
  FlashParams p = block_params(b.Tq, b.Tk, b.n_heads, b.n_kv_heads, b.head_dim, acc_dq);
  p.doc = b.q_doc_start;
  p.doc_off = int(b.k_pos);
  const char* op1 = "attention_block_backward (flash dk, dv)";
  set_smem(flash_bwd_dkdv_kernel<HD, FULL>, dkdv_smem<HD>(), op1);
  const dim3 gk(unsigned((b.Tk + kBlock - 1) / kBlock), unsigned(b.n_kv_heads), unsigned(b.B));
  flash_bwd_dkdv_kernel<HD, FULL><<<gk, kThreads, dkdv_smem<HD>(), st>>>(dk, dv, q, k, v, dout, lse,
                                                                         D, p);
  ADGT_LAUNCH_CHECK(op1);
  const char* op2 = "attention_block_backward (flash dq)";
  set_smem(flash_bwd_dq_kernel<HD, FULL>, dq_smem<HD>(), op2);
  const dim3 gq(unsigned((b.Tq + kBlock - 1) / kBlock), unsigned(b.n_heads), unsigned(b.B));
  flash_bwd_dq_kernel<HD, FULL><<<gq, kThreads, dq_smem<HD>(), st>>>(dq, q, k, v, dout, lse, D, p);
  ADGT_LAUNCH_CHECK(op2);
}

}  // namespace

bool flash_attention_device_ok(int device, int64_t head_dim) {
  int major = 0, optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (major < 8) return false;
  const size_t need = head_dim == 64
                          ? std::max({fwd_smem<64>(), dkdv_smem<64>(), dq_smem<64>()})
                          : std::max({fwd_smem<128>(), dkdv_smem<128>(), dq_smem<128>()});
  return need <= size_t(optin);
}

void flash_attention_forward(cudaStream_t stream, uint16_t* out, float* lse, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, const AttentionShape& s) {
  if (s.head_dim == 64)
    forward_hd<64>(stream, out, lse, q, k, v, s);
  else if (s.head_dim == 128)
    forward_hd<128>(stream, out, lse, q, k, v, s);
  else
    ADGT_CHECK(false, "attention_forward (flash): head_dim=" << s.head_dim
                                                             << " not supported (64 or 128)");
}

size_t flash_attention_scratch_bytes(const AttentionShape& s) {
  return size_t(s.B * s.n_heads * s.T) * sizeof(float);
}

void flash_attention_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                              const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                              const uint16_t* v, const uint16_t* out, const float* lse,
                              float* scratch, const AttentionShape& s) {
  ADGT_CHECK(s.head_dim == 64 || s.head_dim == 128,
             "attention_backward (flash): head_dim=" << s.head_dim << " not supported (64 or 128)");
  launch_dsum(stream, scratch, dout, out, s.B, s.T, s.n_heads, s.head_dim,
              "attention_backward (flash D)");
  if (s.head_dim == 64)
    backward_hd<64>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, s);
  else
    backward_hd<128>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, s);
}

void flash_attention_block_forward(cudaStream_t stream, uint16_t* out, float* lse,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const AttentionBlock& b) {
  ADGT_CHECK(b.mask == BlockMask::full || b.Tq == b.Tk,
             "attention_block_forward (flash): a causal block of Tq " << b.Tq << " != Tk " << b.Tk);
  const bool full = b.mask == BlockMask::full;
  if (b.head_dim == 64)
    full ? block_forward_hd<64, true>(stream, out, lse, q, k, v, b)
         : block_forward_hd<64, false>(stream, out, lse, q, k, v, b);
  else if (b.head_dim == 128)
    full ? block_forward_hd<128, true>(stream, out, lse, q, k, v, b)
         : block_forward_hd<128, false>(stream, out, lse, q, k, v, b);
  else
    ADGT_CHECK(false, "attention_block_forward (flash): head_dim=" << b.head_dim
                                                                   << " not supported (64 or 128)");
}

size_t flash_attention_block_scratch_bytes(const AttentionBlock& b) {
  return size_t(b.B * b.n_heads * b.Tq) * sizeof(float);
}

void flash_attention_block_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                                    const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                                    const uint16_t* v, const uint16_t* out, const float* lse,
                                    float* scratch, const AttentionBlock& b, bool accumulate_dq) {
  ADGT_CHECK((b.mask == BlockMask::full || b.Tq == b.Tk) && (b.head_dim == 64 || b.head_dim == 128),
             "attention_block_backward (flash): a causal block of Tq != Tk, or head_dim="
                 << b.head_dim << " (64 or 128)");
  // D = rowsum(dout * out) of the final out, then the kernels with the final lse.
  launch_dsum(stream, scratch, dout, out, b.B, b.Tq, b.n_heads, b.head_dim,
              "attention_block_backward (flash D)");
  const bool full = b.mask == BlockMask::full;
  if (b.head_dim == 64)
    full ? block_backward_hd<64, true>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, b, accumulate_dq)
         : block_backward_hd<64, false>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, b, accumulate_dq);
  else
    full ? block_backward_hd<128, true>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, b, accumulate_dq)
         : block_backward_hd<128, false>(stream, dq, dk, dv, dout, q, k, v, lse, scratch, b, accumulate_dq);
}

}  // namespace adgt::cuda
