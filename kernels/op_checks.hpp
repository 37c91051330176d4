// Preconditions of ops that every backend checks the same way, so the CPU
// reference and the CUDA backend (kernels/cuda/*_kernels.cuh, also run in the
// CUDA emulation) refuse the same calls with the same messages.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// Blockwise attention (attention_block_*): n_kv_heads divides n_heads, every
// size positive, a causal block square (Tq == Tk); q (B,Tq,H,hd), k and v
// (B,Tk,KV,hd) by element count, in one dtype.
inline void check_attention_block(const AttentionBlock& b, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const char* op) {
  ADGT_CHECK(b.n_kv_heads > 0 && b.n_heads % b.n_kv_heads == 0,
             op << ": n_kv_heads=" << b.n_kv_heads << " must divide n_heads=" << b.n_heads);
  ADGT_CHECK(b.B > 0 && b.Tq > 0 && b.Tk > 0 && b.head_dim > 0,
             op << ": B=" << b.B << " Tq=" << b.Tq << " Tk=" << b.Tk << " head_dim=" << b.head_dim
                << " must all be positive");
  ADGT_CHECK(b.mask != BlockMask::causal || b.Tq == b.Tk,
             op << ": a causal block is the diagonal one: Tq=" << b.Tq << " must equal Tk="
                << b.Tk << " (use BlockMask::full for a block of earlier keys)");
  ADGT_CHECK(q.numel() == b.B * b.Tq * b.n_heads * b.head_dim &&
                 k.numel() == b.B * b.Tk * b.n_kv_heads * b.head_dim && v.numel() == k.numel(),
             op << ": q" << q.shape_str() << " k" << k.shape_str() << " v" << v.shape_str()
                << " for B=" << b.B << " Tq=" << b.Tq << " Tk=" << b.Tk << " H=" << b.n_heads
                << " KV=" << b.n_kv_heads << " hd=" << b.head_dim);
  ADGT_CHECK(q.dtype == k.dtype && q.dtype == v.dtype && q.dtype != DType::I32,
             op << ": q " << dtype_name(q.dtype) << ", k " << dtype_name(k.dtype) << ", v "
                << dtype_name(v.dtype) << ": one float dtype expected");
}
// out (B,Tq,H,hd) in q's dtype a; lse (B,H,Tq) in the statistics dtype (f32
// for bf16, else a).
inline void check_block_outputs(const AttentionBlock& b, const Tensor& out, const Tensor& lse,
                                DType a, const char* op) {
  const DType st = a == DType::BF16 ? DType::F32 : a;
  ADGT_CHECK(out.numel() == b.B * b.Tq * b.n_heads * b.head_dim && out.dtype == a &&
                 lse.numel() == b.B * b.n_heads * b.Tq && lse.dtype == st,
             op << ": out" << out.shape_str() << " " << dtype_name(out.dtype) << ", lse"
                << lse.shape_str() << " " << dtype_name(lse.dtype) << ": expected out (B,Tq,H,hd) "
                << dtype_name(a) << " and lse (B,H,Tq) " << dtype_name(st));
}
// dq, dout like q; dk, dv like k.
inline void check_block_grads(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k,
                              const char* op) {
  ADGT_CHECK(dq.numel() == q.numel() && dout.numel() == q.numel() && dk.numel() == k.numel() &&
                 dv.numel() == k.numel() && dq.dtype == q.dtype && dout.dtype == q.dtype &&
                 dk.dtype == q.dtype && dv.dtype == q.dtype,
             op << ": dq" << dq.shape_str() << " " << dtype_name(dq.dtype) << " dk"
                << dk.shape_str() << " " << dtype_name(dk.dtype) << " dv" << dv.shape_str() << " "
                << dtype_name(dv.dtype) << " dout" << dout.shape_str() << " "
                << dtype_name(dout.dtype) << ": expected dq and dout like q" << q.shape_str()
                << ", dk and dv like k" << k.shape_str() << ", all " << dtype_name(q.dtype));
}
// attention_merge: lse and lse_b (B,H,Tq) give the shape; out and out_b
// (B,Tq,H,hd) in one float dtype a, lse and lse_b in the statistics dtype.
// Returns the shape as a block (Tk unused).
inline AttentionBlock check_attention_merge(const Tensor& out, const Tensor& lse,
                                            const Tensor& out_b, const Tensor& lse_b,
                                            const char* op) {
  ADGT_CHECK(lse.ndim == 3 && lse.numel() > 0 && out.numel() % lse.numel() == 0,
             op << ": lse" << lse.shape_str() << " must be (B,H,Tq) and out" << out.shape_str()
                << " (B,Tq,H,hd)");
  AttentionBlock b;
  b.B = lse.dim(0), b.n_heads = lse.dim(1), b.Tq = lse.dim(2), b.Tk = b.Tq;
  b.n_kv_heads = b.n_heads, b.head_dim = out.numel() / lse.numel();
  ADGT_CHECK(out.dtype != DType::I32,
             op << ": out " << dtype_name(out.dtype) << " is not a float dtype");
  check_block_outputs(b, out, lse, out.dtype, op);
  check_block_outputs(b, out_b, lse_b, out.dtype, op);
  return b;
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


// Mixture-of-experts routing (Backend::moe_route, moe_dispatch_plan,
// moe_router_backward): the routing tensors' shapes and dtypes. R = f64 for
// f64 logits, else f32.
struct MoeDims {
  int64_t N, E, k;
};
inline DType moe_route_dtype(DType logits) { return logits == DType::F64 ? DType::F64 : DType::F32; }
inline MoeDims check_moe_routing(const Backend::MoeRouting& r, DType act, const char* op) {
  const DType R = moe_route_dtype(act);
  const int64_t N = r.probs.ndim == 2 ? r.probs.dim(0) : -1, E = r.probs.ndim == 2 ? r.probs.dim(1) : -1;
  const int64_t k = r.choice.ndim == 2 ? r.choice.dim(1) : -1;
  ADGT_CHECK(N >= 0 && E >= 1 && k >= 1 && k <= E && r.probs.dtype == R &&
                 r.choice.dtype == DType::I32 && r.choice.dim(0) == N && r.weight.dtype == R &&
                 r.weight.numel() == N * k && r.norm.dtype == R && r.norm.numel() == N &&
                 r.w.dtype == act && r.w.numel() == N * k,
             op << ": probs" << r.probs.shape_str() << " " << dtype_name(r.probs.dtype) << ", choice"
                << r.choice.shape_str() << " " << dtype_name(r.choice.dtype) << ", weight"
                << r.weight.shape_str() << ", norm" << r.norm.shape_str() << ", w" << r.w.shape_str()
                << " " << dtype_name(r.w.dtype) << ": expected probs (N,E) and weight (N,k), norm (N) in "
                << dtype_name(R) << ", choice (N,k) int32 with 1 <= k <= E, w (N,k) in "
                << dtype_name(act));
  return {N, E, k};
}
inline MoeDims check_moe_route(const Backend::MoeRouting& r, const Tensor& logits,
                               const Tensor& bias, const char* op) {
  const MoeDims d = check_moe_routing(r, logits.dtype, op);
  ADGT_CHECK(logits.numel() == d.N * d.E,
             op << ": logits" << logits.shape_str() << " must be (N,E) = (" << d.N << "," << d.E << ")");
  ADGT_CHECK(!bias.data || (bias.dtype == DType::F64 && bias.numel() == d.E),
             op << ": bias" << bias.shape_str() << " " << dtype_name(bias.dtype) << " must be F64 ("
                << d.E << ") or empty");
  return d;
}
inline MoeDims check_moe_plan(const Tensor& pos, const Tensor& send_tok, const Tensor& stats,
                              const Tensor& choice, const Tensor& probs, const Tensor& slot,
                              const char* op) {
  const int64_t N = choice.ndim == 2 ? choice.dim(0) : -1, k = choice.ndim == 2 ? choice.dim(1) : -1;
  const int64_t E = probs.ndim == 2 ? probs.dim(1) : -1;
  ADGT_CHECK(N >= 0 && k >= 1 && E >= k && choice.dtype == DType::I32 && probs.dim(0) == N &&
                 (probs.dtype == DType::F32 || probs.dtype == DType::F64) &&
                 pos.dtype == DType::I32 && pos.numel() == N * k &&
                 send_tok.dtype == DType::I32 && send_tok.numel() >= N * k &&
                 stats.dtype == DType::F64 && stats.numel() == 3 * E + 2 &&
                 slot.dtype == DType::I32 && slot.numel() == E,
             op << ": choice" << choice.shape_str() << " probs" << probs.shape_str() << " pos"
                << pos.shape_str() << " send_tok" << send_tok.shape_str() << " stats"
                << stats.shape_str() << " " << dtype_name(stats.dtype) << " slot" << slot.shape_str()
                << ": expected int32 choice (N,k), probs (N,E) f32/f64, int32 pos (N,k), send_tok "
                   "(>= N*k), slot (E), F64 stats (3E+2)");
  return {N, E, k};
}
// moe_dispatch_plan's capacity (Backend::MoeCapacity): prior I32 (N /
// segment, E) with segment dividing N, or empty; group_rows >= 0. On the
// host also prior's values (>= 0) when host_prior.
inline void check_moe_capacity(const Backend::MoeCapacity& c, const MoeDims& d, const char* op,
                               bool host_prior = true) {
  ADGT_CHECK(std::isfinite(c.factor) && c.segment >= 0 && c.group_rows >= 0,
             op << ": capacity factor " << c.factor << ", segment " << c.segment << ", group_rows "
                << c.group_rows << ": expected a finite factor and segment, group_rows >= 0");
  if (!c.prior.data) return;
  ADGT_CHECK(c.segment > 0 && d.N % c.segment == 0 && c.prior.dtype == DType::I32 &&
                 c.prior.numel() == d.N / std::max<int64_t>(c.segment, 1) * d.E,
             op << ": prior" << c.prior.shape_str() << " " << dtype_name(c.prior.dtype)
                << " with segment " << c.segment << " and N = " << d.N
                << ": expected int32 (N / segment, E) = (" << (c.segment > 0 ? d.N / c.segment : -1)
                << ", " << d.E << "), segment > 0 dividing N");
  if (!host_prior) return;
  const int32_t* p = c.prior.ptr<int32_t>();
  for (int64_t i = 0; i < c.prior.numel(); ++i)
    ADGT_CHECK(p[i] >= 0, op << ": prior[" << i / d.E << ", " << i % d.E << "] = " << p[i]
                             << " (a count of assignments: >= 0)");
}
// An expert's capacity in a run of `rows` rows (Backend::MoeCapacity).
inline int64_t moe_capacity_limit(const Backend::MoeCapacity& c, int64_t rows, int64_t k,
                                  int64_t E) {
  const int64_t g = c.group_rows > 0 ? c.group_rows : rows;
  return int64_t(std::ceil(c.factor * double(g * k) / double(E)));
}
// slot (host copy): a permutation of 0..E-1.
inline void check_moe_slots(const int32_t* slot, int64_t E, const char* op) {
  std::vector<char> seen(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    ADGT_CHECK(slot[e] >= 0 && slot[e] < E && !seen[size_t(slot[e])],
               op << ": slot[" << e << "] = " << slot[e] << ": slots must be a permutation of 0.."
                  << E - 1);
    seen[size_t(slot[e])] = 1;
  }
}
inline MoeDims check_moe_router_backward(const Tensor& dlogits, const Backend::MoeRouting& r,
                                         const Tensor& dw, const Tensor& aux_dp, const char* op) {
  const MoeDims d = check_moe_routing(r, dlogits.dtype, op);
  const DType st = dlogits.dtype == DType::BF16 ? DType::F32 : dlogits.dtype;
  ADGT_CHECK(dlogits.numel() == d.N * d.E && dw.dtype == st && dw.numel() == d.N * d.k &&
                 aux_dp.dtype == DType::F64 && aux_dp.numel() == d.E,
             op << ": dlogits" << dlogits.shape_str() << " dw" << dw.shape_str() << " "
                << dtype_name(dw.dtype) << " aux_dp" << aux_dp.shape_str() << " "
                << dtype_name(aux_dp.dtype) << ": expected (N,E), (N,k) " << dtype_name(st)
                << ", F64 (E)");
  return d;
}

}  // namespace adgt
