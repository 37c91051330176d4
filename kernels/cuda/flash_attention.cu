// Host launchers of the FlashAttention-2-style bf16 attention
// (flash_attention.cuh). The kernels and their design notes are in
// flash_attention_kernels.cuh, the inline-PTX wrappers they use in
// flash_ptx.cuh; tests/tools/flash_sim_test.cpp runs the same kernel source
// in a host emulation (ctest flash_attention_emulated).
#include <cuda_bf16.h>

// The host compilation pass sees the device-only helpers unused (warning 177).
#pragma nv_diag_suppress 177
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"

namespace adgt::cuda {
namespace {

template <class K>
void set_smem(K kernel, size_t bytes, const char* op) {
  ADGT_CUDA_OP(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
               op);
}

// The whole causal attention is the causal block of Tq = Tk = T whose keys
// start at position 0 (doc_start's positions are the keys' indices).
AttentionBlock causal_block(const AttentionShape& s) {
  AttentionBlock b{s.B, s.T, s.T, s.n_heads, s.n_kv_heads, s.head_dim, BlockMask::causal};
  b.q_doc_start = s.doc_start;
  return b;
}

// The kernels' parameters of a block: Tq rows against Tk keys, packed
// documents' starts with key 0 at k_pos.
FlashParams params_of(const AttentionBlock& b, bool acc_dq) {
  FlashParams p = block_params(b.Tq, b.Tk, b.n_heads, b.n_kv_heads, b.head_dim, acc_dq);
  p.doc = b.q_doc_start;
  p.doc_off = int(b.k_pos);
  return p;
}

// Grids of the query blocks (forward, dQ) and the key blocks (dK/dV).
dim3 grid_of(const AttentionBlock& b, int64_t rows, int64_t heads) {
  return dim3(unsigned((rows + kBlock - 1) / kBlock), unsigned(heads), unsigned(b.B));
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

// FULL: every key visible (a ring block off the diagonal); else causal.
template <int HD, bool FULL>
void forward_hd(cudaStream_t st, uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
                const uint16_t* v, const AttentionBlock& b, const char* op) {
  set_smem(flash_fwd_kernel<HD, FULL>, fwd_smem<HD>(), op);
  flash_fwd_kernel<HD, FULL><<<grid_of(b, b.Tq, b.n_heads), kThreads, fwd_smem<HD>(), st>>>(
      out, lse, q, k, v, params_of(b, false));
  ADGT_LAUNCH_CHECK(op);
}

template <int HD, bool FULL>
void backward_hd(cudaStream_t st, uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                 const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* lse,
                 const float* D, const AttentionBlock& b, bool acc_dq, const char* op1,
                 const char* op2) {
  const FlashParams p = params_of(b, acc_dq);
  set_smem(flash_bwd_dkdv_kernel<HD, FULL>, dkdv_smem<HD>(), op1);
  flash_bwd_dkdv_kernel<HD, FULL><<<grid_of(b, b.Tk, b.n_kv_heads), kThreads, dkdv_smem<HD>(), st>>>(
      dk, dv, q, k, v, dout, lse, D, p);
  ADGT_LAUNCH_CHECK(op1);
  set_smem(flash_bwd_dq_kernel<HD, FULL>, dq_smem<HD>(), op2);
  flash_bwd_dq_kernel<HD, FULL><<<grid_of(b, b.Tq, b.n_heads), kThreads, dq_smem<HD>(), st>>>(
      dq, q, k, v, dout, lse, D, p);
  ADGT_LAUNCH_CHECK(op2);
}

// The instance of (head_dim, full) for b: f(hd, full) with compile-time values.
template <class F>
void dispatch(const AttentionBlock& b, const char* op, F&& f) {
  ADGT_CHECK(b.mask == BlockMask::full || b.Tq == b.Tk,
             op << ": a causal block of Tq " << b.Tq << " != Tk " << b.Tk);
  ADGT_CHECK(b.head_dim == 64 || b.head_dim == 128,
             op << ": head_dim=" << b.head_dim << " not supported (64 or 128)");
  const bool full = b.mask == BlockMask::full;
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  if (b.head_dim == 64)
    full ? f(I64{}, std::true_type{}) : f(I64{}, std::false_type{});
  else
    full ? f(I128{}, std::true_type{}) : f(I128{}, std::false_type{});
}

void forward(cudaStream_t st, uint16_t* out, float* lse, const uint16_t* q, const uint16_t* k,
             const uint16_t* v, const AttentionBlock& b, const char* op) {
  dispatch(b, op, [&](auto hd, auto full) {
    forward_hd<decltype(hd)::value, decltype(full)::value>(st, out, lse, q, k, v, b, op);
  });
}

// D from (the final) out, then the kernels with (the final) lse.
void backward(cudaStream_t st, uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
              const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* out,
              const float* lse, float* D, const AttentionBlock& b, bool acc_dq, const char* op,
              const char* op_d, const char* op1, const char* op2) {
  dispatch(b, op, [&](auto hd, auto full) {
    launch_dsum(st, D, dout, out, b.B, b.Tq, b.n_heads, b.head_dim, op_d);
    backward_hd<decltype(hd)::value, decltype(full)::value>(st, dq, dk, dv, dout, q, k, v, lse, D, b,
                                                            acc_dq, op1, op2);
  });
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
  forward(stream, out, lse, q, k, v, causal_block(s), "attention_forward (flash)");
}

size_t flash_attention_scratch_bytes(const AttentionShape& s) {
  return flash_attention_block_scratch_bytes(causal_block(s));
}

void flash_attention_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                              const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                              const uint16_t* v, const uint16_t* out, const float* lse,
                              float* scratch, const AttentionShape& s) {
  backward(stream, dq, dk, dv, dout, q, k, v, out, lse, scratch, causal_block(s), false,
           "attention_backward (flash)", "attention_backward (flash D)",
           "attention_backward (flash dk, dv)", "attention_backward (flash dq)");
}

void flash_attention_block_forward(cudaStream_t stream, uint16_t* out, float* lse,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const AttentionBlock& b) {
  forward(stream, out, lse, q, k, v, b, "attention_block_forward (flash)");
}

size_t flash_attention_block_scratch_bytes(const AttentionBlock& b) {
  return size_t(b.B * b.n_heads * b.Tq) * sizeof(float);
}

void flash_attention_block_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                                    const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                                    const uint16_t* v, const uint16_t* out, const float* lse,
                                    float* scratch, const AttentionBlock& b, bool accumulate_dq) {
  backward(stream, dq, dk, dv, dout, q, k, v, out, lse, scratch, b, accumulate_dq,
           "attention_block_backward (flash)", "attention_block_backward (flash D)",
           "attention_block_backward (flash dk, dv)", "attention_block_backward (flash dq)");
}

}  // namespace adgt::cuda
