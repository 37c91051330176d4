// The parameter table: every parameter's global (HuggingFace LlamaForCausalLM)
// name, global shape, offset in the flat parameter buffer, and whether weight
// decay applies. Checkpoints, export and the memory estimator speak in these terms.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

struct ParamSpec {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // global shape, HF layout (out, in) for linears
  int64_t numel = 0;
  int64_t offset = 0;          // elements from the start of the flat buffer
  bool is_matrix = false;      // linear weight (decayed); norms/embeddings are not
  bool is_embedding = false;
};

// In HF order: embed, per layer (input_layernorm, q, k, v, o, post_attention_layernorm,
// gate, up, down), norm, lm_head (absent when tied). Offsets are 16-element aligned.
std::vector<ParamSpec> build_param_table(const ModelConfig& m);
int64_t total_numel(const std::vector<ParamSpec>& table);  // flat buffer length incl. padding
int64_t param_count(const std::vector<ParamSpec>& table);  // sum of numel
// Whether AdamW's weight decay applies to this parameter under `t`.
bool decays(const ParamSpec& p, const TrainConfig& t);

}  // namespace adgt
