// CUDA causal grouped-query attention: a straightforward, exact kernel (not
// FlashAttention; issue 4 replaces it). q(B,T,H,hd), k,v(B,T,KV,hd).
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
#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

constexpr int kThreads = 256;  // >= head_dim
constexpr int kChunk = 64;     // query rows per step of the dK/dV kernel

struct AttDims {
  int64_t B, T, H, KV, hd, group;
};

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
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* p = sq + s.hd;                         // (T)
  T* part = p + s.T;                        // (blockDim)
  __shared__ T red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / s.group;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const T* Q = q + (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.T * ldk + kh * hd;
  const T* V = v + b * s.T * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) sq[d] = Q[d];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  T mx = -INFINITY;
  for (int64_t j = warp; j <= i; j += nw) {
    const T sc = scale * warp_dot(sq, K + j * ldk, hd, lane);
    if (lane == 0) p[j] = sc;
    mx = sc > mx ? sc : mx;
  }
  mx = block_max(mx, red);  // its barriers also publish p
  T sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const T e = dexp(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  const T inv = T(1) / sum;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) p[j] *= inv;
  __syncthreads();
  // out_i[d]: G groups of hd threads each sum every G-th key, then a fixed-order sum.
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  if (e < G * hd) {
    const int64_t d = e % hd, g = e / hd;
    T acc = 0;
    for (int64_t j = g; j <= i; j += G) acc += p[j] * V[j * ldk + d];
    part[e] = acc;
  }
  __syncthreads();
  if (e < hd) {
    T acc = 0;
    for (int64_t g = 0; g < G; ++g) acc += part[g * hd + e];
    out[(b * s.T + i) * ldq + h * hd + e] = acc;
  }
  if (e == 0) lse[(b * s.H + h) * s.T + i] = mx + dlog(sum);
}

template <class T>
__global__ void attn_bwd_dq_kernel(T* __restrict__ dq, T* __restrict__ Dbuf,
                                   const T* __restrict__ dout, const T* __restrict__ q,
                                   const T* __restrict__ k, const T* __restrict__ v,
                                   const T* __restrict__ lse, AttDims s, T scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* sdo = sq + s.hd;                       // (hd)
  T* p = sdo + s.hd;                        // (T): p, then dS
  T* dp = p + s.T;                          // (T)
  T* part = dp + s.T;                       // (blockDim)
  __shared__ T red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / s.group;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const int64_t qoff = (b * s.T + i) * ldq + h * hd;
  const T* K = k + b * s.T * ldk + kh * hd;
  const T* V = v + b * s.T * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    sq[d] = q[qoff + d];
    sdo[d] = dout[qoff + d];
  }
  const T L = lse[(b * s.H + h) * s.T + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t j = warp; j <= i; j += nw) {
    const T sc = scale * warp_dot(sq, K + j * ldk, hd, lane);
    const T dpv = warp_dot(sdo, V + j * ldk, hd, lane);
    if (lane == 0) {
      p[j] = dexp(sc - L);
      dp[j] = dpv;
    }
  }
  __syncthreads();
  T dsum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dsum += p[j] * dp[j];
  const T D = block_sum(dsum, red);
  if (threadIdx.x == 0) Dbuf[(b * s.H + h) * s.T + i] = D;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) p[j] = p[j] * (dp[j] - D);
  __syncthreads();
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  if (e < G * hd) {
    const int64_t d = e % hd, g = e / hd;
    T acc = 0;
    for (int64_t j = g; j <= i; j += G) acc += p[j] * K[j * ldk + d];
    part[e] = acc;
  }
  __syncthreads();
  if (e < hd) {
    T acc = 0;
    for (int64_t g = 0; g < G; ++g) acc += part[g * hd + e];
    dq[qoff + e] = scale * acc;
  }
}

