// The Model's attention under context parallelism with parallel.cp_mode ring
// (core/model/context_attention.hpp, docs/context-parallel.md): each layer's
// attention is ring_attention_forward / _backward over the cp group, the
// saved tensor the merged log-sum-exp, and a rank's local tokens are its
// two chunks of every sequence (chunks.hpp), whose rotary positions are
// where those chunks sit in the sequence.
#pragma once
#include <cstdint>
#include <vector>

#include "core/comm.hpp"
#include "core/model/context_attention.hpp"

namespace adgt::cp {

class RingContextAttention final : public ContextAttention {
 public:
  RingContextAttention(Backend& be, Comm& cp) : be_(be), cp_(cp) {}
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
  Backend& be_;
  Comm& cp_;
};

}  // namespace adgt::cp
