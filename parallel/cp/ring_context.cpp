#include "parallel/cp/ring_context.hpp"

#include "kernels/check.hpp"
#include "parallel/cp/chunks.hpp"
#include "parallel/cp/ring_attention.hpp"

namespace adgt::cp {
namespace {

// The ring's shape of a local attention shape: T local = 2 chunks.
RingShape ring_shape(const AttentionShape& l) {
  ADGT_CHECK(l.T % 2 == 0, "context parallelism: a rank's " << l.T << " tokens are not two chunks");
  return RingShape{l.B, l.T / 2, l.n_heads, l.n_kv_heads, l.head_dim, l.doc_start};
}

}  // namespace

int64_t RingContextAttention::saved_elems(const AttentionShape& local) const {
  return ring_lse_elems(ring_shape(local));
}

void RingContextAttention::forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const AttentionShape& local) {
  ring_attention_forward(be_, cp_, out, saved, q, k, v, ring_shape(local));
}

void RingContextAttention::backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& saved,
                                    const AttentionShape& local) {
  ring_attention_backward(be_, cp_, dq, dk, dv, dout, q, k, v, out, saved, ring_shape(local));
}

std::vector<int64_t> RingContextAttention::positions(int64_t local_T) const {
  return chunk_positions(cp_.rank(), cp_.size(), local_T);
}

std::vector<int32_t> RingContextAttention::document_starts(const int32_t* inputs, int64_t B,
                                                           int64_t local_T, int32_t eos) {
  return cp::document_starts(cp_, inputs, B, local_T, eos);
}

}  // namespace adgt::cp
