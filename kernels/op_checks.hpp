// Preconditions of ops that every backend checks the same way, so the CPU
// reference and the CUDA backend (kernels/cuda/*_kernels.cuh, also run in the
// CUDA emulation) refuse the same calls with the same messages.
#pragma once
#include <cstdint>

#include "kernels/backend.hpp"

namespace adgt {

// Causal GQA attention: n_kv_heads divides n_heads; q (B,T,H,hd), k and v
// (B,T,KV,hd) by element count.
inline void check_attention_shapes(const AttentionShape& s, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const char* op) {
  ADGT_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
             op << ": n_kv_heads=" << s.n_kv_heads << " must divide n_heads=" << s.n_heads);
  ADGT_CHECK(q.numel() == s.B * s.T * s.n_heads * s.head_dim &&
                 k.numel() == s.B * s.T * s.n_kv_heads * s.head_dim && v.numel() == k.numel(),
             op << ": q" << q.shape_str() << " k" << k.shape_str() << " v" << v.shape_str());
}

// The fused q/k/v rotary (qkv_rope_split, qkv_rope_merge_backward): qkv
// (rows, Hq + 2 KV, hd), q (rows, Hq, hd), k and v (rows, KV, hd) by element
// count, in one dtype; cos and sin (>= T, hd/2) tables in the statistics
// dtype (f32 for bf16, else the same); rows a multiple of T.
struct QkvDims {
  int64_t rows, Hq, KV, half;
};
inline QkvDims check_qkv_shapes(const Tensor& qkv, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& cos, const Tensor& sin,
                                int64_t T, const char* op) {
  const DType a = qkv.dtype, st = a == DType::BF16 ? DType::F32 : a;
  ADGT_CHECK(q.dtype == a && k.dtype == a && v.dtype == a && cos.dtype == st && sin.dtype == st,
             op << ": qkv " << dtype_name(a) << ", q " << dtype_name(q.dtype) << ", k "
                << dtype_name(k.dtype) << ", v " << dtype_name(v.dtype) << ", cos/sin "
                << dtype_name(cos.dtype) << "/" << dtype_name(sin.dtype) << " (tables "
                << dtype_name(st) << " expected)");
  const int64_t half = cos.ndim == 2 ? cos.dim(1) : 0, hd = 2 * half;
  const int64_t rows = qkv.ndim >= 1 ? qkv.dim(0) : 0;
  ADGT_CHECK(half > 0 && sin.numel() == cos.numel() && rows > 0 && T > 0 && rows % T == 0 &&
                 cos.dim(0) >= T,
             op << ": qkv" << qkv.shape_str() << " cos" << cos.shape_str() << " sin"
                << sin.shape_str() << " T=" << T);
  const int64_t Hq = q.numel() / (rows * hd), KV = k.numel() / (rows * hd);
  ADGT_CHECK(Hq > 0 && KV > 0 && q.numel() == rows * Hq * hd && k.numel() == rows * KV * hd &&
                 v.numel() == k.numel() && qkv.numel() == rows * (Hq + 2 * KV) * hd,
             op << ": qkv" << qkv.shape_str() << " q" << q.shape_str() << " k" << k.shape_str()
                << " v" << v.shape_str() << " with head_dim " << hd << ": qkv must be (rows, "
                << "Hq + 2 KV, hd)");
  return {rows, Hq, KV, half};
}

// The packed SwiGLU: h (N, F) and gu (N, 2F) in one dtype. Returns F.
inline int64_t check_swiglu_packed(const Tensor& h, const Tensor& gu, const char* op) {
  ADGT_CHECK(h.dtype == gu.dtype,
             op << ": dtype mismatch " << dtype_name(h.dtype) << " vs " << dtype_name(gu.dtype));
  const int64_t N = h.ndim == 2 ? h.dim(0) : -1, F = h.ndim == 2 ? h.dim(1) : -1;
  ADGT_CHECK(N >= 0 && gu.ndim == 2 && gu.dim(0) == N && gu.dim(1) == 2 * F,
             op << ": h" << h.shape_str() << " must be (N, F) and gu" << gu.shape_str()
                << " (N, 2F)");
  return F;
}

// combine_rows(_backward): pos int32 (N,k), y (M,C), rows_nc (N,C) in y's
// dtype, w empty or one weight per pos in y's dtype.
inline void check_combine_shapes(const Tensor& rows_nc, const Tensor& y, const Tensor& pos,
                                 const Tensor& w, const char* op) {
  const int64_t N = pos.ndim == 2 ? pos.dim(0) : -1, C = y.ndim == 2 ? y.dim(1) : -1;
  ADGT_CHECK(pos.dtype == DType::I32 && pos.ndim == 2 && y.ndim == 2 &&
                 rows_nc.numel() == N * C && rows_nc.dtype == y.dtype,
             op << ": pos" << pos.shape_str() << " (int32 (N,k)), y" << y.shape_str()
                << " (M,C), rows" << rows_nc.shape_str() << " (N,C)");
  ADGT_CHECK(!w.data || (w.numel() == pos.numel() && w.dtype == y.dtype),
             op << ": weights" << w.shape_str() << " must match pos" << pos.shape_str() << " in "
                << dtype_name(y.dtype));
}

// Every pos (n of them, host memory) below y's row count: an out-of-range row
// would be read outside y. Negative = a dropped slot.
inline void check_combine_pos(const int32_t* pos, int64_t n, const Tensor& y, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    ADGT_CHECK(pos[i] < y.dim(0),
               op << ": pos[" << i << "] = " << pos[i] << " outside y" << y.shape_str());
}

}  // namespace adgt
