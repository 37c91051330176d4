#include "core/param_table.hpp"

namespace adgt {

std::vector<ParamSpec> build_param_table(const ModelConfig& m) {
  std::vector<ParamSpec> t;
  int64_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool matrix, bool emb = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t s : p.shape) p.numel *= s;
    p.offset = off;
    p.is_matrix = matrix;
    p.is_embedding = emb;
    off += (p.numel + 15) / 16 * 16;
    t.push_back(std::move(p));
  };
  const int64_t C = m.d_model, hd = m.head_dim(), F = m.ffn_hidden, V = m.vocab_size;
  add("model.embed_tokens.weight", {V, C}, false, true);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, false);
    add(p + "self_attn.q_proj.weight", {m.n_heads * hd, C}, true);
    add(p + "self_attn.k_proj.weight", {m.n_kv_heads * hd, C}, true);
    add(p + "self_attn.v_proj.weight", {m.n_kv_heads * hd, C}, true);
    add(p + "self_attn.o_proj.weight", {C, m.n_heads * hd}, true);
    add(p + "post_attention_layernorm.weight", {C}, false);
    add(p + "mlp.gate_proj.weight", {F, C}, true);
    add(p + "mlp.up_proj.weight", {F, C}, true);
    add(p + "mlp.down_proj.weight", {C, F}, true);
  }
  add("model.norm.weight", {C}, false);
  if (!m.tie_embeddings) add("lm_head.weight", {V, C}, true);
  return t;
}

int64_t total_numel(const std::vector<ParamSpec>& table) {
  if (table.empty()) return 0;
  const ParamSpec& b = table.back();
  return b.offset + (b.numel + 15) / 16 * 16;
}

int64_t param_count(const std::vector<ParamSpec>& table) {
  int64_t n = 0;
  for (const auto& p : table) n += p.numel;
  return n;
}

bool decays(const ParamSpec& p, const TrainConfig& t) {
  if (t.decay_norms_and_embeddings) return true;
  return p.is_matrix;
}

}  // namespace adgt
