// The --dry-run estimator against the parameter table, published parameter
// counts (HuggingFace LLaMA 2 configs), the CPU backend's own attention
// buffer size, and a hand count for the tiny model.
#include <catch2/catch.hpp>

#include <chrono>

#include "core/config.hpp"
#include "core/model/param_table.hpp"
#include "kernels/backend.hpp"
#include "kernels/clock.hpp"
#include "parallel/cost/memory.hpp"

using namespace adgt;

namespace {
RunConfig shipped(const std::string& name) {
  return load_config(std::string(ADGT_SOURCE_DIR) + "/configs/" + name + ".yaml");
}
}  // namespace

TEST_CASE("parameter counts match the table and published models", "[dryrun]") {
  const RunConfig tiny = shipped("tiny");
  const MemoryEstimate e = estimate_memory(tiny, 4);
  CHECK(e.n_params == param_count(build_param_table(tiny.model)));
  CHECK(e.n_params == 4999424);
  CHECK(e.n_params_non_embedding == e.n_params - 2 * 4096 * 256);

  CHECK(estimate_memory(shipped("llama-7b"), 4).n_params == 6738415616LL);
  CHECK(estimate_memory(shipped("llama-13b"), 4).n_params == 13015864320LL);
  CHECK(estimate_memory(shipped("llama-34b"), 4).n_params == 33743970304LL);
  CHECK(estimate_memory(shipped("llama-70b"), 4).n_params == 68976648192LL);
  CHECK(estimate_memory(shipped("gpt-small"), 4).n_params == 134105856LL);

  // bf16 mixed precision (llama-1.3b): 2-byte weights, fp32 gradients, and
  // fp32 AdamW m, v plus the fp32 master weights in the optimizer line.
  {
    const RunConfig b = shipped("llama-1.3b");
    CHECK(compute_bytes_per_element(b) == 2);
    const MemoryEstimate eb = estimate_memory(b, compute_bytes_per_element(b));
    CHECK(eb.n_params == 1364297728LL);
    CHECK(eb.bytes_params == 2 * 1364297728LL);
    CHECK(eb.bytes_grads == 2 * eb.bytes_params);
    CHECK(eb.bytes_optimizer == 6 * eb.bytes_params);
  }

  // Tied embeddings: one V x C matrix fewer, but lm_head still costs matmul FLOPs.
  RunConfig tied = tiny;
  tied.model.tie_embeddings = true;
  const MemoryEstimate t = estimate_memory(tied, 4);
  CHECK(t.n_params == e.n_params - 4096 * 256);
  CHECK(t.n_params_matmul == e.n_params_matmul);
  CHECK(t.n_params_non_embedding == e.n_params_non_embedding);
}

TEST_CASE("FLOPs per token: 6 N_matmul + 12 L H hd T", "[dryrun]") {
  const RunConfig c = shipped("tiny");
  const MemoryEstimate e = estimate_memory(c, 4);
  // Per layer q,o: C*C each; k,v: C*KV*hd = 256*128 each; gate, up, down: C*F each.
  const int64_t per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688;
  const int64_t matmul = 4 * per_layer + 4096 * 256;  // + lm_head
  CHECK(e.n_params_matmul == matmul);
  CHECK(e.flops_per_token == Approx(6.0 * matmul + 12.0 * 4 * 8 * 32 * 256));
  CHECK(e.tokens_per_step == 8 * 256);
  CHECK(e.flops_per_step == Approx(e.flops_per_token * 8 * 256));
  // LLaMA 2 7B at 4096 context: ~6.6e9 matmul params -> ~4.6e10 FLOP/token.
  CHECK(estimate_memory(shipped("llama-7b"), 4).flops_per_token == Approx(4.61e10).epsilon(0.01));
}

