#include "parallel/cp/ring_attention.hpp"

#include <memory>
#include <utility>

#include "kernels/check.hpp"
#include "parallel/cp/ring_schedule.hpp"

namespace adgt::cp {
namespace {

DType stats_dtype(DType a) { return a == DType::BF16 ? DType::F32 : a; }

// Part i of `parts` equal, contiguous parts of t, flat.
Tensor part(const Tensor& t, int parts, int i) {
  const int64_t n = t.numel() / parts;
  return Tensor(static_cast<char*>(t.data) + size_t(i * n) * dtype_size(t.dtype), t.dtype, {n});
}

// Local chunk h's rows of lse (2, B, H, c), as the (B, H, c) the ops take.
Tensor lse_half(const Tensor& lse, int h, const RingShape& s) {
  Tensor t = part(lse, 2, h);
  return Tensor(t.data, t.dtype, {s.B, s.n_heads, s.chunk});
}

// Memory on the backend for the length of one call.
struct Scratch {
  Buffer buf;
  Tensor t;
  Scratch(Backend& be, DType dt, int64_t n) : buf(be, size_t(n) * dtype_size(dt)) {
    t = Tensor(buf.data(), dt, {n});
  }
};

// local (B, 2c, X): per sequence [chunk r | chunk 2P-1-r] <-> chunk-major
// (2, B, c, X): each local chunk contiguous over the batch, as the block ops
// take it. 2B row copies each way.
void to_chunk_major(Backend& be, const Tensor& cm, const Tensor& local, const RingShape& s) {
  const int64_t rows = 2 * s.B * s.chunk, c = s.chunk;
  const Tensor L(local.data, local.dtype, {rows, local.numel() / rows});
  const Tensor C(cm.data, cm.dtype, {rows, cm.numel() / rows});
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < 2; ++h)
      be.copy(C.rows((h * s.B + b) * c, c), L.rows((2 * b + h) * c, c));
}
void from_chunk_major(Backend& be, const Tensor& local, const Tensor& cm, const RingShape& s) {
  const int64_t rows = 2 * s.B * s.chunk, c = s.chunk;
  const Tensor L(local.data, local.dtype, {rows, local.numel() / rows});
  const Tensor C(cm.data, cm.dtype, {rows, cm.numel() / rows});
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < 2; ++h)
      be.copy(L.rows((2 * b + h) * c, c), C.rows((h * s.B + b) * c, c));
}

// The document starts (RingShape::doc_start) chunk-major, (2, B, c) int32 on
// the backend: each query half's rows contiguous, as a block takes them.
struct DocStarts {
  std::unique_ptr<Scratch> cm;
  DocStarts(Backend& be, const RingShape& s);
  const int32_t* half(int h) const {
    return cm ? part(cm->t, 2, h).ptr<int32_t>() : nullptr;
  }
};

AttentionBlock block_of(const RingShape& s, const RingBlock& rb, const DocStarts& docs) {
  AttentionBlock b{s.B, s.chunk, s.chunk, s.n_heads, s.n_kv_heads, s.head_dim, rb.mask};
  b.q_doc_start = docs.half(rb.q_half);
  b.k_pos = int64_t(rb.k_chunk) * s.chunk;
  return b;
}

void check_ring(const RingShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& lse, const char* op) {
  ADGT_CHECK(
      s.B > 0 && s.chunk > 0 && s.head_dim > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
      op << ": B=" << s.B << " chunk=" << s.chunk << " n_heads=" << s.n_heads
         << " n_kv_heads=" << s.n_kv_heads << " head_dim=" << s.head_dim
         << ": sizes must be positive and n_kv_heads divide n_heads");
  const int64_t rows = 2 * s.B * s.chunk;
  ADGT_CHECK(q.numel() == rows * s.n_heads * s.head_dim &&
                 k.numel() == rows * s.n_kv_heads * s.head_dim && v.numel() == k.numel() &&
                 k.dtype == q.dtype && v.dtype == q.dtype,
             op << ": q" << q.shape_str() << " k" << k.shape_str() << " v" << v.shape_str()
                << ": expected (B, 2c, H, hd) and (B, 2c, KV, hd) in one dtype with B=" << s.B
                << " c=" << s.chunk);
  ADGT_CHECK(lse.numel() == ring_lse_elems(s) && lse.dtype == stats_dtype(q.dtype),
             op << ": lse" << lse.shape_str() << " " << dtype_name(lse.dtype) << ": expected "
                << ring_lse_elems(s) << " elements (2, B, H, c) in "
                << dtype_name(stats_dtype(q.dtype)));
}

DocStarts::DocStarts(Backend& be, const RingShape& s) {
  if (!s.doc_start) return;
  const int64_t n = 2 * s.B * s.chunk;
  cm = std::make_unique<Scratch>(be, DType::I32, n);
  to_chunk_major(be, cm->t, Tensor(const_cast<int32_t*>(s.doc_start), DType::I32, {n}), s);
}

}  // namespace

int64_t ring_lse_elems(const RingShape& s) { return 2 * s.B * s.n_heads * s.chunk; }

