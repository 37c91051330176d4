#include "core/hf/config.hpp"

namespace adgt {

namespace {

using json = nlohmann::json;

// A required or optional positive integer key.
int64_t positive_int(const json& c, const char* key, const std::string& where, int64_t fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    if (fallback > 0) return fallback;
    throw HfError(where + ": key \"" + key + "\" is missing; a LlamaForCausalLM / MixtralForCausalLM "
                  "config.json has it");
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

double non_negative_real(const json& c, const char* key, const std::string& where, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  const json& v = c[key];
  if (!v.is_number() || !(v.get<double>() >= 0))
    throw HfError(where + ": \"" + key + "\" must be a number >= 0, got " + v.dump());
  return v.get<double>();
}

bool boolean(const json& c, const char* key, const std::string& where, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_boolean())
    throw HfError(where + ": \"" + key + "\" must be true or false, got " + c[key].dump());
  return c[key].get<bool>();
}

}  // namespace

HfArch hf_arch(const ModelConfig& m) { return m.n_experts > 0 ? HfArch::Mixtral : HfArch::Llama; }

const char* hf_architecture_name(HfArch a) {
  return a == HfArch::Mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM";
}
const char* hf_model_type(HfArch a) { return a == HfArch::Mixtral ? "mixtral" : "llama"; }

std::vector<std::string> hf_export_check(const ModelConfig& m) {
  std::vector<std::string> notes;
  if (hf_arch(m) != HfArch::Mixtral) return notes;
  if (m.moe_every != 1)
    throw HfError("model.moe_every=" + std::to_string(m.moe_every) +
                  " mixes dense and mixture-of-experts layers; MixtralForCausalLM has experts in every layer "
                  "and cannot represent this model (train with moe_every: 1 to export it)");
  if (m.moe_aux_free)
    throw HfError("model.moe_aux_free=true: the per-expert selection bias of auxiliary-loss-free balancing "
                  "decides which experts each token uses, and MixtralForCausalLM's router (softmax top-k of "
                  "gate(x)) has no place for it; an export without it would route tokens differently");
  if (m.moe_capacity_factor > 0)
    notes.push_back("model.moe_capacity_factor=" + std::to_string(m.moe_capacity_factor) +
                    ": MixtralForCausalLM is dropless; the export computes every token's top-" +
                    std::to_string(m.moe_top_k) + " experts (training dropped tokens over capacity)");
  return notes;
}

std::string hf_tensor_name(HfArch, const std::string& adgt_name) { return adgt_name; }
std::string adgt_tensor_name(HfArch, const std::string& hf_name) { return hf_name; }

nlohmann::ordered_json hf_config_json(const ModelConfig& m, const HfConfigExtras& extra) {
  const HfArch a = hf_arch(m);
  hf_export_check(m);
  nlohmann::ordered_json j;
  if (a == HfArch::Mixtral) {  // MixtralConfig's keys
    j["architectures"] = {hf_architecture_name(a)};
    j["model_type"] = hf_model_type(a);
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.d_model;
    j["intermediate_size"] = m.expert_ffn();
    j["num_hidden_layers"] = m.n_layers;
    j["num_attention_heads"] = m.n_heads;
    j["num_key_value_heads"] = m.n_kv_heads;
    j["head_dim"] = m.head_dim();
    j["max_position_embeddings"] = m.seq_len;
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["sliding_window"] = nullptr;
    j["tie_word_embeddings"] = m.tie_embeddings;
    j["hidden_act"] = "silu";
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = m.init_std;
    j["num_local_experts"] = m.n_experts;
    j["num_experts_per_tok"] = m.moe_top_k;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = m.moe_aux_loss_coef;
    j["router_jitter_noise"] = 0.0;
    j["use_cache"] = true;
    j["torch_dtype"] = extra.torch_dtype;
    if (extra.bos_token_id >= 0) j["bos_token_id"] = extra.bos_token_id;
    if (extra.eos_token_id >= 0) j["eos_token_id"] = extra.eos_token_id;
    return j;
  }
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
                                 HfArch* arch, std::vector<std::string>* notes) {
  if (!c.is_object()) throw HfError(where + ": not a JSON object");
  const std::string type =
      c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "";
  bool llama_arch = false, mixtral_arch = false;
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"]) {
      llama_arch = llama_arch || (a.is_string() && a.get<std::string>() == "LlamaForCausalLM");
      mixtral_arch = mixtral_arch || (a.is_string() && a.get<std::string>() == "MixtralForCausalLM");
    }
  HfArch a = HfArch::Llama;
  if (type == "mixtral" || (type.empty() && mixtral_arch))
    a = HfArch::Mixtral;
  else if (type != "llama" && !(type.empty() && llama_arch))
    throw HfError(where + ": model_type " + (type.empty() ? std::string("is missing") : "\"" + type + "\"") +
                  "; adgt imports LlamaForCausalLM (model_type \"llama\") and MixtralForCausalLM "
                  "(model_type \"mixtral\")");
  if (arch) *arch = a;
  const bool moe = a == HfArch::Mixtral;

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
  // LlamaConfig's and MixtralConfig's defaults for the optional keys.
  m.seq_len = positive_int(c, "max_position_embeddings", where, moe ? 4096 * 32 : 2048);
  m.norm_eps = positive_real(c, "rms_norm_eps", where, moe ? 1e-5 : 1e-6);
  m.rope_theta = positive_real(c, "rope_theta", where, moe ? 1e6 : 10000.0);
  m.n_experts = 0;
  if (moe) {
    m.n_experts = positive_int(c, "num_local_experts", where, 8);
    m.moe_top_k = positive_int(c, "num_experts_per_tok", where, 2);
    m.moe_every = 1;
    m.expert_ffn_hidden = m.ffn_hidden;  // no dense FFN: ffn_hidden is unused, set alike
    m.moe_aux_loss_coef = non_negative_real(c, "router_aux_loss_coef", where, 0.001);
    if (m.moe_top_k > m.n_experts)
      throw HfError(where + ": num_experts_per_tok=" + std::to_string(m.moe_top_k) +
                    " is larger than num_local_experts=" + std::to_string(m.n_experts));
    if (c.contains("sliding_window") && !c["sliding_window"].is_null()) {
      const int64_t w = positive_int(c, "sliding_window", where, 0);
      if (w < m.seq_len)
        throw HfError(where + ": \"sliding_window\": " + std::to_string(w) +
                      " is not supported; adgt attends over the whole context (sliding_window null, or at "
                      "least max_position_embeddings = " + std::to_string(m.seq_len) + ")");
      if (notes) notes->push_back("sliding_window " + std::to_string(w) + " >= max_position_embeddings: ignored");
    }
    const double jitter = non_negative_real(c, "router_jitter_noise", where, 0.0);
    if (jitter > 0 && notes)
      notes->push_back("router_jitter_noise " + std::to_string(jitter) +
                       " ignored (training-time noise; adgt's router adds none)");
  }
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
