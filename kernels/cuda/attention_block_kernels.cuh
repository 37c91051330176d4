// CUDA blockwise attention with log-sum-exp statistics: the CUDA backend's
// attention_block_forward, attention_merge and attention_block_backward (ring
// attention's ops, parallel/cp/; the semantics are kernels/backend.hpp's, the
// reference kernels/cpu/attention_block.cpp). bf16 blocks of head_dim 64 or
// 128 take the flash kernels instead (attention_block.cu,
// CudaBackend::block_flash; flash_attention_kernels.cuh block_params); these
// are the rest. Correct first, not fast:
//
//   forward   the exact forward kernel of attention_kernels.cuh on the
//             block's dims (Tq query rows, Tk key rows; every key visible,
//             or the causal diagonal block; with packed documents only the
//             keys at or after the row's document start): out and lse
//             (B,H,Tq), the natural-log log-sum-exp of each row's scaled
//             scores. A row with no visible key (its document starts after
//             the block's keys) gets out 0 and lse -inf.
//   merge     one warp per row (b, h, i), lanes over hd: the online-softmax
//             merge of (out_b, lse_b) into (out, lse) around the larger lse;
//             an lse_b of -inf leaves the row, an lse of -inf takes the
//             block's row as it is.
//   backward  D = rowsum(dout * out) of the FINAL out (one warp per row), then
//             the exact dq and dk/dv kernels with that D (AttDims::d_given)
//             and P = exp(scale q k^T - lse) of the final lse; dq overwritten
//             or accumulated (AttDims::acc_dq), dk and dv overwritten (a kv
//             group's heads summed in the dk/dv kernel, no atomics).
//
// f32 and f64 run the kernels directly; bf16 runs the fp32 kernels on fp32
// copies in scratch and rounds each result to bf16 once, as the CPU does (lse
// is fp32 throughout). Deterministic: no atomics, fixed summation orders.
// Included by attention_block.cu and by the host emulation's test
// (tests/kernel_sim/attention_block_sim_test.cpp).
#pragma once
#include "kernels/cuda/attention_kernels.cuh"

namespace adgt::cuda {
namespace {

// Rows (b, h, i) of the lse layout (B,H,Tq), one warp each; out's row
// ((b*Tq + i)*H + h)*hd. Warp-uniform: r is the same for the warp's lanes.
struct BlockRows {
  int64_t H, Tq, hd, rows;
  __device__ __forceinline__ int64_t out_off(int64_t r) const {
    const int64_t i = r % Tq, bh = r / Tq;
    return ((bh / H * Tq + i) * H + bh % H) * hd;
  }
};

// The first row of this warp and the stride over rows (blockDim a multiple of 32).
__device__ __forceinline__ int64_t warp_row0() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
}
__device__ __forceinline__ int64_t warp_rows_stride() {
  return (int64_t(gridDim.x) * blockDim.x) >> 5;
}

template <class T>
__global__ void attn_merge_kernel(T* __restrict__ out, T* __restrict__ lse,
                                  const T* __restrict__ out_b, const T* __restrict__ lse_b,
                                  BlockRows s) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row0(); r < s.rows; r += warp_rows_stride()) {
    const T l = lse[r], lb = lse_b[r];
    if (lb == T(-INFINITY)) continue;  // the block saw no key: nothing to add
    T* o = out + s.out_off(r);
    const T* ob = out_b + s.out_off(r);
    T nl = lb;
    if (l == T(-INFINITY)) {  // nothing yet: the block's row as it is
      for (int64_t d = lane; d < s.hd; d += 32) o[d] = ob[d];
    } else {
      // Around the larger of the two: the other's weight is exp(-|l - lb|) <= 1.
      const T m = l > lb ? l : lb, wa = dexp(l - m), wb = dexp(lb - m);
      const T sum = wa + wb, fa = wa / sum, fb = wb / sum;
      for (int64_t d = lane; d < s.hd; d += 32) o[d] = fa * o[d] + fb * ob[d];
      nl = m + dlog(sum);
    }
    __syncwarp();  // every lane has read lse[r] before it changes
    if (lane == 0) lse[r] = nl;
  }
}

// D[r] = dout_r . out_r over hd (the lse layout's rows).
template <class T>
__global__ void attn_block_d_kernel(T* __restrict__ D, const T* __restrict__ dout,
                                    const T* __restrict__ out, BlockRows s) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row0(); r < s.rows; r += warp_rows_stride()) {
    const T v = warp_dot(dout + s.out_off(r), out + s.out_off(r), s.hd, lane);
    if (lane == 0) D[r] = v;
  }
}

constexpr ExactOps kBlockOps{"attention_block_forward", "attention_block_backward (dq)",
                             "attention_block_backward (dk, dv)"};

// The CUDA kernels' limits beyond check_attention_block's.
void check_block_limits(const AttentionBlock& b, const char* op) {
  ADGT_CHECK(b.head_dim <= kThreads, op << ": head_dim=" << b.head_dim
                                        << " not supported by the CUDA attention kernel (1.."
                                        << kThreads << ")");
  ADGT_CHECK(b.Tq <= INT_MAX && b.Tk <= INT_MAX && b.n_heads <= 65535 && b.B <= 65535 &&
                 b.n_kv_heads <= 65535,
             op << ": B=" << b.B << " Tq=" << b.Tq << " Tk=" << b.Tk << " H=" << b.n_heads
                << " KV=" << b.n_kv_heads << " exceed the kernel's grid (B, H, KV <= 65535)");
}

