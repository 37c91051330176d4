// The Model's attention under context parallelism with parallel.cp_mode
// all-to-all (DeepSpeed-Ulysses; docs/context-parallel.md): a rank holds its
// two chunks of every sequence (chunks.hpp) with every head; around the
// attention an all-to-all over the cp group trades them for the whole
// sequence with heads/cp of the heads (q's and, grouped-query, the KV heads'
// share), the backend's own causal attention runs on that, and a second
// all-to-all brings each rank its tokens' outputs back. The backward
// gathers q, k, v, out and dout the same way (the forward keeps only the
// backend's saved tensor) and sends dq, dk, dv back. Packed documents
// (train.document_mask): the whole sequences' document starts are gathered
// beside them, and the backend's document-masked attention runs on them.
//
// Every move of rows is a gather by index on the backend (embedding_forward
// with a permutation as the tokens), so device memory stays on the device;
// the all-to-alls go through the cp group's Comm (staged through host memory
// or NCCL by DeviceComm). Needs heads / cp and KV heads / cp whole
// (layout_errors checks it).
#pragma once
#include <cstdint>
#include <vector>

#include "core/comm.hpp"
#include "core/model/context_attention.hpp"

namespace adgt::cp {

class UlyssesContextAttention final : public ContextAttention {
 public:
  UlyssesContextAttention(Backend& be, Comm& cp) : be_(be), cp_(cp) {}
  int64_t saved_elems(const AttentionShape& local) const override;
  void forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionShape& local) override;
  void backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor& out, const Tensor& saved,
                const AttentionShape& local) override;
  std::vector<int64_t> positions(int64_t local_T) const override;
  std::vector<int32_t> document_starts(const int32_t* inputs, int64_t B, int64_t local_T,
                                       int32_t eos) override;

 private:
  // The head-sharded whole-sequence shape of a local one.
  AttentionShape sharded(const AttentionShape& local) const;
  // Document masking: the whole sequences' document starts (B, T int32 on
  // the backend, in scratch) from the local shape's, gathered over the
  // group (nullptr without a mask). Rebuilt by each forward and backward.
  const int32_t* whole_doc_starts(const AttentionShape& local);
  // Index tensors (int32, on the backend) for a local shape and head count.
  struct Maps {
    int64_t B = -1, T = -1;
    Buffer to_heads, from_heads;  // gathers: local rows -> send blocks; receive blocks -> sequence
    Buffer to_tokens, from_tokens;  // and back: sequence -> send blocks; receive blocks -> local
  };
  const Maps& maps(const AttentionShape& local);
  // to_heads: src local (B*T_local, n_heads*hd) -> dst (B*T, n_heads/P*hd)
  // over the group; else the way back.
  void move(Tensor dst, const Tensor& src, int64_t n_heads, const AttentionShape& local,
            bool to_heads);
  Tensor scratch(size_t i, DType dt, int64_t n);  // backend memory kept between calls

  Backend& be_;
  Comm& cp_;
  Maps maps_;
  std::vector<Buffer> scratch_;
};

}  // namespace adgt::cp