template <class T>
__global__ void attn_bwd_dkv_kernel(T* __restrict__ dk, T* __restrict__ dv,
                                    const T* __restrict__ dout, const T* __restrict__ q,
                                    const T* __restrict__ k, const T* __restrict__ v,
                                    const T* __restrict__ lse, const T* __restrict__ Dbuf,
                                    AttDims s, T scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sk = reinterpret_cast<T*>(smem_raw);  // (hd)
  T* sv = sk + s.hd;                        // (hd)
  T* pc = sv + s.hd;                        // (kChunk) p_ij of the chunk
  T* dsc = pc + kChunk;                     // (kChunk) dS_ij of the chunk
  T* partk = dsc + kChunk;                  // (blockDim)
  T* partv = partk + blockDim.x;            // (blockDim)
  const int64_t j = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const int64_t hd = s.hd, ldq = s.H * hd, ldk = s.KV * hd;
  const int64_t koff = (b * s.T + j) * ldk + kh * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    sk[d] = k[koff + d];
    sv[d] = v[koff + d];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t G = blockDim.x / hd, e = threadIdx.x;
  const int64_t d = e % hd, g = e / hd;
  T acck = 0, accv = 0;
  for (int64_t hh = 0; hh < s.group; ++hh) {
    const int64_t h = kh * s.group + hh;
    const T* Q = q + b * s.T * ldq + h * hd;
    const T* dO = dout + b * s.T * ldq + h * hd;
    const T* L = lse + (b * s.H + h) * s.T;
    const T* Dh = Dbuf + (b * s.H + h) * s.T;
    for (int64_t i0 = j; i0 < s.T; i0 += kChunk) {
      const int64_t cnt = s.T - i0 < kChunk ? s.T - i0 : kChunk;
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

void check_shapes(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                  const char* op) {
  ADGT_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
             op << ": n_kv_heads=" << s.n_kv_heads << " must divide n_heads=" << s.n_heads);
  ADGT_CHECK(q.numel() == s.B * s.T * s.n_heads * s.head_dim &&
                 k.numel() == s.B * s.T * s.n_kv_heads * s.head_dim && v.numel() == k.numel(),
             op << ": q" << q.shape_str() << " k" << k.shape_str() << " v" << v.shape_str());
  ADGT_CHECK(q.dtype == k.dtype && k.dtype == v.dtype, op << ": dtype mismatch");
  ADGT_CHECK(s.head_dim > 0 && s.head_dim <= kThreads,
             op << ": head_dim=" << s.head_dim << " not supported by the CUDA attention kernel "
                << "(1.." << kThreads << ")");
  ADGT_CHECK(s.T <= INT_MAX && s.n_heads <= 65535 && s.B <= 65535 && s.n_kv_heads <= 65535,
             op << ": B=" << s.B << " T=" << s.T << " H=" << s.n_heads
                << " exceed the kernel's grid (B, H <= 65535)");
}

AttDims dims_of(const AttentionShape& s) {
  return {s.B, s.T, s.n_heads, s.n_kv_heads, s.head_dim, s.n_heads / s.n_kv_heads};
}

// Raises the kernel's dynamic shared-memory limit when `bytes` needs more than
// the default 48 KB; a clear error when the device cannot give it.
template <class K>
void allow_smem(K kernel, size_t bytes, int device, const char* op) {
  if (bytes <= 48 * 1024) return;
  int optin = 0;
  ADGT_CUDA_OP(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op);
  ADGT_CHECK(bytes <= size_t(optin), op << ": sequence length needs " << bytes
                                        << " bytes of shared memory per block; the device has "
                                        << optin << " (shorten seq_len or use fp32)");
  ADGT_CUDA_OP(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
               op);
}

}  // namespace

int64_t CudaBackend::attention_saved_elems(const AttentionShape& s) const {
  return s.B * s.n_heads * s.T;
}

void CudaBackend::attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  check_shapes(s, q, k, v, op);
  ADGT_CHECK(saved.numel() >= attention_saved_elems(s) && out.numel() == q.numel() &&
                 saved.dtype == q.dtype && out.dtype == q.dtype,
             op << ": saved" << saved.shape_str() << " out" << out.shape_str());
  if (!s.B || !s.T || !s.n_heads) return;
  const AttDims d = dims_of(s);
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    const size_t smem = size_t(s.head_dim + s.T + kThreads) * sizeof(T);
    allow_smem(attn_fwd_kernel<T>, smem, device_, op);
    const T scale = T(1) / std::sqrt(T(s.head_dim));
    attn_fwd_kernel<T><<<dim3(unsigned(s.T), unsigned(s.n_heads), unsigned(s.B)), kThreads, smem,
                         stream_>>>(out.ptr<T>(), saved.ptr<T>(), q.ptr<T>(), k.ptr<T>(),
                                    v.ptr<T>(), d, scale);
  });
  ADGT_LAUNCH_CHECK(op);
}

void CudaBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& /*out*/, const Tensor& saved,
                                     const AttentionShape& s) {
  const char* op = "attention_backward";
  check_shapes(s, q, k, v, op);
  ADGT_CHECK(dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel() &&
                 dout.numel() == q.numel() && saved.numel() >= attention_saved_elems(s),
             op << ": gradient shapes dq" << dq.shape_str() << " dk" << dk.shape_str() << " dv"
                << dv.shape_str() << " dout" << dout.shape_str() << " saved"
                << saved.shape_str());
  if (!s.B || !s.T || !s.n_heads) return;
  const AttDims d = dims_of(s);
  dispatch(q.dtype, op, [&](auto z) {
    using T = decltype(z);
    const T scale = T(1) / std::sqrt(T(s.head_dim));
    T* D = static_cast<T*>(scratch(kScratchAttention, size_t(s.B * s.n_heads * s.T) * sizeof(T)));
    const size_t smem1 = size_t(2 * s.head_dim + 2 * s.T + kThreads) * sizeof(T);
    allow_smem(attn_bwd_dq_kernel<T>, smem1, device_, op);
    attn_bwd_dq_kernel<T><<<dim3(unsigned(s.T), unsigned(s.n_heads), unsigned(s.B)), kThreads,
                            smem1, stream_>>>(dq.ptr<T>(), D, dout.ptr<T>(), q.ptr<T>(),
                                              k.ptr<T>(), v.ptr<T>(), saved.ptr<T>(), d, scale);
    ADGT_LAUNCH_CHECK("attention_backward (dq)");
    const size_t smem2 = size_t(2 * s.head_dim + 2 * kChunk + 2 * kThreads) * sizeof(T);
    attn_bwd_dkv_kernel<T><<<dim3(unsigned(s.T), unsigned(s.n_kv_heads), unsigned(s.B)), kThreads,
                             smem2, stream_>>>(dk.ptr<T>(), dv.ptr<T>(), dout.ptr<T>(),
                                               q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), saved.ptr<T>(),
                                               D, d, scale);
  });
  ADGT_LAUNCH_CHECK("attention_backward (dk, dv)");
}

}  // namespace adgt
