// Unit tests of the HuggingFace pieces without Python: bf16/f16 conversions,
// the safetensors reader's validation on hand-made bytes, a write/read round
// trip, shard planning, byte sizes and the config.json mapping.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "core/hf/config.hpp"
#include "core/hf/export.hpp"
#include "core/hf/safetensors.hpp"

using namespace adgt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path tmp_dir() {
  // Removed when the test program exits.
  static const struct Dir {
    fs::path p = fs::temp_directory_path() / ("adgt_hf_unit_" + std::to_string(::getpid()));
    ~Dir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } dir;
  fs::create_directories(dir.p);
  return dir.p;
}

// A file: 8-byte length, `header` verbatim, then `data_bytes` zero bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                      uint64_t length_field = UINT64_MAX) {
  const std::string path = (tmp_dir() / name).string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(data_bytes, '\0');
  return path;
}

uint16_t bf16(float x) { return f32_to_bf16(x); }

}  // namespace

TEST_CASE("bf16 rounds to nearest even", "[hf]") {
  CHECK(bf16(1.0f) == 0x3f80);
  CHECK(bf16(1.0f + 0x1p-8f) == 0x3f80);             // tie, down to even
  CHECK(bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);         // tie, up to even
  CHECK(bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above the tie
  CHECK(bf16(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);  // below the tie
  CHECK(bf16(-(1.0f + 0x1p-8f)) == 0xbf80);
  CHECK(bf16(-0.0f) == 0x8000);
  CHECK(bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16(std::numeric_limits<float>::max()) == 0x7f80);  // overflow rounds to inf
  CHECK(bf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  const uint16_t nan = bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_f32(nan)));
  CHECK(std::isnan(bf16_to_f32(bf16(std::bit_cast<float>(0x7f800001u)))));  // low-payload NaN stays NaN
  CHECK(bf16_to_f32(0x3f81) == 1.0f + 0x1p-7f);
}

TEST_CASE("f16 widens exactly", "[hf]") {
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == 0x1p-24f);  // smallest subnormal
  CHECK(f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(std::signbit(f16_to_f32(0x8000)));
  CHECK(std::isinf(f16_to_f32(0x7c00)));
  CHECK(std::isnan(f16_to_f32(0x7e00)));
}

TEST_CASE("safetensors write/read round trip", "[hf]") {
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 1.0f + 0x1p-8f, 0.1f, -0.0f};
  const std::vector<float> b = {7.0f};
  const std::string p = (tmp_dir() / "rt.safetensors").string();
  for (StDType dt : {StDType::F32, StDType::BF16}) {
    fs::remove(p);
    const int64_t bytes = write_safetensors(p, {{"a", {2, 3}, a.data()}, {"b.c", {1}, b.data()}}, dt,
                                            {{"format", "pt"}});
    CHECK(bytes == 7 * st_dtype_size(dt));
    const StFile f = read_safetensors_header(p);
    CHECK(f.data_start % 8 == 0);
    CHECK(f.metadata.at("format") == "pt");
    REQUIRE(f.find("a"));
    CHECK(f.find("a")->shape == std::vector<int64_t>{2, 3});
    const auto ra = read_safetensors_f32(f, *f.find("a"));
    for (size_t i = 0; i < a.size(); ++i)
      CHECK(ra[i] == (dt == StDType::F32 ? a[i] : bf16_to_f32(bf16(a[i]))));
    CHECK(read_safetensors_f32(f, *f.find("b.c"))[0] == 7.0f);
  }
}

