// Named trainer state in checkpoints (CheckpointState::state, state/<name>)
// and the reading of the words older checkpoints packed into meta/rng_state.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/checkpoint/checkpoint.hpp"
#include "parallel/trainer/trainer_state.hpp"

using namespace adgt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::path(ADGT_BINARY_DIR) / "test_tmp" / ("trainer_state_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

ModelConfig moe_model() {
  ModelConfig m;
  m.vocab_size = 32;
  m.d_model = 8;
  m.n_layers = 3;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.ffn_hidden = 16;
  m.seq_len = 4;
  m.n_experts = 3;
  m.moe_every = 2;  // layer 1 only
  m.moe_aux_free = true;
  return m;
}

CheckpointState small_state(const ModelConfig& m) {
  CheckpointState st;
  st.step = 9;
  st.samples_seen = 90;
  st.config_yaml = "model: {}\n";
  st.specs = build_param_table(m);
  const auto n = size_t(total_numel(st.specs));
  st.params.assign(n, 0.5f);
  st.exp_avg.assign(n, 0.0f);
  st.exp_avg_sq.assign(n, 0.0f);
  return st;
}

}  // namespace

TEST_CASE("trainer state: named entries of every kind round-trip bit for bit", "[checkpoint][state]") {
  const ModelConfig m = moe_model();
  CheckpointState st = small_state(m);
  st.state["trainer/opt_steps"] = StateEntry::of_ints({7});
  st.state["moe/bias/layer_1"] = StateEntry::of_reals({-0.0, std::numeric_limits<double>::denorm_min(), 1e300});
  st.state["moe/placement"] = StateEntry::of_ints({}, 3);
  st.state["pipeline/schedule"] = StateEntry::of_text("{\"name\": \"1f1b\"}");
  st.state["top"] = StateEntry::of_reals({});
  const fs::path root = fresh_dir("roundtrip");
  const std::string dir = save_checkpoint(root.string(), st, 0);
  const CheckpointState ld = load_checkpoint(dir, st.specs);
  REQUIRE(ld.state.size() == st.state.size());
  for (const auto& [k, v] : st.state) {
    INFO(k);
    REQUIRE(ld.state.count(k) == 1);
    const StateEntry& w = ld.state.at(k);
    CHECK(w.kind == v.kind);
    CHECK(w.version == v.version);
    CHECK(w.ints == v.ints);
    CHECK(w.text == v.text);
    REQUIRE(w.reals.size() == v.reals.size());
    CHECK((v.reals.empty() || std::memcmp(w.reals.data(), v.reals.data(), v.reals.size() * 8) == 0));
  }
}

TEST_CASE("trainer state: a malformed entry name is refused", "[checkpoint][state]") {
  CheckpointState st = small_state(moe_model());
  st.state["moe//bias"] = StateEntry::of_ints({1});
  CHECK_THROWS_WITH(save_checkpoint(fresh_dir("badname").string(), st, 0),
                    Contains("checkpoint state entry 'moe//bias'"));
}

TEST_CASE("trainer state: what the trainer saves is what it restores", "[state]") {
  const ModelConfig m = moe_model();
  std::vector<double> bias(size_t(m.n_layers * m.n_experts), 0.0);
  for (int64_t e = 0; e < m.n_experts; ++e) bias[size_t(1 * m.n_experts + e)] = 0.25 * double(e + 1);
  CheckpointState st;
  st.step = 12;
  st.state = trainer_state(m, 11, bias, "");
  CHECK(st.state.count("moe/bias/layer_0") == 0);  // dense layers have no bias
  CHECK(st.state.count("pipeline/schedule") == 0);
  const RestoredTrainerState r = restore_trainer_state(st, m, "ckpt");
  CHECK(r.opt_steps == 11);
  CHECK(r.has_moe_bias);
  CHECK(r.moe_bias == bias);
  st.state["moe/bias/layer_1"] = StateEntry::of_reals({1.0});
  CHECK_THROWS_WITH(restore_trainer_state(st, m, "ckpt"),
                    Contains("ckpt: state/moe/bias/layer_1 must hold model.n_experts=3 reals"));
  st.state.erase("moe/bias/layer_1");
  const RestoredTrainerState nob = restore_trainer_state(st, m, "ckpt");
  CHECK_FALSE(nob.has_moe_bias);
  CHECK(nob.moe_bias == std::vector<double>(bias.size(), 0.0));
}

TEST_CASE("trainer state: the rng_state words of older checkpoints", "[state]") {
  const ModelConfig m = moe_model();
  CheckpointState st;
  st.step = 5;
  // No words at all (format version 1 imports): the update count is the step.
  CHECK(restore_trainer_state(st, m, "old").opt_steps == 5);
  // Word 0, then n_layers x E doubles as bit copies.
  std::vector<double> table(size_t(m.n_layers * m.n_experts), 0.0);
  table[3] = -1.5, table[4] = 2.0, table[5] = 1e-9;
  st.rng_state.assign(1 + table.size(), 0);
  st.rng_state[0] = 4;
  std::memcpy(st.rng_state.data() + 1, table.data(), table.size() * 8);
  const RestoredTrainerState r = restore_trainer_state(st, m, "old");
  CHECK(r.opt_steps == 4);
  CHECK(r.has_moe_bias);
  CHECK(r.moe_bias == table);
  const auto named = with_legacy_state(st, m);
  CHECK(named.at("trainer/opt_steps").ints == std::vector<int64_t>{4});
  CHECK(named.at("moe/bias/layer_1").reals == std::vector<double>{-1.5, 2.0, 1e-9});
  // Words of another length (no biases saved): they restart at 0.
  st.rng_state = {4};
  const RestoredTrainerState nob = restore_trainer_state(st, m, "old");
  CHECK(nob.opt_steps == 4);
  CHECK_FALSE(nob.has_moe_bias);
  // Named state, when present, wins over any words.
  st.state["trainer/opt_steps"] = StateEntry::of_ints({3});
  CHECK(restore_trainer_state(st, m, "old").opt_steps == 3);
}
