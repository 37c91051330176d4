// The LLaMA decoder (LlamaForCausalLM semantics) written against the Backend
// interface: hand-written forward and backward, no autograd. Model math knows
// nothing about ranks: shapes come from this rank's parameter shards, and the
// few collectives tensor parallelism needs go through the Comm it is given
// (a SelfComm for one process).
//
// Tensor parallelism (Megatron): column-parallel q/k/v and gate/up, row-parallel
// o and down (their partial outputs all-reduced), vocab-parallel embedding and
// cross-entropy (logits stay split by vocabulary). With sequence parallelism the
// residual stream and norms hold N/tp token rows: all-gather before the
// column-parallel layers, reduce-scatter after the row-parallel ones.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/param_table.hpp"
#include "kernels/backend.hpp"

namespace adgt {

struct TensorParallel {
  Comm* comm = nullptr;            // the tp group; nullptr = a single rank
  bool sequence_parallel = false;  // ignored when the group has one rank
  int64_t flat_multiple = 16;      // flat buffers are padded to a multiple of this (ZeRO chunks)
};

class Model {
 public:
  // B sequences of T tokens per micro-batch; dtype F32 (or F64 for reference checks).
  Model(const ModelConfig& cfg, Backend& be, DType dtype, int64_t B, int64_t T,
        TensorParallel tp = {});

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  DType dtype() const { return dtype_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int64_t flat_size() const { return flat_n_; }     // flat buffer length (padded)
  Tensor params() const { return flat(params_); }  // (flat_size)
  Tensor grads() const { return flat(grads_); }    // (flat_size)
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;

  // N(0, init_std) for matrices and embeddings, ones for norms. Each global
  // tensor draws from its own stream keyed by (seed, global name) and this rank
  // takes its shard, so every layout starts from the same weights; f32 and f64
  // models get the same values.
  void init_weights(uint64_t seed);
  // Host copies of the flat buffers as fp32 / from fp32 (checkpoints).
  std::vector<float> params_to_host() const;
  void params_from_host(const std::vector<float>& flat);
  std::vector<double> grads_to_host_f64() const;
  void zero_grads();

  // inputs, targets: host (B, T) int32; a target < 0 is ignored. Returns the
  // mean loss over the valid targets and leaves, for backward(), the gradient
  // of grad_scale * mean loss w.r.t. the logits.
  double forward(const int32_t* inputs, const int32_t* targets, double grad_scale);
  // Accumulates parameter gradients (+=) of the last forward's scaled loss.
  // last_micro_batch: the step's final backward, after which the gradients are
  // complete (with SP, the norm weights' partial sums over token rows are then
  // all-reduced over tp, once). on_ready(begin, end) is then called with flat
  // ranges whose gradients are final, in the order they complete (buckets).
  void backward(const std::function<void(int64_t, int64_t)>& on_ready = {},
                bool last_micro_batch = true);
  // If on, forward() keeps a host copy of this rank's logits (N, Vl) before the loss.
  void set_capture_logits(bool on) { capture_logits_ = on; }
  const std::vector<double>& captured_logits() const { return logits_host_; }

 private:
  struct LayerActs {  // saved for the backward; N = B*T token rows, Nl = N/tp with SP
    Tensor x_in;    // (Nl, C) residual stream entering the layer
    Tensor ln1;     // (N, C) normed input of the column-parallel q/k/v (gathered with SP)
    Tensor rstd1;   // (Nl)
    Tensor q;       // (N, Hl*hd) after rotary
    Tensor k, v;    // (N, KVl*hd), k after rotary
    Tensor att_saved;  // backend-defined (CPU: probabilities (B, Hl, T, T))
    Tensor att;     // (N, Hl*hd) attention output before o_proj
    Tensor x_mid;   // (Nl, C) residual after attention
    Tensor ln2;     // (N, C)
    Tensor rstd2;   // (Nl)
    Tensor gate, up, h;  // (N, Fl)
  };
  struct LayerIdx { size_t in_norm, q, k, v, o, post_norm, gate, up, down; };

  Tensor flat(const Buffer& b) const;
  Tensor act(int64_t rows, int64_t cols, DType dt);  // a new buffer owned by the model
  void build_rope_tables();
  // Sequence-parallel boundaries (identities / all-reduce without SP).
  void gather_rows(Tensor full, const Tensor& local);   // (Nl,C) -> (N,C)
  void reduce_rows(Tensor local, Tensor partial);       // (N,C) partial sums -> (Nl,C)
  void norm_forward(Tensor full_out, Tensor rstd, const Tensor& x, size_t w);
  void loss_forward(const Tensor& targets_dev, double scale);
  std::pair<int64_t, int64_t> range(size_t first, size_t last) const;

  ModelConfig cfg_;
  Backend& be_;
  DType dtype_;
  int64_t B_, T_, N_, Nl_;
  Comm* tp_;
  SelfComm self_;
  bool sp_;
  int64_t vocab_start_, vocab_valid_, flat_n_;
  AttentionShape att_shape_;
  std::vector<ParamSpec> table_;
  std::vector<LayerIdx> layer_idx_;
  size_t emb_idx_ = 0, norm_idx_ = 0, head_idx_ = 0;
  Buffer params_, grads_;
  std::vector<Buffer> owned_;  // activations and scratch
  std::vector<LayerActs> acts_;
  Tensor x_final_, lnf_, rstdf_, logits_, losses_;
  Tensor ln_local_;             // (Nl, C) norm output before the gather (SP only)
  Tensor partial_;              // (N, C) row-parallel partial sums (SP only)
  Tensor d_resid_, d_full_, d_tmp_, d_tmp_local_;
  Tensor dq_, dk_, dv_, d_att_, dgate_, dup_, dh_;
  Tensor ce_stats_, ce_gathered_, ce_combined_;
  Tensor rope_cos_, rope_sin_;  // (T, hd/2)
  Tensor in_tok_, tgt_tok_;     // (N) int32
  bool capture_logits_ = false;
  std::vector<double> logits_host_;
};

}  // namespace adgt
