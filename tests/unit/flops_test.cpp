// The FLOP formulas (parallel/cost/flops.hpp) against independent counts: the
// matmul pieces against 2 x (out x in) summed over the real parameter table
// (core/model/param_table.hpp), per layer and for the whole model, dense and MoE;
// the attention core against a count of the (query, key) pairs; and the MFU
// total against the dry run's figure.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/model/param_table.hpp"
#include "parallel/cost/flops.hpp"
#include "parallel/cost/memory.hpp"

using namespace adgt;

namespace {

RunConfig shipped(const std::string& name) {
  return load_config(std::string(ADGT_SOURCE_DIR) + "/configs/" + name + ".yaml");
}

// Forward matmul FLOPs per token from the parameter table: 2 x numel of each
// matmul weight, an expert's weights scaled by the share of tokens that run it
// (top_k / n_experts). Split into layer l's attention projections and FFN
// (router included), and the rest (lm_head).
struct TableFlops {
  std::vector<double> attention, ffn;  // (L)
  double head = 0;
};

TableFlops table_flops(const ModelConfig& m) {
  TableFlops t;
  t.attention.assign(size_t(m.n_layers), 0.0);
  t.ffn.assign(size_t(m.n_layers), 0.0);
  for (const ParamSpec& p : build_param_table(m)) {
    if (!p.is_matrix) continue;
    REQUIRE(p.global_shape.size() == 2);
    double f = 2.0 * double(p.global_shape[0]) * double(p.global_shape[1]);
    if (p.expert >= 0) f *= double(m.moe_top_k) / double(m.n_experts);
    const std::string prefix = "model.layers.";
    if (p.name.rfind(prefix, 0) != 0) {
      CHECK(p.name == "lm_head.weight");
      t.head += f;
      continue;
    }
    const size_t l = std::stoul(p.name.substr(prefix.size()));
    if (p.name.find(".self_attn.") != std::string::npos) t.attention[l] += f;
    else t.ffn[l] += f;
  }
  if (m.tie_embeddings) t.head += 2.0 * double(m.vocab_size) * double(m.d_model);  // shared matrix
  return t;
}

// (query, key) pairs a sequence's attention scores: all T x T, or the causal
// ones (key <= query) and of those the strictly earlier keys.
struct Pairs {
  double full = 0, causal = 0, strictly_earlier = 0;
};
Pairs count_pairs(int64_t T) {
  Pairs p;
  for (int64_t q = 0; q < T; ++q)
    for (int64_t k = 0; k < T; ++k) {
      p.full += 1;
      if (k <= q) p.causal += 1;
      if (k < q) p.strictly_earlier += 1;
    }
  return p;
}

void check_against_table(const ModelConfig& m) {
  const TableFlops t = table_flops(m);
  double forward_matmul = t.head;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    INFO("layer " << l << (m.is_moe_layer(l) ? " (MoE)" : " (dense)"));
    const LayerFlops f = layer_forward_flops(m, l, AttentionCount::Causal);
    CHECK(f.attention_proj == t.attention[size_t(l)]);
    CHECK(f.ffn == Approx(t.ffn[size_t(l)]).epsilon(1e-15));
    forward_matmul += t.attention[size_t(l)] + t.ffn[size_t(l)];
  }
  CHECK(head_forward_flops(m) == t.head);
  // MFU: 3 x (the matmuls + the non-causal attention core of every layer).
  const Pairs pairs = count_pairs(m.seq_len);
  const double core = 2.0 * 2.0 * double(m.head_dim()) * double(m.n_heads) * pairs.full /
                      double(m.seq_len);  // QK^T and PV: 2 x hd multiply-adds per pair and head
  CHECK(mfu_flops_per_token(m) ==
        Approx(3.0 * (forward_matmul + double(m.n_layers) * core)).epsilon(1e-15));
}

}  // namespace

TEST_CASE("FLOP pieces match 2 x (out x in) over the parameter table", "[flops]") {
  SECTION("dense (tiny)") { check_against_table(shipped("tiny").model); }
  SECTION("dense, tied embeddings") {
    ModelConfig m = shipped("tiny").model;
    m.tie_embeddings = true;
    check_against_table(m);
  }
  SECTION("MoE every layer (tiny-moe)") { check_against_table(shipped("tiny-moe").model); }
  SECTION("MoE every second layer, its own expert width") {
    ModelConfig m = shipped("tiny").model;
    m.n_experts = 8, m.moe_top_k = 3, m.moe_every = 2, m.expert_ffn_hidden = 96;
    check_against_table(m);
    CHECK(layer_forward_flops(m, 0, AttentionCount::Full).ffn == dense_ffn_flops(m));
    CHECK(layer_forward_flops(m, 1, AttentionCount::Full).ffn == moe_ffn_flops(m));
  }
  SECTION("Mixtral 8x7B") { check_against_table(shipped("mixtral-8x7b").model); }
}

TEST_CASE("attention core: full and causal against a count of (query, key) pairs", "[flops]") {
  ModelConfig m;  // 8 heads of 32
  for (int64_t T : {1, 2, 7, 64, 256}) {
    m.seq_len = T;
    INFO("T=" << T);
    const Pairs p = count_pairs(T);
    const double per_pair = 2.0 * 2.0 * 32 * 8;  // QK^T and PV, all heads
    CHECK(attention_core_flops(m, AttentionCount::Full) == per_pair * p.full / double(T));
    // Causal counts T^2 / 2 pairs: the strictly earlier keys and half the diagonal.
    const double causal = attention_core_flops(m, AttentionCount::Causal);
    CHECK(causal == per_pair * (p.strictly_earlier + 0.5 * double(T)) / double(T));
    CHECK(causal >= per_pair * p.strictly_earlier / double(T));
    CHECK(causal <= per_pair * p.causal / double(T));
  }
}

TEST_CASE("training: backward is two forwards, the MFU figure is the dry run's", "[flops]") {
  const PassFlops p = training_pass(5.0);
  CHECK(p.forward == 5.0);
  CHECK(p.backward_input == 5.0);
  CHECK(p.backward_weight == 5.0);
  CHECK(p.total() == 15.0);
  for (const char* name : {"tiny", "tiny-moe", "llama-7b", "llama-70b", "mixtral-8x7b"}) {
    INFO(name);
    const RunConfig c = shipped(name);
    CHECK(estimate_memory(c, 4).flops_per_token == mfu_flops_per_token(c.model));
  }
  // The embedding counts only in the stage balance (3 x C per token), never in MFU.
  const ModelConfig m = shipped("tiny").model;
  CHECK(training_pass(embedding_forward_flops(m)).total() == 3.0 * 256);
}
