// CUDA causal grouped-query attention: a straightforward, exact kernel, the
// path of f32 and f64 and of the shapes the FlashAttention-2 style kernels
// (flash_attention_kernels.cuh) do not take (attention.cu chooses).
// q(B,T,H,hd), k,v(B,T,KV,hd).
//
// Forward: one block per (query row i, head h, batch b). Scores s_j = scale
// q_i.k_j for j <= i (one warp per key, lanes over hd) go to shared memory,
// softmax there, out_i = sum_j p_j v_j. Saved: the row log-sum-exp (B,H,T).
//
// Backward, recomputing p_ij = exp(s_ij - lse_i):
//   1. one block per (i, h, b): dP_ij = dO_i.v_j, D_i = sum_j p_ij dP_ij,
//      dS_ij = p_ij (dP_ij - D_i), dQ_i = scale sum_j dS_ij k_j; D_i to scratch;
//   2. one block per (key row j, kv head, b): over the group's heads and i >= j,
//      dV_j = sum p_ij dO_i, dK_j = scale sum dS_ij q_i.
// No atomics: every output element is summed by one thread (or a fixed tree)
// in a fixed order, so results are deterministic. head_dim <= 256.
//
// Document masking (AttentionShape::doc_start, doc_start[b*T + i] <= i,
// non-decreasing): row i's keys are [doc_start_i, i] instead of [0, i]; the
// forward and dQ kernels start their key loops there (masked keys never enter
// the max or the sums), and the dK/dV kernel ends its query rows at the first
// row whose document starts after key j (a binary search: rows past it see
// key j no more), so masked ranges cost nothing. Without it (nullptr) the
// loops are the plain causal ones, unchanged.
//
// bf16 (q, k, v, out, dq, dk, dv, dout bf16; saved fp32): the FlashAttention-2
// style tensor-core kernels of flash_attention.cu for head_dim 64 and 128;
// any other bf16 shape (or ADGT_ATTENTION=exact) runs these exact fp32
// kernels on fp32 copies in scratch and rounds the results to bf16 once.
// Both write the same `saved` (the natural-log row log-sum-exp of the scaled
// scores), so either backward accepts either forward's `saved`.
//
// Blocks (attention_block_kernels.cuh, ring attention's ops): the same three
// kernels over Tq query rows and Tk key rows per sequence (AttDims::T, Tk),
// with every key visible (AttDims::full) or the causal diagonal block; the
// block backward's D = rowsum(dout * out) comes precomputed (d_given) and dq
// may accumulate (acc_dq). Packed documents in a block: doc holds each query
// row's document start in whole-sequence positions and key j sits at
// doc_off + j (AttentionBlock::q_doc_start, k_pos), so row i's keys start at
// max(0, doc_i - doc_off), a row may see none (out 0, lse -inf), and a key's
// rows end at the first whose document starts after it. The whole-sequence
// attention leaves them off (doc_off 0).
//
// This header holds the exact kernels and the ops that launch them (f32, f64,
// and bf16 through fp32 copies); attention.cu (the CUDA backend's methods)
// picks flash or exact and includes it, as does the host emulation's test
// (tests/kernel_sim/attention_sim_test.cpp).
#pragma once
#include "kernels/common/bf16.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_checks.hpp"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 256;  // >= head_dim
constexpr int kChunk = 64;     // query rows per step of the dK/dV kernel

struct AttDims {
  int64_t B, T, H, KV, hd, group;  // T: query rows per sequence
  const int32_t* doc = nullptr;  // (B*T) each token's document start; nullptr: causal
  // The blockwise ops (attention_block_kernels.cuh) only; the whole-sequence
  // attention leaves them as dims_of sets them (Tk = T, causal, D computed,
  // dq overwritten).
  int64_t Tk = 0;        // key rows per sequence (T for the whole-sequence attention)
  bool full = false;     // every key visible to every query row (else causal: j <= i)
  bool d_given = false;  // the dq kernel reads D from Dbuf instead of computing it
  bool acc_dq = false;   // dq += instead of dq =
  int64_t doc_off = 0;   // with doc: the whole-sequence position of key 0
};