TEST_CASE("memory: params, grads, AdamW state and saved activations", "[dryrun]") {
  const RunConfig c = shipped("tiny");
  const MemoryEstimate e = estimate_memory(c, 4);
  const int64_t numel = total_numel(build_param_table(c.model));
  CHECK(e.bytes_params == 4 * numel);
  CHECK(e.bytes_grads == 4 * numel);
  CHECK(e.bytes_optimizer == 8 * numel);
  // Hand count per token: layer 4C+2 + 2*H*hd + 2*KV*hd + H*T + 3F; final 2C+1+V+1.
  const int64_t C = 256, H = 8, KV = 4, hd = 32, T = 256, F = 688, V = 4096, L = 4, B = 8;
  const int64_t layer = 4 * C + 2 + 2 * H * hd + 2 * KV * hd + H * T + 3 * F;
  const int64_t fin = 2 * C + 2 + V;
  CHECK(e.bytes_activations == B * T * (L * layer + fin) * 4);
  CHECK(e.bytes_total ==
        e.bytes_params + e.bytes_grads + e.bytes_optimizer + e.bytes_activations + e.bytes_scratch);
  // Scratch by hand (model.cpp make_scratch, no SP): d_resid, d_tmp (N C each),
  // dq, dk, dv, d_att, dgate, dup (dgu when fused), dh; the fused q/k/v GEMM's
  // output (train.fused_projections, the default); the rotary tables T hd;
  // one micro-batch's chunk output N C and its 2N token ids.
  const int64_t N = B * T;
  CHECK(e.bytes_scratch == (2 * N * C + N * (2 * H + 2 * KV) * hd + 3 * N * F +
                            N * (H + 2 * KV) * hd) * 4 +
                               T * hd * 4 + (N * C * 4 + 2 * N * 4));
  RunConfig unfused = c;
  unfused.train.fused_projections = false;
  CHECK(estimate_memory(unfused, 4).bytes_scratch == e.bytes_scratch - N * (H + 2 * KV) * hd * 4);

  // The attention term is exactly what the CPU backend allocates for its probabilities.
  auto be = make_backend("cpu");
  const int64_t att = be->attention_saved_elems({B, T, H, KV, hd});
  CHECK(att == B * T * H * T);

  // f64 doubles params, grads and activations; m and v are f64 too.
  const MemoryEstimate d = estimate_memory(c, 8);
  CHECK(d.bytes_params == 2 * e.bytes_params);
  CHECK(d.bytes_optimizer == 2 * e.bytes_optimizer);
  CHECK(d.bytes_activations == 2 * e.bytes_activations);
  RunConfig c64 = c;
  c64.train.dtype = "f64";
  CHECK(compute_bytes_per_element(c64) == 8);
  CHECK(compute_bytes_per_element(c) == 4);
}

TEST_CASE("llama-70b is estimated instantly and printed", "[dryrun]") {
  const RunConfig c = shipped("llama-70b");
  // Arithmetic, no allocation of the model: this thread's CPU time (which
  // no other process's load adds to) stays far under 100 ms.
  const double t0 = thread_cpu_seconds();
  const MemoryEstimate e = estimate_memory(c, compute_bytes_per_element(c));
  CHECK(thread_cpu_seconds() - t0 < 0.1);
  // The shipped config trains in bf16: 2 bytes a parameter (the fp32 master
  // weights are the optimizer's).
  REQUIRE(c.train.dtype == "bf16");
  CHECK(e.bytes_params == 68976648192LL * 2);
  CHECK(e.bytes_total > e.bytes_params);
  const std::string s = format_estimate(c, e);
  INFO(s);
  CHECK_THAT(s, Catch::Matchers::Contains("68,976,648,192"));
  CHECK_THAT(s, Catch::Matchers::Contains("accumulation"));
  CHECK_THAT(s, Catch::Matchers::Contains("GiB"));
  CHECK(with_thousands(0) == "0");
  CHECK(with_thousands(999) == "999");
  CHECK(with_thousands(1000) == "1,000");
  CHECK(with_thousands(-1234567) == "-1,234,567");
}

TEST_CASE("dry run divides memory by the layout", "[dryrun]") {
  RunConfig c = load_config_text("parallel:\n  tp: 2\n  dp: 2\n  zero: 1\ntrain:\n  global_batch: 16\n",
                                 "x.yaml");
  const MemoryEstimate one = estimate_memory(load_config_text("", "x.yaml"), 4);
  const MemoryEstimate e = estimate_memory(c, 4);
  const int64_t shard = total_numel(build_param_table(c.model, 2, 0));
  CHECK(e.bytes_params == shard * 4);
  CHECK(e.bytes_grads == shard * 4);
  CHECK(e.bytes_optimizer == 2 * shard * 4 / 2);  // ZeRO-1 over dp=2
  CHECK(e.n_params == one.n_params);               // the model itself is unchanged
  CHECK(e.bytes_params < one.bytes_params);
  CHECK(e.bytes_activations < one.bytes_activations);
}

