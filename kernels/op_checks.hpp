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
