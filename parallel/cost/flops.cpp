// FLOP formulas (parallel/cost/flops.hpp has the conventions). Every factor of
// 2 is one multiply-add; every factor of 3 is forward + backward.
#include "parallel/cost/flops.hpp"

namespace adgt {

PassFlops& PassFlops::operator+=(const PassFlops& o) {
  forward += o.forward;
  backward_input += o.backward_input;
  backward_weight += o.backward_weight;
  return *this;
}

double attention_projection_flops(const ModelConfig& m) {
  const double C = double(m.d_model), q = double(m.n_heads) * double(m.head_dim()),
               kv = double(m.n_kv_heads) * double(m.head_dim());
  return 2 * (2 * C * q + 2 * C * kv);  // q and o: C x H*hd; k and v: C x KV*hd
}

double attention_core_flops(const ModelConfig& m, AttentionCount count) {
  const double T = double(m.seq_len);
  const double keys = count == AttentionCount::Full ? T : T / 2;  // per query
  return 2 * 2 * double(m.head_dim()) * double(m.n_heads) * keys;  // QK^T and PV
}

double dense_ffn_flops(const ModelConfig& m) {
  return 2 * 3 * double(m.d_model) * double(m.ffn_hidden);  // gate, up, down
}

double moe_ffn_flops(const ModelConfig& m) {
  const double C = double(m.d_model);
  return double(m.moe_top_k) * 2 * 3 * C * double(m.expert_ffn()) +  // w1, w3, w2 of k experts
         2 * C * double(m.n_experts);                                 // the router
}

LayerFlops layer_forward_flops(const ModelConfig& m, int64_t layer, AttentionCount count) {
  LayerFlops f;
  f.attention_proj = attention_projection_flops(m);
  f.attention_core = attention_core_flops(m, count);
  f.ffn = m.is_moe_layer(layer) ? moe_ffn_flops(m) : dense_ffn_flops(m);
  return f;
}

double embedding_forward_flops(const ModelConfig& m) { return double(m.d_model); }

double head_forward_flops(const ModelConfig& m) {
  return 2 * double(m.d_model) * double(m.vocab_size);
}

PassFlops training_pass(double forward) { return {forward, forward, forward}; }

double gemm_flops(double m, double n, double k) { return 2.0 * m * n * k; }

double attention_core_executed_flops(double b, double t, double h, double hd, bool backward) {
  const double forward_factor = 2.0 * 2.0;  // 2 GEMMs x 2 FLOPs per multiply-add
  return backward ? kAttentionBackwardExecuted * forward_factor * b * t * (t / 2) * h * hd
                  : forward_factor * b * t * (t / 2) * h * hd;
}

double mfu_flops_per_token(const ModelConfig& m) {
  double forward = head_forward_flops(m);
  for (int64_t l = 0; l < m.n_layers; ++l)
    forward += layer_forward_flops(m, l, AttentionCount::Full).total();
  return training_pass(forward).total();
}

}  // namespace adgt