// One past the last key of query row i: i + 1 (causal), or every key (full).
__device__ __forceinline__ int64_t row_end_key(const AttDims& s, int64_t i) {
  return s.full ? s.Tk : i + 1;
}
// The first query row that attends key j: j (causal), or 0 (full).
__device__ __forceinline__ int64_t key_first_row(const AttDims& s, int64_t j) {
  return s.full ? 0 : j;
}

// The first key of row i of sequence b: its document's start (0 without a
// mask), as a key index (a block's keys begin at doc_off; past Tk: none).
__device__ __forceinline__ int64_t row_first_key(const AttDims& s, int64_t b, int64_t i) {
  if (!s.doc) return 0;
  const int64_t f = int64_t(s.doc[b * s.T + i]) - s.doc_off;
  return f > 0 ? f : 0;
}

// One past the last query row of sequence b that attends key j: rows from
// key_first_row attend it while their document starts at or before the key's
// position doc_off + j (non-decreasing, so a binary search); T without a mask.
__device__ __forceinline__ int64_t key_rows_end(const AttDims& s, int64_t b, int64_t j) {
  if (!s.doc) return s.T;
  const int32_t* ds = s.doc + b * s.T;
  const int64_t pos = s.doc_off + j;
  int64_t lo = key_first_row(s, j), hi = s.T;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ds[mid] > pos)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// a.b over hd elements, lanes over d; every lane gets the sum (fixed order).
