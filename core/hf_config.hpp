// adgt model config <-> HuggingFace config.json, and adgt tensor names <->
// HuggingFace tensor names, chosen by architecture.
//
// Only LlamaForCausalLM exists today, where both mappings are the identity
// (the parameter table already uses HF names). A mixture-of-experts model
// (MixtralForCausalLM) adds an HfArch value, its branch in hf_arch(), the name
// rules (adgt's expert tensors -> block_sparse_moe.experts.<e>.w1/w2/w3) and its
// config keys (num_local_experts, num_experts_per_tok, ...); the export and
// import code only goes through these functions.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "core/config.hpp"

namespace adgt {

// Every export/import failure; the message names the file (and tensor or key).
struct HfError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class HfArch { Llama };

// The HF architecture an adgt model exports as.
HfArch hf_arch(const ModelConfig& m);
const char* hf_architecture_name(HfArch a);  // "LlamaForCausalLM"
const char* hf_model_type(HfArch a);         // "llama"

// adgt parameter-table name <-> HF tensor name (identity for LLaMA).
std::string hf_tensor_name(HfArch a, const std::string& adgt_name);
std::string adgt_tensor_name(HfArch a, const std::string& hf_name);

// What config.json needs beyond the model shape.
struct HfConfigExtras {
  std::string torch_dtype = "float32";  // "float32" | "bfloat16"
  int64_t bos_token_id = -1;            // < 0: unknown, key omitted
  int64_t eos_token_id = -1;
};

// config.json as transformers' LlamaForCausalLM loads it (keys in a fixed order).
nlohmann::ordered_json hf_config_json(const ModelConfig& m, const HfConfigExtras& extra);

// The model section from a config.json (`where` names the file in errors).
// Refuses what adgt's model cannot represent, naming the key: another
// model_type, biases, rope_scaling, a hidden_act other than silu, a head_dim
// other than hidden_size / num_attention_heads. init_std comes from
// initializer_range when present (else `base.init_std`); every other field
// from config.json (LlamaConfig's defaults for optional keys).
ModelConfig model_from_hf_config(const nlohmann::json& cfg, const std::string& where,
                                 const ModelConfig& base, HfArch* arch = nullptr);

}  // namespace adgt
