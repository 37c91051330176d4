#include "parallel/cp/ulysses_context.hpp"

#include <array>

#include "kernels/check.hpp"
#include "parallel/cp/chunks.hpp"

namespace adgt::cp {
namespace {

// Rows of a (rows, width) view of t.
Tensor rows_of(const Tensor& t, int64_t rows) {
  return Tensor(t.data, t.dtype, {rows, t.numel() / rows});
}

Buffer int_buffer(Backend& be, const std::vector<int32_t>& v) {
  Buffer b(be, v.size() * 4);
  be.to_device(b.data(), v.data(), v.size() * 4);
  return b;
}

}  // namespace

AttentionShape UlyssesContextAttention::sharded(const AttentionShape& l) const {
  const int P = cp_.size();
  ADGT_CHECK(l.n_heads % P == 0 && l.n_kv_heads % P == 0,
             "context parallelism (all-to-all): " << l.n_heads << " heads and " << l.n_kv_heads
                                                  << " KV heads a rank do not split over cp=" << P);
  return AttentionShape{l.B, l.T * P, l.n_heads / P, l.n_kv_heads / P, l.head_dim};
}

const int32_t* UlyssesContextAttention::whole_doc_starts(const AttentionShape& l) {
  if (!l.doc_start) return nullptr;
  // Every rank's local starts (global positions, chunks.hpp's order), then
  // each rank's two chunks of each sequence copied to where they sit.
  const int P = cp_.size();
  const int64_t N = l.B * l.T, T = l.T * P, c = chunk_tokens(T, P);
  const Tensor all = scratch(10, DType::I32, P * N), whole = scratch(11, DType::I32, l.B * T);
  cp_.all_gather(all, Tensor(const_cast<int32_t*>(l.doc_start), DType::I32, {N}));
  const Tensor from = rows_of(all, P * N), to = rows_of(whole, l.B * T);
  for (int i = 0; i < P; ++i) {
    const std::array<int, 2> ch = rank_chunks(i, P);
    for (int64_t b = 0; b < l.B; ++b)
      for (int h = 0; h < 2; ++h)
        be_.copy(to.rows(b * T + ch[size_t(h)] * c, c), from.rows(i * N + b * l.T + h * c, c));
  }
  return whole.ptr<int32_t>();
}

int64_t UlyssesContextAttention::saved_elems(const AttentionShape& local) const {
  return be_.attention_saved_elems(sharded(local));
}

std::vector<int64_t> UlyssesContextAttention::positions(int64_t local_T) const {
  return chunk_positions(cp_.rank(), cp_.size(), local_T);
}

const UlyssesContextAttention::Maps& UlyssesContextAttention::maps(const AttentionShape& l) {
  if (maps_.B == l.B && maps_.T == l.T) return maps_;
  const int P = cp_.size();
  const int64_t B = l.B, Tl = l.T, c = chunk_tokens(Tl * P, P), T = Tl * P, N = B * Tl;
  // A token's rows are P pieces of its heads (piece j: head group j); the
  // send blocks are per destination rank: block j holds every local token's
  // piece j. Rank i's local token (b, l) sits at g(i, l) in the sequence.
  auto global = [&](int i, int64_t l) {
    const std::array<int, 2> ch = rank_chunks(i, P);
    return ch[size_t(l / c)] * c + l % c;
  };
  std::vector<int32_t> to_heads(size_t(P * N)), from_tokens(size_t(P * N));
  for (int j = 0; j < P; ++j)
    for (int64_t t = 0; t < N; ++t) {
      to_heads[size_t(j * N + t)] = int32_t(t * P + j);
      from_tokens[size_t(t * P + j)] = int32_t(j * N + t);
    }
  std::vector<int32_t> from_heads(size_t(B * T)), to_tokens(size_t(P * N));
  for (int i = 0; i < P; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l2 = 0; l2 < Tl; ++l2) {
        const int64_t g = global(i, l2), recv_row = i * N + b * Tl + l2;
        from_heads[size_t(b * T + g)] = int32_t(recv_row);
        to_tokens[size_t(recv_row)] = int32_t(b * T + g);
      }
  ADGT_CHECK(P * N < (int64_t(1) << 31), "context parallelism (all-to-all): too many rows");
  maps_.B = B, maps_.T = Tl;
  maps_.to_heads = int_buffer(be_, to_heads);
  maps_.from_heads = int_buffer(be_, from_heads);
  maps_.to_tokens = int_buffer(be_, to_tokens);
  maps_.from_tokens = int_buffer(be_, from_tokens);
  return maps_;
}

Tensor UlyssesContextAttention::scratch(size_t i, DType dt, int64_t n) {
  if (scratch_.size() <= i) scratch_.resize(i + 1);
  const size_t bytes = size_t(n) * dtype_size(dt);
  if (scratch_[i].bytes() < bytes) scratch_[i] = Buffer(be_, bytes);
  return Tensor(scratch_[i].data(), dt, {n});
}

void UlyssesContextAttention::move(Tensor dst, const Tensor& src, int64_t n_heads,
                                   const AttentionShape& l, bool to_heads) {
  const int P = cp_.size();
  const Maps& m = maps(l);
  // Both ways B*T rows of (heads/P) x hd: gathered into the send blocks, sent
  // to their ranks, gathered from the receive blocks into place.
  const int64_t rows = P * l.B * l.T, w = n_heads / P * l.head_dim;
  const Tensor send = scratch(0, src.dtype, rows * w), recv = scratch(1, src.dtype, rows * w);
  const Buffer& before = to_heads ? m.to_heads : m.to_tokens;
  const Buffer& after = to_heads ? m.from_heads : m.from_tokens;
  be_.embedding_forward(rows_of(send, rows), rows_of(src, rows), Tensor(before.data(), DType::I32, {rows}));
  cp_.all_to_all(recv, send);
  be_.embedding_forward(rows_of(dst, rows), rows_of(recv, rows), Tensor(after.data(), DType::I32, {rows}));
}

void UlyssesContextAttention::forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const AttentionShape& local) {
  AttentionShape sh = sharded(local);
  sh.doc_start = whole_doc_starts(local);
  const int64_t rows = sh.B * sh.T, hd = sh.head_dim;
  const DType dt = q.dtype;
  Tensor qh = scratch(2, dt, rows * sh.n_heads * hd), kh = scratch(3, dt, rows * sh.n_kv_heads * hd),
         vh = scratch(4, dt, rows * sh.n_kv_heads * hd), oh = scratch(5, dt, rows * sh.n_heads * hd);
  move(qh, q, local.n_heads, local, true);
  move(kh, k, local.n_kv_heads, local, true);
  move(vh, v, local.n_kv_heads, local, true);
  const auto view = [&](const Tensor& t, int64_t h) { return Tensor(t.data, t.dtype, {sh.B, sh.T, h, hd}); };
  be_.attention_forward(view(oh, sh.n_heads), saved, view(qh, sh.n_heads), view(kh, sh.n_kv_heads),
                        view(vh, sh.n_kv_heads), sh);
  move(out, oh, local.n_heads, local, false);
}