template <class T>
__device__ __forceinline__ T warp_dot(const T* a, const T* b, int64_t hd, int lane) {
  T acc = 0;
  for (int64_t d = lane; d < hd; d += 32) acc += a[d] * b[d];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

template <class T>
__global__ void attn_fwd_kernel(T* __restrict__ out, T* __restrict__ lse, const T* __restrict__ q,
                                const T* __restrict__ k, const T* __restrict__ v, AttDims s,
                                T scale) {
  ADGT_DYNAMIC_SMEM(smem_raw);
  T* sq = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* p = sq + s.hd;                         // (Tk)
  T* part = p + s.Tk;                       // (blockDim)
  __shared__ T red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / s.group;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const T* Q = q + (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.Tk * ldk + kh * hd;
  const T* V = v + b * s.Tk * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) sq[d] = Q[d];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t j0 = row_first_key(s, b, i);  // keys [j0, je)
  const int64_t je = row_end_key(s, i);
  T mx = -INFINITY;
  for (int64_t j = j0 + warp; j < je; j += nw) {
    const T sc = scale * warp_dot(sq, K + j * ldk, hd, lane);
    if (lane == 0) p[j] = sc;
    mx = sc > mx ? sc : mx;
  }
  mx = block_max(mx, red);  // its barriers also publish p
  T sum = 0;
  for (int64_t j = j0 + threadIdx.x; j < je; j += blockDim.x) {
    const T e = dexp(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  const T inv = T(1) / sum;
  for (int64_t j = j0 + threadIdx.x; j < je; j += blockDim.x) p[j] *= inv;
  __syncthreads();
  // out_i[d]: G groups of hd threads each sum every G-th key, then a fixed-order sum.
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  if (e < G * hd) {
    const int64_t d = e % hd, g = e / hd;
    T acc = 0;
    for (int64_t j = j0 + g; j < je; j += G) acc += p[j] * V[j * ldk + d];
    part[e] = acc;
  }
  __syncthreads();
  if (e < hd) {
    T acc = 0;
    for (int64_t g = 0; g < G; ++g) acc += part[g * hd + e];
    out[(b * s.T + i) * ldq + h * hd + e] = acc;
  }
  // A row with no key (je == j0): out 0 and lse -inf (mx -inf, log 0 -inf).
  if (e == 0) lse[(b * s.H + h) * s.T + i] = mx + dlog(sum);
}

template <class T>
__global__ void attn_bwd_dq_kernel(T* __restrict__ dq, T* __restrict__ Dbuf,
                                   const T* __restrict__ dout, const T* __restrict__ q,
                                   const T* __restrict__ k, const T* __restrict__ v,
                                   const T* __restrict__ lse, AttDims s, T scale) {
  ADGT_DYNAMIC_SMEM(smem_raw);
  T* sq = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* sdo = sq + s.hd;                       // (hd)
  T* p = sdo + s.hd;                        // (Tk): p, then dS
  T* dp = p + s.Tk;                         // (Tk)
  T* part = dp + s.Tk;                      // (blockDim)
  __shared__ T red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / s.group;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const int64_t qoff = (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.Tk * ldk + kh * hd;
  const T* V = v + b * s.Tk * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    sq[d] = q[qoff + d];
    sdo[d] = dout[qoff + d];
  }
  const T L = lse[(b * s.H + h) * s.T + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t j0 = row_first_key(s, b, i);  // keys [j0, je), as the forward
  const int64_t je = row_end_key(s, i);
  for (int64_t j = j0 + warp; j < je; j += nw) {
    const T sc = scale * warp_dot(sq, K + j * ldk, hd, lane);
    const T dpv = warp_dot(sdo, V + j * ldk, hd, lane);
    if (lane == 0) {
      p[j] = dexp(sc - L);
      dp[j] = dpv;
    }
  }
  __syncthreads();
  T D;
  if (s.d_given) {
    D = Dbuf[(b * s.H + h) * s.T + i];
  } else {
    T dsum = 0;
    for (int64_t j = j0 + threadIdx.x; j < je; j += blockDim.x) dsum += p[j] * dp[j];
    D = block_sum(dsum, red);
    if (threadIdx.x == 0) Dbuf[(b * s.H + h) * s.T + i] = D;
  }
  for (int64_t j = j0 + threadIdx.x; j < je; j += blockDim.x) p[j] = p[j] * (dp[j] - D);
  __syncthreads();
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  if (e < G * hd) {
    const int64_t d = e % hd, g = e / hd;
    T acc = 0;
    for (int64_t j = j0 + g; j < je; j += G) acc += p[j] * K[j * ldk + d];
    part[e] = acc;
  }
  __syncthreads();
  if (e < hd) {
    T acc = 0;
    for (int64_t g = 0; g < G; ++g) acc += part[g * hd + e];
    dq[qoff + e] = s.acc_dq ? dq[qoff + e] + scale * acc : scale * acc;
  }
}

template <class T>
__global__ void attn_bwd_dkv_kernel(T* __restrict__ dk, T* __restrict__ dv,
                                    const T* __restrict__ dout, const T* __restrict__ q,
                                    const T* __restrict__ k, const T* __restrict__ v,
                                    const T* __restrict__ lse, const T* __restrict__ Dbuf,
                                    AttDims s, T scale) {
  ADGT_DYNAMIC_SMEM(smem_raw);
  T* sk = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* sv = sk + s.hd;                        // (hd)
  T* pc = sv + s.hd;                        // (kChunk) p_ij of the chunk
  T* dsc = pc + kChunk;                     // (kChunk) dS_ij of the chunk
  T* partk = dsc + kChunk;                  // (blockDim)
  T* partv = partk + blockDim.x;            // (blockDim)
  const int64_t j = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const int64_t koff = (b * s.Tk + j) * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    sk[d] = k[koff + d];
    sv[d] = v[koff + d];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  const int64_t d = e % hd, g = e / hd;
  const int64_t ibeg = key_first_row(s, j);
  const int64_t iend = key_rows_end(s, b, j);  // query rows [ibeg, iend) attend key j
  T acck = 0, accv = 0;
  for (int64_t hh = 0; hh < s.group; ++hh) {
    const int64_t h = kh * s.group + hh;
    const T* Q = q + b * s.T * ldq + h * hd;
    const T* dO = dout + b * s.T * ldq + h * hd;
    const T* L = lse + (b * s.H + h) * s.T;
    const T* Dh = Dbuf + (b * s.H + h) * s.T;
    for (int64_t i0 = ibeg; i0 < iend; i0 += kChunk) {
      const int64_t cnt = iend - i0 < kChunk ? iend - i0 : kChunk;
      for (int64_t ii = warp; ii < cnt; ii += nw) {
        const int64_t i = i0 + ii;
        // The same dot products, in the same order, as attn_bwd_dq_kernel.
        const T sc = scale * warp_dot(Q + i * ldq, sk, hd, lane);
        const T dpv = warp_dot(dO + i * ldq, sv, hd, lane);
        if (lane == 0) {
          const T pv = dexp(sc - L[i]);
          pc[ii] = pv;
          dsc[ii] = pv * (dpv - Dh[i]);
        }
      }
      __syncthreads();
      if (e < G * hd) {
        for (int64_t ii = g; ii < cnt; ii += G) {
          const int64_t i = i0 + ii;
          accv += pc[ii] * dO[i * ldq + d];
          acck += dsc[ii] * Q[i * ldq + d];
        }
      }
      __syncthreads();
    }
  }
  if (e < G * hd) {
    partk[e] = acck;
    partv[e] = accv;
  }
  __syncthreads();
  if (e < hd) {
    T sk_ = 0, sv_ = 0;
    for (int64_t gg = 0; gg < G; ++gg) {
      sk_ += partk[gg * hd + e];
      sv_ += partv[gg * hd + e];
    }
    dk[koff + e] = scale * sk_;
    dv[koff + e] = sv_;
  }
}

__global__ void bf16_to_f32_kernel(float* __restrict__ dst, const uint16_t* __restrict__ src,
                                   int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = bf16_to_float(src[i]);
}
__global__ void f32_to_bf16_kernel(uint16_t* __restrict__ dst, const float* __restrict__ src,
                                   int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = float_to_bf16(src[i]);
}
void to_f32(const OpCtx& c, float* dst, const void* src, int64_t n, const char* op) {
  launch(op, bf16_to_f32_kernel, grid_for(n, 256), 256, 0, c.stream, dst,
         static_cast<const uint16_t*>(src), n);
}
void to_bf16(const OpCtx& c, void* dst, const float* src, int64_t n, const char* op) {
  launch(op, f32_to_bf16_kernel, grid_for(n, 256), 256, 0, c.stream, static_cast<uint16_t*>(dst),
         src, n);
}

// The row log-sum-exp (B, H, T): the elements of `saved`.
inline int64_t attention_lse_elems(const AttentionShape& s) { return s.B * s.n_heads * s.T; }

void check_shapes(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                  const char* op) {
  check_attention_shapes(s, q, k, v, op);
  ADGT_CHECK(q.dtype == k.dtype && k.dtype == v.dtype, op << ": dtype mismatch");
  ADGT_CHECK(s.head_dim > 0 && s.head_dim <= kThreads,
             op << ": head_dim=" << s.head_dim << " not supported by the CUDA attention kernel "
                << "(1.." << kThreads << ")");
  ADGT_CHECK(s.T <= INT_MAX && s.n_heads <= 65535 && s.B <= 65535 && s.n_kv_heads <= 65535,
             op << ": B=" << s.B << " T=" << s.T << " H=" << s.n_heads
                << " exceed the kernel's grid (B, H <= 65535)");
}

// The forward's preconditions (flash or exact); false when there is nothing
// to compute (B, T or H zero).
bool attention_forward_checks(const Tensor& out, const Tensor& saved, const Tensor& q,
                              const Tensor& k, const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  check_shapes(s, q, k, v, op);
  const DType sdt = q.dtype == DType::BF16 ? DType::F32 : q.dtype;
  ADGT_CHECK(saved.numel() >= attention_lse_elems(s) && out.numel() == q.numel() &&
                 saved.dtype == sdt && out.dtype == q.dtype,
             op << ": saved" << saved.shape_str() << " " << dtype_name(saved.dtype) << " out"
                << out.shape_str() << " " << dtype_name(out.dtype) << " (q " << dtype_name(q.dtype)
                << "; saved must be " << dtype_name(sdt) << ")");
  return s.B && s.T && s.n_heads;
}

// The backward's preconditions (flash or exact); false when there is nothing
// to compute.
bool attention_backward_checks(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& saved,
                               const AttentionShape& s) {
  const char* op = "attention_backward";
  check_shapes(s, q, k, v, op);
  ADGT_CHECK(dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel() &&
                 dout.numel() == q.numel() && saved.numel() >= attention_lse_elems(s),
             op << ": gradient shapes dq" << dq.shape_str() << " dk" << dk.shape_str() << " dv"
                << dv.shape_str() << " dout" << dout.shape_str() << " saved"
                << saved.shape_str());
  const bool bf = q.dtype == DType::BF16;
  const DType sdt = bf ? DType::F32 : q.dtype;
  ADGT_CHECK(dq.dtype == q.dtype && dk.dtype == q.dtype && dv.dtype == q.dtype &&
                 dout.dtype == q.dtype && saved.dtype == sdt,
             op << ": dtypes dq " << dtype_name(dq.dtype) << " dk " << dtype_name(dk.dtype)
                << " dv " << dtype_name(dv.dtype) << " dout " << dtype_name(dout.dtype)
                << " saved " << dtype_name(saved.dtype) << "; with q " << dtype_name(q.dtype)
                << " they must be " << dtype_name(q.dtype) << " (saved " << dtype_name(sdt)
                << ")");
  if (!s.B || !s.T || !s.n_heads) return false;
  // The flash backward reads `out`; the exact one does not, but takes the same arguments.
  ADGT_CHECK(!bf || (out.dtype == DType::BF16 && out.numel() == q.numel()),
             op << ": out" << out.shape_str() << " " << dtype_name(out.dtype)
                << " must be bf16 like q");
  return true;
}

AttDims dims_of(const AttentionShape& s) {
  AttDims d{s.B, s.T, s.n_heads, s.n_kv_heads, s.head_dim, s.n_heads / s.n_kv_heads, s.doc_start};
  d.Tk = s.T;
  return d;
}

// Raises the kernel's dynamic shared-memory limit when `bytes` needs more than
// the default 48 KB; a clear error when the device cannot give it. The current
// device: the one the op's stream (and cudaFuncSetAttribute) belongs to.
template <class K>
void allow_smem(K kernel, size_t bytes, const char* op) {
  // The limits are on static + dynamic shared memory (the kernels' reduction
  // arrays are static): 48 KiB without the opt-in, the device's opt-in with it.
  cudaFuncAttributes fa{};
  ADGT_CUDA_OP(cudaFuncGetAttributes(&fa, kernel), op);
  const size_t total = bytes + fa.sharedSizeBytes;
  if (total <= 48 * 1024) return;
  int device = 0, optin = 0;
  ADGT_CUDA_OP(cudaGetDevice(&device), op);
  ADGT_CUDA_OP(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op);
  ADGT_CHECK(total <= size_t(optin), op << ": sequence length needs " << bytes
                                         << " bytes of dynamic (+" << fa.sharedSizeBytes
                                         << " static) shared memory per block; the device has "
                                         << optin << " (shorten seq_len or use fp32)");
  ADGT_CUDA_OP(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
               op);
}

// The exact kernels, T = float or double (also bf16's fallback, in fp32), on
// the dims d (the whole sequence's, dims_of, or a block's). ops: the launches'
// names (forward; dq; dk, dv).
struct ExactOps {
  const char *fwd, *dq, *dkv;
};
constexpr ExactOps kAttentionOps{"attention_forward", "attention_backward (dq)",
                                 "attention_backward (dk, dv)"};

template <class T>
void exact_forward(const OpCtx& c, T* out, T* lse, const T* q, const T* k, const T* v,
                   const AttDims& d, const char* op) {
  const size_t smem = size_t(d.hd + d.Tk + kThreads) * sizeof(T);
  allow_smem(attn_fwd_kernel<T>, smem, op);
  const T scale = T(1) / std::sqrt(T(d.hd));
  launch(op, attn_fwd_kernel<T>, dim3(unsigned(d.T), unsigned(d.H), unsigned(d.B)), kThreads,
         smem, c.stream, out, lse, q, k, v, d, scale);
}

// D: B*H*T elements of scratch (d.d_given: D already there).
template <class T>
void exact_backward(const OpCtx& c, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                    const T* v, const T* lse, T* D, const AttDims& d, const ExactOps& ops) {
  const T scale = T(1) / std::sqrt(T(d.hd));
  const size_t smem1 = size_t(2 * d.hd + 2 * d.Tk + kThreads) * sizeof(T);
  allow_smem(attn_bwd_dq_kernel<T>, smem1, ops.dq);
  launch(ops.dq, attn_bwd_dq_kernel<T>, dim3(unsigned(d.T), unsigned(d.H), unsigned(d.B)),
         kThreads, smem1, c.stream, dq, D, dout, q, k, v, lse, d, scale);
  const size_t smem2 = size_t(2 * d.hd + 2 * kChunk + 2 * kThreads) * sizeof(T);
  launch(ops.dkv, attn_bwd_dkv_kernel<T>, dim3(unsigned(d.Tk), unsigned(d.KV), unsigned(d.B)),
         kThreads, smem2, c.stream, dk, dv, dout, q, k, v, lse, D, d, scale);
}

// bf16 attention (whole sequence or block, by d) through the exact fp32
// kernel on fp32 copies (scratch: q, k, v, out); lse fp32.
inline void exact_forward_bf16(const OpCtx& c, Tensor out, float* lse, const Tensor& q,
                               const Tensor& k, const Tensor& v, const AttDims& d, const char* op) {
  const int64_t nq = q.numel(), nk = k.numel();
  float* w = static_cast<float*>(
      c.scratch(CudaBackend::kScratchFlash, size_t(2 * nq + 2 * nk) * sizeof(float)));
  float *q32 = w, *k32 = q32 + nq, *v32 = k32 + nk, *o32 = v32 + nk;
  to_f32(c, q32, q.data, nq, op);
  to_f32(c, k32, k.data, nk, op);
  to_f32(c, v32, v.data, nk, op);
  exact_forward<float>(c, o32, lse, q32, k32, v32, d, op);
  to_bf16(c, out.data, o32, nq, op);
}

// out (B,T,H,hd) and saved (the row log-sum-exp, B*H*T) overwritten by the
// exact kernel: f32, f64, or bf16 through fp32 copies.
void attention_forward_exact(const OpCtx& c, Tensor out, Tensor saved, const Tensor& q,
                             const Tensor& k, const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  if (!attention_forward_checks(out, saved, q, k, v, s)) return;
  if (q.dtype == DType::BF16) {
    exact_forward_bf16(c, out, saved.ptr<float>(), q, k, v, dims_of(s), op);
    return;
  }
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    exact_forward<T>(c, out.ptr<T>(), saved.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(),
                     dims_of(s), op);
  });
}

// dq, dk, dv overwritten by the exact kernels from the exact or the flash
// forward's `saved`: f32, f64, or bf16 through fp32 copies. `out` is not read.
void attention_backward_exact(const OpCtx& c, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& saved, const AttentionShape& s) {
  const char* op = "attention_backward";
  if (!attention_backward_checks(dq, dk, dv, dout, q, k, v, out, saved, s)) return;
  const size_t nrows = size_t(attention_lse_elems(s));
  if (q.dtype == DType::BF16) {
    // The exact fp32 kernels on fp32 copies (scratch: dout, q, dq, k, v, dk, dv).
    const int64_t nq = q.numel(), nk = k.numel();
    float* w = static_cast<float*>(
        c.scratch(CudaBackend::kScratchFlash, size_t(3 * nq + 4 * nk) * sizeof(float)));
    float *do32 = w, *q32 = do32 + nq, *dq32 = q32 + nq, *k32 = dq32 + nq, *v32 = k32 + nk,
          *dk32 = v32 + nk, *dv32 = dk32 + nk;
    float* D = static_cast<float*>(c.scratch(CudaBackend::kScratchAttention, nrows * 4));
    to_f32(c, do32, dout.data, nq, op);
    to_f32(c, q32, q.data, nq, op);
    to_f32(c, k32, k.data, nk, op);
    to_f32(c, v32, v.data, nk, op);
    exact_backward<float>(c, dq32, dk32, dv32, do32, q32, k32, v32, saved.ptr<float>(), D,
                          dims_of(s), kAttentionOps);
    to_bf16(c, dq.data, dq32, nq, op);
    to_bf16(c, dk.data, dk32, nk, op);
    to_bf16(c, dv.data, dv32, nk, op);
    return;
  }
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    T* D = static_cast<T*>(c.scratch(CudaBackend::kScratchAttention, nrows * sizeof(T)));
    exact_backward<T>(c, dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), dout.ptr<T>(), q.ptr<T>(),
                      k.ptr<T>(), v.ptr<T>(), saved.ptr<T>(), D, dims_of(s), kAttentionOps);
  });
}

}  // namespace
}  // namespace adgt::cuda