void ring_attention_forward(Backend& be, Comm& cp, Tensor out, Tensor lse, const Tensor& q,
                            const Tensor& k, const Tensor& v, const RingShape& s) {
  const char* op = "ring_attention_forward";
  check_ring(s, q, k, v, lse, op);
  ADGT_CHECK(out.numel() == q.numel() && out.dtype == q.dtype,
             op << ": out" << out.shape_str() << " must be like q" << q.shape_str());
  const int P = cp.size(), r = cp.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const DType a = q.dtype;
  Scratch qc(be, a, q.numel()), oc(be, a, q.numel()), kv0(be, a, 2 * k.numel()),
      kv1(be, a, 2 * k.numel()), ob(be, a, q.numel() / 2), lb(be, lse.dtype, lse.numel() / 2);
  to_chunk_major(be, qc.t, q, s);
  to_chunk_major(be, part(kv0.t, 2, 0), k, s);
  to_chunk_major(be, part(kv0.t, 2, 1), v, s);
  const DocStarts docs(be, s);
  const Tensor lb3(lb.t.data, lb.t.dtype, {s.B, s.n_heads, s.chunk});
  Tensor cur = kv0.t, nxt = kv1.t;
  bool seen[2] = {false, false};
  for (int step = 0; step < P; ++step) {
    const bool pass_on = step < P - 1;
    if (pass_on) cp.isend(cur, next, kTagKv);
    for (const RingBlock& rb : ring_step_blocks(r, P, step)) {
      const AttentionBlock b = block_of(s, rb, docs);
      const Tensor qh = part(qc.t, 2, rb.q_half), oh = part(oc.t, 2, rb.q_half);
      const Tensor kh = part(cur, 4, rb.k_half), vh = part(cur, 4, 2 + rb.k_half);
      const Tensor lh = lse_half(lse, rb.q_half, s);
      if (!seen[rb.q_half]) {
        be.attention_block_forward(oh, lh, qh, kh, vh, b);
        seen[rb.q_half] = true;
      } else {
        be.attention_block_forward(ob.t, lb3, qh, kh, vh, b);
        be.attention_merge(oh, lh, ob.t, lb3);
      }
    }
    if (pass_on) {
      cp.recv(nxt, prev, kTagKv);
      cp.wait_sends();
      std::swap(cur, nxt);
    }
  }
  from_chunk_major(be, out, oc.t, s);
}

void ring_attention_backward(Backend& be, Comm& cp, Tensor dq, Tensor dk, Tensor dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const RingShape& s) {
  const char* op = "ring_attention_backward";
  check_ring(s, q, k, v, lse, op);
  ADGT_CHECK(out.numel() == q.numel() && dout.numel() == q.numel() && dq.numel() == q.numel() &&
                 dk.numel() == k.numel() && dv.numel() == k.numel() && out.dtype == q.dtype &&
                 dout.dtype == q.dtype && dq.dtype == q.dtype && dk.dtype == q.dtype &&
                 dv.dtype == q.dtype,
             op << ": out" << out.shape_str() << " dout" << dout.shape_str() << " dq"
                << dq.shape_str() << " dk" << dk.shape_str() << " dv" << dv.shape_str()
                << ": out, dout and dq must be like q" << q.shape_str() << ", dk and dv like k"
                << k.shape_str());
  const int P = cp.size(), r = cp.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const DType a = q.dtype;
  const int64_t nq = q.numel(), nkv = 2 * k.numel();
  Scratch qc(be, a, nq), oc(be, a, nq), gc(be, a, nq), dqc(be, a, nq), kv0(be, a, nkv),
      kv1(be, a, nkv), dkv0(be, a, nkv), dkv1(be, a, nkv), gk(be, a, nkv / 4), gv(be, a, nkv / 4);
  to_chunk_major(be, qc.t, q, s);
  to_chunk_major(be, oc.t, out, s);
  to_chunk_major(be, gc.t, dout, s);
  to_chunk_major(be, part(kv0.t, 2, 0), k, s);
  to_chunk_major(be, part(kv0.t, 2, 1), v, s);
  be.zero(dkv0.t);
  const DocStarts docs(be, s);
  Tensor cur = kv0.t, nxt = kv1.t, dcur = dkv0.t, dnxt = dkv1.t;
  bool seen[2] = {false, false};
  for (int step = 0; step < P; ++step) {
    const bool pass_on = step < P - 1;
    if (pass_on) cp.isend(cur, next, kTagKv);
    for (const RingBlock& rb : ring_step_blocks(r, P, step)) {
      const int qh = rb.q_half, kh = rb.k_half;
      be.attention_block_backward(part(dqc.t, 2, qh), gk.t, gv.t, part(gc.t, 2, qh),
                                  part(qc.t, 2, qh), part(cur, 4, kh), part(cur, 4, 2 + kh),
                                  part(oc.t, 2, qh), lse_half(lse, qh, s), block_of(s, rb, docs),
                                  seen[qh]);
      seen[qh] = true;
      be.add_inplace(part(dcur, 4, kh), gk.t);
      be.add_inplace(part(dcur, 4, 2 + kh), gv.t);
    }
    if (P > 1) {  // the accumulator moves on; at the last step, home to its owner
      cp.isend(dcur, next, kTagDkv);
      if (pass_on) cp.recv(nxt, prev, kTagKv);
      cp.recv(dnxt, prev, kTagDkv);
      cp.wait_sends();
      std::swap(cur, nxt);
      std::swap(dcur, dnxt);
    }
  }
  from_chunk_major(be, dq, dqc.t, s);
  from_chunk_major(be, dk, part(dcur, 2, 0), s);
  from_chunk_major(be, dv, part(dcur, 2, 1), s);
}

}  // namespace adgt::cp
