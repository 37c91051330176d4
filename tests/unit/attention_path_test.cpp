// The CUDA backend's bf16 attention path rule (kernels/attention_path.hpp):
// which shapes the flash kernels take, why others fall back to the exact fp32
// kernel and what that costs, and --dry-run counting it (docs/cuda.md, "Silent slow paths").
#include <catch2/catch.hpp>

#include "core/config.hpp"
#include "kernels/attention_path.hpp"
#include "parallel/cost/memory.hpp"

using namespace adgt;
using Catch::Contains;

TEST_CASE("cuda attention path: flash shapes, fallbacks with their reason and scratch") {
  const AttentionShape flash{8, 4096, 32, 8, 128};
  CHECK(cuda_attention_path(flash).flash);
  CHECK(cuda_attention_path(flash).fallback_bytes == 0);
  CHECK(cuda_attention_path({2, 512, 16, 16, 64}).flash);

  const AttentionShape hd96{8, 4096, 32, 32, 96};
  const AttentionPath p = cuda_attention_path(hd96);
  CHECK_FALSE(p.flash);
  CHECK_THAT(p.reason, Contains("head_dim 96") && Contains("64 or 128"));
  // The backward's copies: dout, q, dq (3 nq), k, v, dk, dv (4 nk), one float per row.
  const int64_t nq = 8LL * 4096 * 32 * 96, nk = nq;
  CHECK(p.fallback_bytes == 4 * (3 * nq + 4 * nk + 8LL * 32 * 4096));

  CHECK_THAT(cuda_attention_path(flash, /*force_exact=*/true).reason, Contains("ADGT_ATTENTION=exact"));
  CHECK_THAT(cuda_attention_path({1, 64, 12, 8, 64}).reason, Contains("not a multiple"));
  CHECK_THAT(cuda_attention_path(flash, false, /*device_ok=*/false).reason, Contains("sm_80"));
  CHECK_THAT(cuda_attention_path(flash, false, true, /*aligned=*/false).reason, Contains("aligned"));
}

TEST_CASE("dry run: the bf16 attention fallback on CUDA is counted") {
  RunConfig cfg = load_config_text("model:\n  vocab_size: 32000\n  d_model: 3072\n  n_layers: 2\n"
                                   "  n_heads: 32\n  n_kv_heads: 32\n  ffn_hidden: 8192\n"
                                   "  seq_len: 4096\n"
                                   "train:\n  device: cuda\n  dtype: bf16\n  micro_batch: 1\n"
                                   "  global_batch: 1\n  warmup_steps: 1\n",
                                   "x.yaml");
  MemoryEstimate e = estimate_memory(cfg, compute_bytes_per_element(cfg));
  CHECK(e.bytes_attention_fallback > 0);
  CHECK_THAT(e.attention_fallback, Contains("head_dim 96"));
  CHECK(e.bytes_total == e.bytes_params + e.bytes_grads + e.bytes_optimizer + e.bytes_activations +
                             e.bytes_attention_fallback + e.bytes_scratch);
  CHECK_THAT(format_estimate(cfg, e), Contains("bf16 attention runs the exact kernel"));
  // head_dim 128: the flash kernels, nothing counted; on the CPU backend neither.
  cfg.model.d_model = 4096;
  CHECK(estimate_memory(cfg, 2).bytes_attention_fallback == 0);
  cfg.model.d_model = 3072;
  cfg.train.device = "cpu";
  CHECK(estimate_memory(cfg, 2).bytes_attention_fallback == 0);
}
