#include "core/model/param_table.hpp"

#include <algorithm>

namespace adgt {

int64_t padded_vocab(const ModelConfig& m, int64_t tp) {
  return (m.vocab_size + tp - 1) / tp * tp;
}

std::vector<ParamSpec> build_param_table(const ModelConfig& m, int64_t tp, int64_t r,
                                         const StageSlice* slice,
                                         const std::vector<int64_t>* experts) {
  const StageSlice whole = whole_model(m);
  const StageSlice& sl = slice ? *slice : whole;
  std::vector<ParamSpec> t;
  int64_t off = 0;
  // dim: -1 replicated; 0/1 split that dimension of `global` into tp equal parts
  // (`split_len` of the padded extent per rank; `valid` clipped to the real extent).
  // packed: the next parameter starts right after this one (no padding), so
  // q/k/v and gate/up are each one (rows, C) matrix in the flat buffer.
  auto add = [&](std::string name, std::vector<int64_t> global, int dim, int64_t split_len,
                 bool matrix, bool emb = false, bool packed = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.global_shape = global;
    p.shape = global;
    p.shard_dim = tp > 1 ? dim : -1;
    if (p.shard_dim >= 0) {
      p.shape[size_t(dim)] = split_len;
      p.shard_start = r * split_len;
      p.shard_valid =
          std::clamp<int64_t>(global[size_t(dim)] - p.shard_start, 0, split_len);
    } else {
      p.shard_valid = global.empty() ? 0 : global[0];
    }
    p.numel = 1;
    for (int64_t s : p.shape) p.numel *= s;
    p.offset = off;
    p.is_matrix = matrix;
    p.is_embedding = emb;
    off = packed ? off + p.numel : (off + p.numel + 15) / 16 * 16;
    t.push_back(std::move(p));
  };
  const int64_t C = m.d_model, hd = m.head_dim(), F = m.ffn_hidden, V = m.vocab_size;
  const int64_t Vl = padded_vocab(m, tp) / tp;
  if (sl.embedding) add("model.embed_tokens.weight", {V, C}, 0, Vl, false, true);
  std::vector<int64_t> layers;
  for (const auto& [first, end] : sl.chunks)
    for (int64_t l = first; l < end; ++l) layers.push_back(l);
  for (int64_t l : layers) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, -1, 0, false);
    add(p + "self_attn.q_proj.weight", {m.n_heads * hd, C}, 0, m.n_heads / tp * hd, true,
        false, true);
    add(p + "self_attn.k_proj.weight", {m.n_kv_heads * hd, C}, 0, m.n_kv_heads / tp * hd, true,
        false, true);
    add(p + "self_attn.v_proj.weight", {m.n_kv_heads * hd, C}, 0, m.n_kv_heads / tp * hd, true);
    add(p + "self_attn.o_proj.weight", {C, m.n_heads * hd}, 1, m.n_heads / tp * hd, true);
    add(p + "post_attention_layernorm.weight", {C}, -1, 0, false);
    if (m.is_moe_layer(l)) {
      const std::string b = p + "block_sparse_moe.";
      add(b + "gate.weight", {m.n_experts, C}, -1, 0, true);
      t.back().is_router = true;
      std::vector<int64_t> all;
      for (int64_t e = 0; e < m.n_experts; ++e) all.push_back(e);
      const int64_t Fe = m.expert_ffn();
      for (int64_t e : experts ? *experts : all) {
        const std::string x = b + "experts." + std::to_string(e) + ".";
        // w1 then w3 with no padding (the expert's fused gate/up), then w2.
        add(x + "w1.weight", {Fe, C}, 0, Fe / tp, true, false, true);
        t.back().expert = e;
        add(x + "w3.weight", {Fe, C}, 0, Fe / tp, true);
        t.back().expert = e;
        add(x + "w2.weight", {C, Fe}, 1, Fe / tp, true);
        t.back().expert = e;
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {F, C}, 0, F / tp, true, false, true);
    add(p + "mlp.up_proj.weight", {F, C}, 0, F / tp, true);
    add(p + "mlp.down_proj.weight", {C, F}, 1, F / tp, true);
  }
  if (sl.head) {
    add("model.norm.weight", {C}, -1, 0, false);
    if (!m.tie_embeddings) add("lm_head.weight", {V, C}, 0, Vl, true);
  }
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