AttDims dims_of(const AttentionBlock& b) {
  AttDims d{b.B, b.Tq, b.n_heads, b.n_kv_heads, b.head_dim, b.n_heads / b.n_kv_heads};
  d.Tk = b.Tk;
  d.full = b.mask == BlockMask::full;
  d.doc = b.q_doc_start;  // packed documents: keys at k_pos + j (attention_kernels.cuh)
  d.doc_off = b.k_pos;
  return d;
}

BlockRows rows_of(const AttentionBlock& b) {
  return {b.n_heads, b.Tq, b.head_dim, b.B * b.n_heads * b.Tq};
}

// Grid of the one-warp-per-row kernels.
unsigned warp_rows_grid(int64_t rows) { return grid_for(rows * 32, kThreads); }

// out (B,Tq,H,hd) and lse (B,H,Tq) overwritten: f32, f64, or bf16 through fp32 copies.
void attention_block_forward_exact(const OpCtx& c, Tensor out, Tensor lse, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const AttentionBlock& b) {
  const char* op = kBlockOps.fwd;
  check_attention_block(b, q, k, v, op);
  check_block_outputs(b, out, lse, q.dtype, op);
  check_block_limits(b, op);
  const AttDims d = dims_of(b);
  if (q.dtype == DType::BF16) {
    exact_forward_bf16(c, out, lse.ptr<float>(), q, k, v, d, op);
    return;
  }
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    exact_forward<T>(c, out.ptr<T>(), lse.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), d, op);
  });
}

// (out, lse) updated in place with the block's (out_b, lse_b).
void attention_merge_exact(const OpCtx& c, Tensor out, Tensor lse, const Tensor& out_b,
                           const Tensor& lse_b) {
  const char* op = "attention_merge";
  const BlockRows s = rows_of(check_attention_merge(out, lse, out_b, lse_b, op));
  const unsigned grid = warp_rows_grid(s.rows);
  if (out.dtype == DType::BF16) {
    // The fp32 kernel on fp32 copies (scratch: out, out_b); out rounded once.
    const int64_t n = out.numel();
    float* w =
        static_cast<float*>(c.scratch(CudaBackend::kScratchFlash, size_t(2 * n) * sizeof(float)));
    float *o32 = w, *ob32 = w + n;
    to_f32(c, o32, out.data, n, op);
    to_f32(c, ob32, out_b.data, n, op);
    launch(op, attn_merge_kernel<float>, grid, kThreads, 0, c.stream, o32, lse.ptr<float>(),
           static_cast<const float*>(ob32), lse_b.ptr<float>(), s);
    to_bf16(c, out.data, o32, n, op);
    return;
  }
  dispatch(out.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, attn_merge_kernel<T>, grid, kThreads, 0, c.stream, out.ptr<T>(), lse.ptr<T>(),
           out_b.ptr<T>(), lse_b.ptr<T>(), s);
  });
}

// dq (=|+=), dk and dv (overwritten) of the block from the final out and lse.
void attention_block_backward_exact(const OpCtx& c, Tensor dq, Tensor dk, Tensor dv,
                                    const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    const AttentionBlock& b, bool accumulate_dq) {
  const char* op = "attention_block_backward";
  check_attention_block(b, q, k, v, op);
  check_block_outputs(b, out, lse, q.dtype, op);
  check_block_grads(dq, dk, dv, dout, q, k, op);
  check_block_limits(b, op);
  AttDims d = dims_of(b);
  d.d_given = true;
  d.acc_dq = accumulate_dq;
  const BlockRows s = rows_of(b);
  const unsigned grid = warp_rows_grid(s.rows);
  const char* op_d = "attention_block_backward (D)";
  if (q.dtype == DType::BF16) {
    // The fp32 kernels on fp32 copies (scratch: dout, q, out, dq, k, v, dk, dv).
    const int64_t nq = q.numel(), nk = k.numel();
    float* w = static_cast<float*>(
        c.scratch(CudaBackend::kScratchFlash, size_t(4 * nq + 4 * nk) * sizeof(float)));
    float *do32 = w, *q32 = do32 + nq, *o32 = q32 + nq, *dq32 = o32 + nq, *k32 = dq32 + nq,
          *v32 = k32 + nk, *dk32 = v32 + nk, *dv32 = dk32 + nk;
    float* D = static_cast<float*>(
        c.scratch(CudaBackend::kScratchAttention, size_t(s.rows) * sizeof(float)));
    to_f32(c, do32, dout.data, nq, op);
    to_f32(c, q32, q.data, nq, op);
    to_f32(c, o32, out.data, nq, op);
    if (accumulate_dq) to_f32(c, dq32, dq.data, nq, op);
    to_f32(c, k32, k.data, nk, op);
    to_f32(c, v32, v.data, nk, op);
    launch(op_d, attn_block_d_kernel<float>, grid, kThreads, 0, c.stream, D,
           static_cast<const float*>(do32), static_cast<const float*>(o32), s);
    exact_backward<float>(c, dq32, dk32, dv32, do32, q32, k32, v32, lse.ptr<float>(), D, d,
                          kBlockOps);
    to_bf16(c, dq.data, dq32, nq, op);
    to_bf16(c, dk.data, dk32, nk, op);
    to_bf16(c, dv.data, dv32, nk, op);
    return;
  }
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    T* D = static_cast<T*>(c.scratch(CudaBackend::kScratchAttention, size_t(s.rows) * sizeof(T)));
    launch(op_d, attn_block_d_kernel<T>, grid, kThreads, 0, c.stream, D, dout.ptr<T>(),
           out.ptr<T>(), s);
    exact_backward<T>(c, dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), dout.ptr<T>(), q.ptr<T>(),
                      k.ptr<T>(), v.ptr<T>(), lse.ptr<T>(), D, d, kBlockOps);
  });
}

}  // namespace
}  // namespace adgt::cuda
