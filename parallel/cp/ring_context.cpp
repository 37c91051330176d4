#include "parallel/cp/ring_context.hpp"

#include "kernels/check.hpp"
#include "parallel/cp/chunks.hpp"
#include "parallel/cp/ring_attention.hpp"

namespace adgt::cp {
namespace {

// The ring's shape of a local attention shape: T local = 2 chunks.
RingShape ring_shape(const AttentionShape& l) {
  ADGT_CHECK(l.T % 2 == 0, "context parallelism: a rank's " << l.T << " tokens are not two chunks");
  ADGT_CHECK(l.doc_start == nullptr,
             "context parallelism: document masking inside the ring is not implemented");
  return RingShape{l.B, l.T / 2, l.n_heads, l.n_kv_heads, l.head_dim};
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

}  // namespace adgt::cp
