// The LLaMA decoder (LlamaForCausalLM semantics) written against the Backend
// interface: hand-written forward and backward, no autograd. Model math knows
// nothing about ranks; shapes come from the ModelConfig and the micro-batch.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/param_table.hpp"
#include "kernels/backend.hpp"

namespace adgt {

class Model {
 public:
  // B sequences of T tokens per micro-batch; dtype F32 (or F64 for reference checks).
  Model(const ModelConfig& cfg, Backend& be, DType dtype, int64_t B, int64_t T);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  DType dtype() const { return dtype_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  Tensor params() const { return flat(params_); }  // (P) flat, table offsets
  Tensor grads() const { return flat(grads_); }    // (P)
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;

  // N(0, init_std) for matrices and embeddings, ones for norms. Each tensor
  // draws from its own stream keyed by (seed, global name), so a shard of it
  // can be reproduced without the rest. f32 and f64 models get the same values.
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
  void backward();
  // If on, forward() keeps a host copy of the logits (N, V) before the loss.
  void set_capture_logits(bool on) { capture_logits_ = on; }
  const std::vector<double>& captured_logits() const { return logits_host_; }

 private:
  struct LayerActs {  // saved for the backward; N = B*T
    Tensor x_in;    // (N, C) residual stream entering the layer
    Tensor ln1;     // (N, C)
    Tensor rstd1;   // (N)
    Tensor q;       // (N, H*hd) after rotary
    Tensor k, v;    // (N, KV*hd), k after rotary
    Tensor att_saved;  // backend-defined (CPU: probabilities (B, H, T, T))
    Tensor att;     // (N, H*hd) attention output before o_proj
    Tensor x_mid;   // (N, C) residual after attention
    Tensor ln2;     // (N, C)
    Tensor rstd2;   // (N)
    Tensor gate, up, h;  // (N, F)
  };
  struct LayerIdx { size_t in_norm, q, k, v, o, post_norm, gate, up, down; };

  Tensor flat(const Buffer& b) const;
  Tensor act(int64_t rows, int64_t cols, DType dt);  // a new buffer owned by the model
  void build_rope_tables();

  ModelConfig cfg_;
  Backend& be_;
  DType dtype_;
  int64_t B_, T_, N_;
  AttentionShape att_shape_;
  std::vector<ParamSpec> table_;
  std::vector<LayerIdx> layer_idx_;
  size_t emb_idx_ = 0, norm_idx_ = 0, head_idx_ = 0;
  Buffer params_, grads_;
  std::vector<Buffer> owned_;  // activations and scratch
  std::vector<LayerActs> acts_;
  Tensor x_final_, lnf_, rstdf_, logits_, losses_;
  Tensor d_resid_, d_tmp_, dq_, dk_, dv_, d_att_, dgate_, dup_, dh_;
  Tensor rope_cos_, rope_sin_;  // (T, hd/2)
  Tensor in_tok_, tgt_tok_;     // (N) int32
  bool capture_logits_ = false;
  std::vector<double> logits_host_;
};

}  // namespace adgt