void UlyssesContextAttention::backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                       const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& saved,
                                       const AttentionShape& local) {
  AttentionShape sh = sharded(local);
  sh.doc_start = whole_doc_starts(local);
  const int64_t rows = sh.B * sh.T, hd = sh.head_dim, nq = rows * sh.n_heads * hd,
                nk = rows * sh.n_kv_heads * hd;
  const DType dt = q.dtype;
  Tensor qh = scratch(2, dt, nq), kh = scratch(3, dt, nk), vh = scratch(4, dt, nk), oh = scratch(5, dt, nq);
  Tensor doh = scratch(6, dt, nq), dqh = scratch(7, dt, nq), dkh = scratch(8, dt, nk), dvh = scratch(9, dt, nk);
  // The forward's head-sharded tensors again (the same rows, bit for bit).
  move(qh, q, local.n_heads, local, true);
  move(kh, k, local.n_kv_heads, local, true);
  move(vh, v, local.n_kv_heads, local, true);
  move(oh, out, local.n_heads, local, true);
  move(doh, dout, local.n_heads, local, true);
  const auto view = [&](const Tensor& t, int64_t h) { return Tensor(t.data, t.dtype, {sh.B, sh.T, h, hd}); };
  be_.attention_backward(view(dqh, sh.n_heads), view(dkh, sh.n_kv_heads), view(dvh, sh.n_kv_heads),
                         view(doh, sh.n_heads), view(qh, sh.n_heads), view(kh, sh.n_kv_heads),
                         view(vh, sh.n_kv_heads), view(oh, sh.n_heads), saved, sh);
  move(dq, dqh, local.n_heads, local, false);
  move(dk, dkh, local.n_kv_heads, local, false);
  move(dv, dvh, local.n_kv_heads, local, false);
}

std::vector<int32_t> UlyssesContextAttention::document_starts(const int32_t* inputs, int64_t B,
                                                              int64_t local_T, int32_t eos) {
  return cp::document_starts(cp_, inputs, B, local_T, eos);
}

}  // namespace adgt::cp
