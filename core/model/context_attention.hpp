// Attention over a sequence split across ranks (context parallelism,
// docs/context-parallel.md). A Model given one holds only this rank's tokens
// of each sequence (its local T) and hands the attention of every layer to it
// in place of the backend's whole-sequence attention_forward/backward; the
// rotary positions of its tokens come from it too. parallel/cp implements it
// over the cp group (RingAttention: ring_attention.hpp).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"

namespace adgt {

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // Elements of the tensor the forward saves for the backward (in the
  // model's statistics dtype: f32 for f32 and bf16, f64 for f64), for the
  // local shape (T = the rank's tokens of a sequence).
  virtual int64_t saved_elems(const AttentionShape& local) const = 0;
  // out (B, T, H, hd) and saved overwritten, from q (B, T, H, hd) and k, v
  // (B, T, KV, hd), all local; collective over the group.
  virtual void forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionShape& local) = 0;
  // dq, dk, dv overwritten; out and saved are the forward's. Collective.
  virtual void backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& saved,
                        const AttentionShape& local) = 0;
  // The global position of each of the rank's `local_T` tokens of a sequence.
  virtual std::vector<int64_t> positions(int64_t local_T) const = 0;
  // Packed documents (train.document_mask, model.rope_reset_per_document):
  // for each local token (`inputs`: B x local_T, the rank's token ids) the
  // global position where its document begins (after an `eos`, or the
  // sequence's start). Collective over the group. AttentionShape::doc_start
  // of the local shape then holds these global positions.
  virtual std::vector<int32_t> document_starts(const int32_t* inputs, int64_t B, int64_t local_T,
                                               int32_t eos) = 0;
};

}  // namespace adgt