TEST_CASE("dry run with context parallelism: a rank's activations are 1/cp, plus the ring's buffers",
          "[dryrun]") {
  // On cuda the attention keeps a log-sum-exp with or without cp, so every
  // saved activation is per token and cp = 4 keeps exactly a quarter.
  const std::string base = "model:\n  seq_len: 4096\ntrain:\n  device: cuda\n  global_batch: 8\n";
  const RunConfig one = load_config_text(base, "x.yaml");
  const RunConfig four = load_config_text(base + "parallel:\n  cp: 4\n", "x.yaml");
  const MemoryEstimate a = estimate_memory(one, 4), b = estimate_memory(four, 4);
  CHECK(b.bytes_activations * 4 == a.bytes_activations);
  CHECK(b.bytes_params == a.bytes_params);  // cp ranks hold every weight of their shard
  CHECK(b.bytes_optimizer == a.bytes_optimizer);
  const ModelConfig& m = one.model;
  const int64_t Nt = one.train.micro_batch * 4096 / 4, KV = m.n_kv_heads, H = m.n_heads, hd = m.head_dim();
  CHECK(a.bytes_ring == 0);
  CHECK(b.bytes_ring == (6 * Nt * 2 * KV * hd + Nt * H * hd) * 4 + Nt * H * 4);
  CHECK(b.bytes_scratch > b.bytes_ring);
  const std::string s = format_estimate(four, b);
  INFO(s);
  CHECK_THAT(s, Catch::Matchers::Contains("seq_len 4096 / cp 4"));
  CHECK_THAT(s, Catch::Matchers::Contains("cp 4 ring"));
  CHECK_THAT(s, Catch::Matchers::Contains("the cp ring's K/V and dK/dV buffers"));
  // On the CPU backend the T probabilities give way to the ring's log-sum-exp.
  const RunConfig cpu4 = load_config_text("model:\n  seq_len: 512\ntrain:\n  device: cpu\n"
                                          "parallel:\n  cp: 4\n", "x.yaml");
  RunConfig cpu1 = cpu4;
  cpu1.parallel.cp = 1;
  CHECK(estimate_memory(cpu4, 4).bytes_activations * 4 < estimate_memory(cpu1, 4).bytes_activations);

  // The sizing: llama-70b at 131072 tokens on tp 8 x cp 16 x pp 4
  // H100s fits 80 GiB (ZeRO-1 over the dp x cp ranks), where cp = 1 does not
  // come near.
  RunConfig big = shipped("llama-70b");
  big.model.seq_len = 131072;
  big.train.device = "cuda";
  big.train.global_batch = 16;
  big.parallel.tp = 8, big.parallel.pp = 4, big.parallel.cp = 16, big.parallel.dp = 1;
  big.parallel.sequence_parallel = true;
  big.parallel.zero = 1;  // the AdamW state over dp x cp = 16 ranks
  big.parallel.schedule = "1f1b";
  big.parallel.virtual_stages = 1;
  big.parallel.stage_layers.clear();
  big.train.micro_batch = 1;
  validate(big);
  const MemoryEstimate e70 = estimate_memory(big, compute_bytes_per_element(big));
  INFO(format_estimate(big, e70));
  CHECK(double(e70.bytes_total) < 80.0 * (1LL << 30));
  big.parallel.cp = 1;
  CHECK(double(estimate_memory(big, compute_bytes_per_element(big)).bytes_activations) >
        7 * 80.0 * (1LL << 30));  // 615 GiB
}

TEST_CASE("dry run of a mixture of experts: Mixtral 8x7B's count, top-k FLOPs, experts over ep",
          "[dryrun]") {
  const std::string mixtral =
      "model:\n  vocab_size: 32000\n  d_model: 4096\n  n_layers: 32\n  n_heads: 32\n"
      "  n_kv_heads: 8\n  ffn_hidden: 14336\n  seq_len: 4096\n  n_experts: 8\n  moe_top_k: 2\n"
      "train:\n  micro_batch: 1\n  global_batch: 64\n";
  const MemoryEstimate e = estimate_memory(load_config_text(mixtral, "x.yaml"), 4);
  CHECK(e.n_params == 46702792704LL);  // Mixtral-8x7B's published 46.7B
  // A token runs 2 of 8 experts: 6 x (active matmul weights) + attention, about 12.9B active.
  const double expert = 32.0 * 8 * 3 * 4096.0 * 14336.0;
  const double active = double(e.n_params_matmul) - expert * 6 / 8;
  CHECK(e.flops_per_token == Approx(6.0 * active + 12.0 * 32 * 32 * 128 * 4096).epsilon(1e-12));
  // ep = 8 over dp = 8: each rank holds one expert per layer.
  const MemoryEstimate ep = estimate_memory(
      load_config_text(mixtral + "parallel:\n  dp: 8\n  ep: 8\n", "x.yaml"), 4);
  std::vector<int64_t> one{0};
  CHECK(ep.bytes_params == total_numel(build_param_table(load_config_text(mixtral, "x.yaml").model,
                                                         1, 0, nullptr, &one)) * 4);
  CHECK(ep.bytes_params < e.bytes_params / 3);
}
