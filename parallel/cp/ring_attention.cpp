#include "parallel/cp/ring_attention.hpp"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

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
// Also, on the host, each query half's earliest document start: a block
// whose every row's document begins after its key chunk's last key has no
// visible key (each row would be out 0, lse -inf, which the merge and the
// dK/dV sums leave as they are) and is skipped.
struct DocStarts {
  std::unique_ptr<Scratch> cm;
  int64_t min_start[2] = {0, 0};
  DocStarts(Backend& be, const RingShape& s);
  const int32_t* half(int h) const {
    return cm ? part(cm->t, 2, h).ptr<int32_t>() : nullptr;
  }
  // Whether some query row of block rb sees a key of it (always without documents;
  // a causal block's rows see themselves).
  bool visible(const RingBlock& rb, int64_t chunk) const {
    return !cm || rb.mask == BlockMask::causal ||
           min_start[rb.q_half] < (int64_t(rb.k_chunk) + 1) * chunk;
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
  std::vector<int32_t> host(static_cast<size_t>(n));
  be.to_host(host.data(), cm->t.data, size_t(n) * 4);
  for (int h = 0; h < 2; ++h)
    min_start[h] = *std::min_element(host.begin() + h * (n / 2), host.begin() + (h + 1) * (n / 2));
}

}  // namespace

int64_t ring_lse_elems(const RingShape& s) { return 2 * s.B * s.n_heads * s.chunk; }

int ring_attention_forward(Backend& be, Comm& cp, Tensor out, Tensor lse, const Tensor& q,
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
  int skipped = 0;
  for (int step = 0; step < P; ++step) {
    const bool pass_on = step < P - 1;
    // The K/V in hand on to r+1, the next from r-1, while the blocks run.
    Work hop;
    if (pass_on) hop = cp.start_exchange({{cur, kTagKv}}, next, {{nxt, kTagKv}}, prev);
    for (const RingBlock& rb : ring_step_blocks(r, P, step)) {
      if (!docs.visible(rb, s.chunk)) {
        ++skipped;
        continue;
      }
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
      hop.wait();
      std::swap(cur, nxt);
    }
  }
  from_chunk_major(be, out, oc.t, s);
  return skipped;
}

int ring_attention_backward(Backend& be, Comm& cp, Tensor dq, Tensor dk, Tensor dv,
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
  // K/V buffers as in the forward; own: the dK/dV of this rank's K/V from
  // its own blocks (and, at the end, every rank's); mine: this step's blocks'
  // dK/dV of the K/V in hand; acc[2]: the travelling accumulators, in turn.
  Scratch qc(be, a, nq), oc(be, a, nq), gc(be, a, nq), dqc(be, a, nq), kv0(be, a, nkv),
      kv1(be, a, nkv), own(be, a, nkv), mine(be, a, nkv), acc0(be, a, nkv), acc1(be, a, nkv),
      gk(be, a, nkv / 4), gv(be, a, nkv / 4);
  to_chunk_major(be, qc.t, q, s);
  to_chunk_major(be, oc.t, out, s);
  to_chunk_major(be, gc.t, dout, s);
  const auto own_kv = [&](const Tensor& buf) {
    to_chunk_major(be, part(buf, 2, 0), k, s);
    to_chunk_major(be, part(buf, 2, 1), v, s);
  };
  own_kv(kv0.t);
  const DocStarts docs(be, s);
  bool seen[2] = {false, false};
  int skipped = 0;
  // The blocks `blocks` against the K/V in `kv`: dq accumulated in place,
  // their dK/dV added into `into`.
  const auto run = [&](const std::vector<RingBlock>& blocks, const Tensor& kv, const Tensor& into) {
    for (const RingBlock& rb : blocks) {
      if (!docs.visible(rb, s.chunk)) {
        ++skipped;
        continue;
      }
      const int qh = rb.q_half, kh = rb.k_half;
      be.attention_block_backward(part(dqc.t, 2, qh), gk.t, gv.t, part(gc.t, 2, qh),
                                  part(qc.t, 2, qh), part(kv, 4, kh), part(kv, 4, 2 + kh),
                                  part(oc.t, 2, qh), lse_half(lse, qh, s), block_of(s, rb, docs),
                                  seen[qh]);
      seen[qh] = true;
      be.add_inplace(part(into, 4, kh), gk.t);
      be.add_inplace(part(into, 4, 2 + kh), gv.t);
    }
  };
  // Step 0's blocks (this rank's own K/V): the full one runs first, while
  // the K/V travel to the next rank; the two causal ones run last, while
  // the accumulator of this rank's K/V comes home.
  std::vector<RingBlock> first, last;
  for (const RingBlock& rb : ring_step_blocks(r, P, 0))
    (rb.mask == BlockMask::causal && P > 1 ? last : first).push_back(rb);
  be.zero(own.t);
  Tensor cur = kv0.t, nxt = kv1.t;
  const Tensor acc[2] = {acc0.t, acc1.t};
  Work hop;
  if (P > 1) hop = cp.start_exchange({{cur, kTagKv}}, next, {{nxt, kTagKv}}, prev);
  run(first, cur, own.t);
  if (P > 1) {
    hop.wait();
    std::swap(cur, nxt);
  }
  for (int step = 1; step < P; ++step) {
    const bool pass_on = step < P - 1;
    // The accumulator of the K/V in hand: this rank starts it at step 1;
    // later it comes from r-1, sent at the end of r-1's previous step (it
    // travels while this step computes, with the K/V in hand on to r+1 and
    // the next from r-1; messages between two ranks in the order sent:
    // r-1's accumulator of its step s-1, then its K/V of step s).
    const Tensor in_hand = acc[step % 2];
    std::vector<Comm::Message> out, in;
    if (pass_on) out.push_back({cur, kTagKv});
    if (step > 1) in.push_back({in_hand, kTagDkv});
    if (pass_on) in.push_back({nxt, kTagKv});
    hop = cp.start_exchange(out, next, in, prev);
    be.zero(mine.t);
    run(ring_step_blocks(r, P, step), cur, mine.t);
    hop.wait();  // this step's K/V, the previous step's accumulator
    if (step > 1)
      be.add_inplace(in_hand, mine.t);
    else
      be.copy(in_hand, mine.t);
    cp.isend(in_hand, next, kTagDkv);  // completed by the next exchange's wait
    if (pass_on) std::swap(cur, nxt);
  }
  if (P > 1) {
    // The K/V in hand are not sent at the last step: that buffer takes this
    // rank's own K/V again for the causal blocks, which run while r-1's
    // accumulator of them (its last step's) comes home.
    const Tensor home = acc[P % 2];
    hop = cp.start_exchange({}, next, {{home, kTagDkv}}, prev);
    own_kv(cur);
    run(last, cur, own.t);
    hop.wait();
    be.add_inplace(own.t, home);
  }
  from_chunk_major(be, dq, dqc.t, s);
  from_chunk_major(be, dk, part(own.t, 2, 0), s);
  from_chunk_major(be, dv, part(own.t, 2, 1), s);
  return skipped;
}

}  // namespace adgt::cp