TEST_CASE("safetensors header errors name the file and tensor", "[hf]") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_NOTHROW(read_safetensors_header(write_raw("ok.st", ok, 8)));
  CHECK_THROWS_WITH(read_safetensors_header(write_raw("long.st", ok, 8, 1u << 20)),
                    Contains("long.st: malformed header: its length field says 1048576"));
  CHECK_THROWS_WITH(read_safetensors_header(write_raw("json.st", "{nope", 0)),
                    Contains("json.st: malformed header: not valid JSON"));
  CHECK_THROWS_WITH(
      read_safetensors_header(write_raw("dtype.st", R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8)),
      Contains("tensor w: unknown dtype \"Q4\""));
  CHECK_THROWS_WITH(
      read_safetensors_header(write_raw("range.st", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8)),
      Contains("tensor w: data_offsets [4, 12] run past the data region of 8 bytes"));
  CHECK_THROWS_WITH(
      read_safetensors_header(write_raw("size.st", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      Contains("tensor w: data_offsets [0, 8] hold 8 bytes, but F32 (3) needs 12"));
  CHECK_THROWS_WITH(read_safetensors_header(write_raw(
                        "overlap.st",
                        R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12)),
                    Contains("overlap"));
  CHECK_THROWS_WITH(
      read_safetensors_header(write_raw("neg.st", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
      Contains("tensor w: a shape entry must be a non-negative integer"));
  CHECK_THROWS_WITH(read_safetensors_header((tmp_dir() / "absent.st").string()),
                    Contains("absent.st: cannot open"));
  {
    const std::string p = (tmp_dir() / "short.st").string();
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK_THROWS_WITH(read_safetensors_header(p), Contains("shorter than the 8-byte header length"));
  }
  const StFile f = read_safetensors_header(
      write_raw("i64.st", R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  CHECK_THROWS_WITH(read_safetensors_f32(f, *f.find("w")), Contains("tensor w: dtype I64 cannot be imported"));
}

TEST_CASE("shard plan and byte sizes", "[hf]") {
  CHECK(plan_shards({10, 10, 10}, 25) == std::vector<std::vector<size_t>>{{0, 1}, {2}});
  CHECK(plan_shards({10, 50, 10}, 25) == std::vector<std::vector<size_t>>{{0}, {1}, {2}});
  CHECK(plan_shards({10, 10}, 100) == std::vector<std::vector<size_t>>{{0, 1}});
  CHECK(plan_shards({}, 100).empty());
  CHECK(parse_byte_size("5GB") == 5'000'000'000);
  CHECK(parse_byte_size("100KB") == 100'000);
  CHECK(parse_byte_size("2GiB") == 2LL << 30);
  CHECK(parse_byte_size("1.5mb") == 1'500'000);
  CHECK(parse_byte_size("123") == 123);
  CHECK_THROWS_WITH(parse_byte_size("5 parsecs"), Contains("max shard size \"5 parsecs\""));
  CHECK_THROWS_AS(parse_byte_size(""), HfError);
}

TEST_CASE("config.json round trip and refusals", "[hf]") {
  ModelConfig m;
  m.vocab_size = 1000;
  m.d_model = 64;
  m.n_layers = 3;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.ffn_hidden = 176;
  m.seq_len = 128;
  m.rope_theta = 500000.0;
  m.norm_eps = 1e-6;
  m.tie_embeddings = true;
  m.init_std = 0.01;
  const auto j = hf_config_json(m, {});
  CHECK(j["architectures"][0] == "LlamaForCausalLM");
  CHECK(j["head_dim"] == 8);
  CHECK(!j.contains("bos_token_id"));
  CHECK(model_from_hf_config(nlohmann::json::parse(j.dump()), "c.json", ModelConfig{}) == m);
  CHECK(hf_tensor_name(HfArch::Llama, "model.norm.weight") == "model.norm.weight");

  auto bad = [&](const char* key, nlohmann::json v) {
    nlohmann::json c = nlohmann::json::parse(j.dump());
    if (v.is_null()) c.erase(key); else c[key] = v;
    return c;
  };
  CHECK_THROWS_WITH(model_from_hf_config(bad("model_type", "qwen2_moe"), "c.json", m),
                    Contains("c.json: model_type \"qwen2_moe\"; adgt imports LlamaForCausalLM"));
  CHECK_THROWS_WITH(model_from_hf_config(bad("model_type", "gpt2"), "c.json", m),
                    Contains("model_type \"gpt2\""));
  CHECK_THROWS_WITH(model_from_hf_config(bad("attention_bias", true), "c.json", m),
                    Contains("\"attention_bias\": true is not supported"));
  CHECK_THROWS_WITH(model_from_hf_config(bad("rope_scaling", {{"rope_type", "llama3"}}), "c.json", m),
                    Contains("\"rope_scaling\""));
  CHECK_THROWS_WITH(model_from_hf_config(bad("head_dim", 16), "c.json", m), Contains("head_dim=16"));
  CHECK_THROWS_WITH(model_from_hf_config(bad("hidden_size", nullptr), "c.json", m),
                    Contains("c.json: key \"hidden_size\" is missing"));
  CHECK_THROWS_WITH(model_from_hf_config(bad("vocab_size", "big"), "c.json", m),
                    Contains("\"vocab_size\" must be a positive integer"));
  CHECK_THROWS_WITH(model_from_hf_config(bad("hidden_act", "gelu"), "c.json", m),
                    Contains("hidden_act \"gelu\""));
  // Optional keys fall back to LlamaConfig's defaults.
  const ModelConfig d = model_from_hf_config(bad("num_key_value_heads", nullptr), "c.json", m);
  CHECK(d.n_kv_heads == 8);
}

TEST_CASE("config.json of a Mixtral model: round trip, defaults and refusals", "[hf]") {
  ModelConfig m;
  m.vocab_size = 1000;
  m.d_model = 64;
  m.n_layers = 2;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.ffn_hidden = 96;  // import sets ffn_hidden = expert_ffn_hidden = intermediate_size
  m.seq_len = 128;
  m.rope_theta = 1e6;
  m.n_experts = 8;
  m.moe_top_k = 2;
  m.expert_ffn_hidden = 96;
  m.moe_aux_loss_coef = 0.02;
  REQUIRE(hf_arch(m) == HfArch::Mixtral);
  REQUIRE(hf_export_check(m).empty());
  const auto j = hf_config_json(m, {});
  CHECK(j["architectures"][0] == "MixtralForCausalLM");
  CHECK(j["model_type"] == "mixtral");
  CHECK(j["intermediate_size"] == 96);
  CHECK(j["num_local_experts"] == 8);
  CHECK(j["num_experts_per_tok"] == 2);
  CHECK(j["router_aux_loss_coef"] == 0.02);
  CHECK(j["output_router_logits"] == false);
  CHECK(j["sliding_window"].is_null());
  CHECK(!j.contains("mlp_bias"));
  HfArch arch{};
  CHECK(model_from_hf_config(nlohmann::json::parse(j.dump()), "c.json", ModelConfig{}, &arch) == m);
  CHECK(arch == HfArch::Mixtral);
  // The expert width, not ffn_hidden, is intermediate_size.
  ModelConfig wide = m;
  wide.ffn_hidden = 256;
  CHECK(hf_config_json(wide, {})["intermediate_size"] == 96);

  auto edit = [&](const char* key, nlohmann::json v) {
    nlohmann::json c = nlohmann::json::parse(j.dump());
    if (v.is_null()) c.erase(key); else c[key] = v;
    return c;
  };
  // MixtralConfig's defaults for optional keys.
  nlohmann::json c = edit("num_experts_per_tok", nullptr);
  for (const char* k : {"num_local_experts", "rope_theta", "rms_norm_eps", "router_aux_loss_coef", "model_type"})
    c.erase(k);  // architectures still says Mixtral
  const ModelConfig d = model_from_hf_config(c, "c.json", ModelConfig{});
  CHECK(d.n_experts == 8);
  CHECK(d.moe_top_k == 2);
  CHECK(d.rope_theta == 1e6);
  CHECK(d.norm_eps == 1e-5);
  CHECK(d.moe_aux_loss_coef == 0.001);
  // Training-only moe settings of the base survive; a llama import turns experts off.
  ModelConfig base;
  base.moe_capacity_factor = 1.5;
  CHECK(model_from_hf_config(nlohmann::json::parse(j.dump()), "c.json", base).moe_capacity_factor == 1.5);
  ModelConfig dense = m;
  dense.n_experts = 0;
  CHECK(model_from_hf_config(nlohmann::json::parse(hf_config_json(dense, {}).dump()), "c.json", m).n_experts == 0);

  CHECK_THROWS_WITH(model_from_hf_config(edit("sliding_window", 64), "c.json", m),
                    Contains("c.json: \"sliding_window\": 64 is not supported"));
  std::vector<std::string> notes;
  CHECK(model_from_hf_config(edit("sliding_window", 4096), "c.json", m, nullptr, &notes).n_experts == 8);
  CHECK(model_from_hf_config(edit("router_jitter_noise", 0.01), "c.json", m, nullptr, &notes).n_experts == 8);
  REQUIRE(notes.size() == 2);
  CHECK_THAT(notes[1], Contains("router_jitter_noise"));
  CHECK_THROWS_WITH(model_from_hf_config(edit("num_experts_per_tok", 9), "c.json", m),
                    Contains("num_experts_per_tok=9 is larger than num_local_experts=8"));
  CHECK_THROWS_WITH(model_from_hf_config(edit("num_local_experts", 0), "c.json", m),
                    Contains("\"num_local_experts\" must be a positive integer"));

  // What Mixtral cannot represent is refused by name; capacity is a note.
  ModelConfig mixed = m;
  mixed.moe_every = 2;
  CHECK_THROWS_WITH(hf_config_json(mixed, {}), Contains("model.moe_every=2 mixes dense and mixture-of-experts"));
  ModelConfig aux_free = m;
  aux_free.moe_aux_free = true;
  CHECK_THROWS_WITH(hf_export_check(aux_free), Contains("model.moe_aux_free=true"));
  ModelConfig capped = m;
  capped.moe_capacity_factor = 1.25;
  REQUIRE(hf_export_check(capped).size() == 1);
  CHECK_THAT(hf_export_check(capped)[0], Contains("dropless"));
}
