// The --dry-run estimator: parameter count, training FLOPs per token and
// per-rank memory of a run, computed analytically from the config (nothing is
// allocated; llama-70b takes microseconds). The memory formulas are in
// memory.cpp; the FLOPs come from flops.hpp (mfu_flops_per_token) and the
// pipeline split from stages.hpp (stage_layer_counts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

struct MemoryEstimate {
  int64_t n_params = 0;                // total parameters (sum of the parameter table)
  int64_t n_params_non_embedding = 0;  // without embed_tokens and an untied lm_head
  int64_t n_params_matmul = 0;         // weights used in matmuls, lm_head counted even when tied
  double flops_per_token = 0;          // training (fwd + bwd), MFU convention: mfu_flops_per_token
  double flops_per_step = 0;           // flops_per_token * global_batch * seq_len
  int64_t tokens_per_step = 0;         // global_batch * seq_len
  int64_t bytes_per_element = 4;      // the bytes_per_param_compute it was made with
  int64_t bytes_params = 0;            // per rank
  int64_t bytes_grads = 0;             // per rank
  int64_t bytes_optimizer = 0;         // per rank: AdamW m and v
  int64_t bytes_activations = 0;       // per rank: the saved activations of the micro-batches
                                       // in flight (one without pipeline parallelism)
  // Of bytes_activations: a split backward's output gradients, kept from B
  // to W (zb-h1, greedy).
  int64_t bytes_split = 0;
  // bf16 attention on CUDA outside the flash kernels' shapes (head_dim 64 or
  // 128, ...): the exact fp32 fallback's scratch (kernels/attention_path.hpp),
  // counted in bytes_total, and why ("" when the flash kernels take it).
  int64_t bytes_attention_fallback = 0;
  std::string attention_fallback;
  // Per rank, once: the backward's activation-gradient scratch (one layer's
  // worth: core/model/model.cpp make_scratch), the rotary tables and, per
  // micro-batch in flight, each chunk's output rows and token ids.
  int64_t bytes_scratch = 0;
  // Of bytes_scratch: context parallelism's ring buffers (K/V in flight,
  // dK/dV accumulators, the merge's running output).
  int64_t bytes_ring = 0;
  // ZeRO-2/3: what the store holds besides its shards at its most (gathered
  // units, whole-unit gradients in flight; parallel/dp/zero_store.hpp).
  int64_t bytes_zero_working = 0;
  // train.dtype fp8 (docs/fp8.md): the layers' cached FP8 weight codes (and
  // their transposes on CUDA), the activation and gradient codes of one
  // GEMM, and on the CPU backends the emulation's fp32 copies of the largest
  // GEMM's operands.
  int64_t bytes_fp8 = 0;
  int64_t bytes_total = 0;
  int pp_rank = 0;                     // pipeline: the rank reported (the largest total)
  int64_t microbatches_held = 1;       // pipeline: micro-batches in flight on that rank (all chunks)
};

// The tokens of a sequence one rank holds: model.seq_len / parallel.cp.
int64_t local_seq_len(const RunConfig& cfg);

// Bytes per parameter/activation element of the configured compute dtype:
// 8 for train.dtype f64, 2 for bf16, else 4.
int64_t compute_bytes_per_element(const RunConfig& cfg);

// The estimate for one rank of the configured layout: tensor-parallel shards,
// ZeRO-1's division of the AdamW state over dp, sequence-parallel activations,
// and with pipeline parallelism the pipeline rank with the largest total: its
// stage's parameters and, per chunk c, held[r][c] micro-batches' activations
// (what the schedule keeps in flight: pp::held_activations() in
// parallel/pipeline/validate.hpp). Without `held`: min(pp - r, m) per chunk
// (1F1B's peak).
MemoryEstimate estimate_memory(const RunConfig& cfg, int64_t bytes_per_param_compute,
                               const std::vector<std::vector<int64_t>>& held = {});

// What parallel.adapt's schedule re-plan may come to hold at most
// (parallel/adapt/schedule_choice.hpp): a split backward's buffers, and each
// chunk held on every rank as often as on the rank of `held` that holds it
// most (the re-plan's held-activations limit). With pp = 1: estimate_memory.
MemoryEstimate estimate_memory_replanned(const RunConfig& cfg, int64_t bytes_per_param_compute,
                                         const std::vector<std::vector<int64_t>>& held = {});

// A human-readable report (counts with thousands separators, sizes in GiB);
// with `replan` (estimate_memory_replanned of an adaptive pipelined run),
// a line with what a re-plan may hold when that is more.
std::string format_estimate(const RunConfig& cfg, const MemoryEstimate& e,
                            const MemoryEstimate* replan = nullptr);

// 68976648192 -> "68,976,648,192".
std::string with_thousands(int64_t n);

}  // namespace adgt
