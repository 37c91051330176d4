#include "core/hf_config.hpp"

namespace adgt {

namespace {

using json = nlohmann::json;

// A required or optional positive integer key.
int64_t positive_int(const json& c, const char* key, const std::string& where, int64_t fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    if (fallback > 0) return fallback;
    throw HfError(where + ": key \"" + key + "\" is missing; a LlamaForCausalLM config.json has it");
  }
  const json& v = c[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    throw HfError(where + ": \"" + key + "\" must be a positive integer, got " + v.dump());
  return v.get<int64_t>();
}

double positive_real(const json& c, const char* key, const std::string& where, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  const json& v = c[key];
  if (!v.is_number() || !(v.get<double>() > 0))
    throw HfError(where + ": \"" + key + "\" must be a positive number, got " + v.dump());
  return v.get<double>();
}

bool boolean(const json& c, const char* key, const std::string& where, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_boolean())
    throw HfError(where + ": \"" + key + "\" must be true or false, got " + c[key].dump());
  return c[key].get<bool>();
}

}  // namespace

HfArch hf_arch(const ModelConfig&) {
  return HfArch::Llama;  // a mixture-of-experts config would map to Mixtral here
}

const char* hf_architecture_name(HfArch) { return "LlamaForCausalLM"; }
const char* hf_model_type(HfArch) { return "llama"; }

std::string hf_tensor_name(HfArch, const std::string& adgt_name) { return adgt_name; }
std::string adgt_tensor_name(HfArch, const std::string& hf_name) { return hf_name; }

nlohmann::ordered_json hf_config_json(const ModelConfig& m, const HfConfigExtras& extra) {
  const HfArch a = hf_arch(m);
  nlohmann::ordered_json j;
  j["architectures"] = {hf_architecture_name(a)};
  j["model_type"] = hf_model_type(a);
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn_hidden;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads;
  j["head_dim"] = m.head_dim();
  j["max_position_embeddings"] = m.seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = m.init_std;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["torch_dtype"] = extra.torch_dtype;
  if (extra.bos_token_id >= 0) j["bos_token_id"] = extra.bos_token_id;
  if (extra.eos_token_id >= 0) j["eos_token_id"] = extra.eos_token_id;
  return j;
}

ModelConfig model_from_hf_config(const json& c, const std::string& where, const ModelConfig& base,
                                 HfArch* arch) {
  if (!c.is_object()) throw HfError(where + ": not a JSON object");
  const std::string type =
      c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "";
  bool llama_arch = false;
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"])
      llama_arch = llama_arch || (a.is_string() && a.get<std::string>() == "LlamaForCausalLM");
  if (type == "mixtral")
    throw HfError(where + ": model_type \"mixtral\" is not supported yet (adgt has no "
                          "mixture-of-experts model); LlamaForCausalLM (model_type \"llama\") is");
  if (type != "llama" && !(type.empty() && llama_arch))
    throw HfError(where + ": model_type " + (type.empty() ? std::string("is missing") : "\"" + type + "\"") +
                  "; adgt imports LlamaForCausalLM (model_type \"llama\")");
  if (arch) *arch = HfArch::Llama;

  if (c.contains("hidden_act") && c["hidden_act"] != "silu")
    throw HfError(where + ": hidden_act " + c["hidden_act"].dump() +
                  " is not supported; adgt's MLP is SwiGLU (\"silu\")");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (boolean(c, k, where, false))
      throw HfError(where + ": \"" + k + "\": true is not supported; adgt's linears have no bias");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    throw HfError(where + ": \"rope_scaling\" " + c["rope_scaling"].dump() +
                  " is not supported; adgt implements plain RoPE (rope_scaling null)");

  ModelConfig m = base;
  m.vocab_size = positive_int(c, "vocab_size", where, 0);
  m.d_model = positive_int(c, "hidden_size", where, 0);
  m.ffn_hidden = positive_int(c, "intermediate_size", where, 0);
  m.n_layers = positive_int(c, "num_hidden_layers", where, 0);
  m.n_heads = positive_int(c, "num_attention_heads", where, 0);
  m.n_kv_heads = positive_int(c, "num_key_value_heads", where, m.n_heads);
  m.seq_len = positive_int(c, "max_position_embeddings", where, 2048);  // LlamaConfig's default
  m.norm_eps = positive_real(c, "rms_norm_eps", where, 1e-6);
  m.rope_theta = positive_real(c, "rope_theta", where, 10000.0);
  m.tie_embeddings = boolean(c, "tie_word_embeddings", where, false);
  m.init_std = positive_real(c, "initializer_range", where, base.init_std);
  if (m.d_model % m.n_heads != 0)
    throw HfError(where + ": hidden_size=" + std::to_string(m.d_model) +
                  " is not divisible by num_attention_heads=" + std::to_string(m.n_heads));
  const int64_t hd = positive_int(c, "head_dim", where, m.head_dim());
  if (hd != m.head_dim())
    throw HfError(where + ": head_dim=" + std::to_string(hd) + " differs from hidden_size / "
                  "num_attention_heads = " + std::to_string(m.head_dim()) +
                  "; adgt requires head_dim = hidden_size / num_attention_heads");
  return m;
}

}  // namespace adgt
