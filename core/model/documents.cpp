// Packed documents (train.document_mask, model.rope_reset_per_document): the
// boundaries come from the micro-batch's token ids (a document starts after
// each EOS token, and at every sequence's first token), as Megatron-LM's
// reset_attention_mask / reset_position_ids derive them from its EOD token.
// Each slot keeps its micro-batch's boundaries until its backward is done.
#include <vector>

#include "core/model/document_starts.hpp"
#include "core/model/model.hpp"
#include "kernels/check.hpp"

namespace adgt {

void Model::set_documents(int32_t eos, bool mask, bool rope_reset) {
  ADGT_CHECK(!(mask || rope_reset) || (eos >= 0 && eos < cfg_.vocab_size),
             "Model: document masking / per-document positions need an end-of-document token id "
             "in [0, " << cfg_.vocab_size << "), got " << eos << " (data.eos_id)");
  docs_.eos = eos;
  docs_.mask = mask;
  docs_.rope_reset = rope_reset;
  if (context_ && rope_reset) build_rope_tables();  // rows by position in a document
}

void Model::load_documents(Slot& s, const int32_t* inputs) {
  ADGT_CHECK(inputs, "Model: with document masking or per-document positions every chunk's "
                     "forward needs the micro-batch's token ids");
  const int64_t N = N_, T = T_;
  if (!s.doc_start.data) {
    s.doc_start = act(N, 1, DType::I32);
    if (docs_.rope_reset) {
      const int64_t half = cfg_.head_dim() / 2;
      s.doc_pos = act(N, 1, DType::I32);
      s.rope_cos = act(N, half, rope_cos_.dtype);
      s.rope_sin = act(N, half, rope_sin_.dtype);
    }
  }
  std::vector<int32_t> start(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
  if (context_) {
    // Context parallelism: T is this rank's two chunks of each sequence; a
    // token's document may begin in another rank's chunk, and its start and
    // position are in the whole sequence (the ring's blocks mask by them).
    start = context_->document_starts(inputs, N / T, T, docs_.eos);
    const std::vector<int64_t> at = context_->positions(T);
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(at[size_t(i % T)]) - start[size_t(i)];
  } else {
    sequence_document_starts(inputs, N / T, T, docs_.eos, start.data());
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % T) - start[size_t(i)];
  }
  be_.to_device(s.doc_start.data, start.data(), size_t(N) * 4);
  if (docs_.rope_reset) {
    be_.to_device(s.doc_pos.data, pos.data(), size_t(N) * 4);
    be_.embedding_forward(s.rope_cos, rope_cos_, s.doc_pos, 0);
    be_.embedding_forward(s.rope_sin, rope_sin_, s.doc_pos, 0);
  }
}

Model::Rope Model::rope_of(const Slot& s) const {
  if (docs_.rope_reset) return {s.rope_cos, s.rope_sin, N_};  // one row per token
  return {rope_cos_, rope_sin_, T_};
}

AttentionShape Model::attention_of(const Slot& s) const {
  AttentionShape a = att_shape_;
  if (docs_.mask) a.doc_start = s.doc_start.ptr<int32_t>();
  return a;
}

void Model::attention_forward(LayerActs& a, const Slot& s) {
  if (context_)
    context_->forward(a.att, a.att_saved, a.q, a.k, a.v, attention_of(s));
  else
    be_.attention_forward(a.att, a.att_saved, a.q, a.k, a.v, attention_of(s));
}

void Model::attention_backward(const LayerActs& a, const Slot& s) {
  if (context_)
    context_->backward(dq_, dk_, dv_, d_att_, a.q, a.k, a.v, a.att, a.att_saved, attention_of(s));
  else
    be_.attention_backward(dq_, dk_, dv_, d_att_, a.q, a.k, a.v, a.att, a.att_saved, attention_of(s));
}

}  // namespace adgt
