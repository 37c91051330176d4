// adgt model config <-> HuggingFace config.json, and adgt tensor names <->
// HuggingFace tensor names, chosen by architecture.
//
// A dense model is LlamaForCausalLM, a mixture-of-experts model (n_experts >
// 0) MixtralForCausalLM. Both name mappings are the identity: the parameter
// table already uses the HF names (model.layers.<l>.block_sparse_moe.gate and
// .experts.<e>.w1/w2/w3 for Mixtral). The export and import code only goes
// through these functions.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

// Every export/import failure; the message names the file (and tensor or key).
struct HfError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class HfArch { Llama, Mixtral };

// The HF architecture an adgt model corresponds to: Mixtral when it has experts.
HfArch hf_arch(const ModelConfig& m);
const char* hf_architecture_name(HfArch a);  // "LlamaForCausalLM", "MixtralForCausalLM"
const char* hf_model_type(HfArch a);         // "llama", "mixtral"

// Throws HfError, naming the setting, when hf_arch(m) cannot represent the
// model: MoE layers mixed with dense ones (model.moe_every != 1), or the
// selection bias of auxiliary-loss-free balancing (model.moe_aux_free).
// Returns notes on what the export drops (e.g. moe_capacity_factor: HF
// Mixtral is dropless).
std::vector<std::string> hf_export_check(const ModelConfig& m);

// adgt parameter-table name <-> HF tensor name (identity for LLaMA).
std::string hf_tensor_name(HfArch a, const std::string& adgt_name);
std::string adgt_tensor_name(HfArch a, const std::string& hf_name);

// What config.json needs beyond the model shape.
struct HfConfigExtras {
  std::string torch_dtype = "float32";  // "float32" | "bfloat16"
  int64_t bos_token_id = -1;            // < 0: unknown, key omitted
  int64_t eos_token_id = -1;
};

// config.json as transformers' LlamaForCausalLM or MixtralForCausalLM loads it
// (keys in a fixed order). Mixtral: intermediate_size is the expert FFN size
// (ModelConfig::expert_ffn()), plus num_local_experts, num_experts_per_tok,
// router_aux_loss_coef, output_router_logits false, router_jitter_noise 0,
// sliding_window null. Throws what hf_export_check throws.
nlohmann::ordered_json hf_config_json(const ModelConfig& m, const HfConfigExtras& extra);

// The model section from a config.json (`where` names the file in errors).
// Refuses what adgt's model cannot represent, naming the key: another
// model_type, biases, rope_scaling, a hidden_act other than silu, a head_dim
// other than hidden_size / num_attention_heads, a Mixtral sliding_window
// shorter than max_position_embeddings. init_std comes from initializer_range
// when present (else `base.init_std`); every other field from config.json
// (LlamaConfig's / MixtralConfig's defaults for optional keys). Mixtral sets
// n_experts, moe_top_k, moe_every 1, expert_ffn_hidden = ffn_hidden =
// intermediate_size and moe_aux_loss_coef; the other moe_* training settings
// (moe_aux_free, moe_capacity_factor, ...) stay `base`'s. Llama sets
// n_experts 0. `notes` (optional) receives what was ignored (e.g.
// router_jitter_noise).
ModelConfig model_from_hf_config(const nlohmann::json& cfg, const std::string& where,
                                 const ModelConfig& base, HfArch* arch = nullptr,
                                 std::vector<std::string>* notes = nullptr);

}  // namespace adgt
