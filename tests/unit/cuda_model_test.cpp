// Whole training steps on the CUDA backend against the CPU backend, on the
// tiny config (configs/tiny.yaml), in fp32 and in bf16 mixed precision; and
// the 1.3B-parameter benchmark (hidden tag "[.cudabench]"), which
// scripts/device/check.sh runs next to the same model in PyTorch.
//
// Without a visible GPU the [cuda] cases WARN and pass (CI has no GPU).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "parallel/dp/grad_norm.hpp"
#include "parallel/dp/sharded_adamw.hpp"
#include "core/model/model.hpp"
#include "core/model/param_table.hpp"
#include "core/rng.hpp"
#include "kernels/attention_choice.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "tests/unit/rel_error.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/metrics/telemetry.hpp"
#include "parallel/metrics/telemetry_sources.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/step_sim.hpp"
#ifdef ADGT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

using namespace adgt;

namespace {

bool gpu_visible() { return cuda_device_count() > 0; }

std::string source_dir() {
  const char* src = std::getenv("ADGT_SOURCE_DIR");
  return src ? src : ADGT_SOURCE_DIR;
}

struct StepRun {
  std::vector<double> losses;  // one per step (the forward before each update)
  std::vector<double> grads;   // after the first backward
};

// `steps` training steps (forward, backward, clip at 1, AdamW) on fixed random
// batches; every backend and dtype sees the same tokens and initial weights.
StepRun train_steps(Backend& be, DType dt, const ModelConfig& m, int64_t B, int64_t T,
                    int steps, bool fp8 = false) {
  Model model(m, be, dt, B, T);
  model.init_weights(1234);
  if (fp8) {
    TrainConfig f;
    f.dtype = "fp8";
    model.enable_fp8(fp8_options(f), nullptr);
  }
  TrainConfig tc;
  ShardedAdamW opt(be, model, tc, nullptr);
  StepRun run;
  Rng r(99);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
    for (auto& x : in) x = int32_t(r.next() % uint64_t(m.vocab_size));
    for (size_t i = 0; i < tg.size(); ++i) tg[i] = i + 1 < in.size() ? in[i + 1] : -1;
    model.zero_grads();
    if (model.fp8()) model.fp8()->invalidate_weights();  // updated: cast again
    run.losses.push_back(model.forward(in.data(), tg.data(), 1.0));
    model.backward();
    if (s == 0) run.grads = model.grads_to_host_f64();
    const double gn = global_grad_norm(be, model.table(), model.grads(), 0, model.flat_size(), {});
    opt.step(1e-3, s + 1, clip_coefficient(gn, 1.0));
  }
  return run;
}

}  // namespace

TEST_CASE("cuda: training steps of the tiny config against the CPU backend (f32, bf16)",
          "[cuda]") {
  if (!gpu_visible()) {
    WARN("no CUDA device visible: CUDA-vs-CPU training step skipped");
    return;
  }
  auto gpu = make_backend("cuda");
  CpuBackend cpu;
  const RunConfig cfg = load_config(source_dir() + "/configs/tiny.yaml");
  ModelConfig hd32 = cfg.model;  // head_dim 32: the exact attention kernel (bf16 via fp32)
  ModelConfig hd64 = cfg.model;  // head_dim 64: the flash kernel in bf16
  hd64.n_heads = 4;
  hd64.n_kv_heads = 2;
  const int64_t B = 2, T = 256;
  for (const ModelConfig* m : {&hd32, &hd64}) {
    // fp32: cuBLAS in full fp32, so the CPU's numbers to rounding (tolerances
    // as the op tests: 1e-4 for GEMM-based results).
    {
      const StepRun c = train_steps(cpu, DType::F32, *m, B, T, 3),
                    g = train_steps(*gpu, DType::F32, *m, B, T, 3);
      for (size_t i = 0; i < c.losses.size(); ++i) {
        INFO("f32 hd " << m->head_dim() << " step " << i << " cpu " << c.losses[i] << " cuda "
                       << g.losses[i]);
        CHECK(std::abs(g.losses[i] - c.losses[i]) <= 1e-4 * c.losses[i]);
      }
      const double e = test::rel_fro(g.grads, c.grads);
      INFO("f32 hd " << m->head_dim() << " gradient relative error " << e);
      CHECK(e <= 1e-4);
    }
    // bf16: both backends follow the same mixed-precision contract but round
    // at different places (the flash kernel feeds P to the tensor cores in
    // bf16; the CPU keeps it in fp32), so the bounds are bf16-sized: the
    // CPU's own bf16-vs-f32 gap on a model this size is ~1e-2 in the
    // gradients and ~4e-4 in the loss (tests/unit/model_bf16_test.cpp).
    {
      const StepRun c = train_steps(cpu, DType::BF16, *m, B, T, 3),
                    g = train_steps(*gpu, DType::BF16, *m, B, T, 3);
      for (size_t i = 0; i < c.losses.size(); ++i) {
        INFO("bf16 hd " << m->head_dim() << " step " << i << " cpu " << c.losses[i] << " cuda "
                        << g.losses[i]);
        CHECK(std::isfinite(g.losses[i]));
        CHECK(std::abs(g.losses[i] - c.losses[i]) <= 1e-2 * c.losses[i]);
      }
      const double e = test::rel_fro(g.grads, c.grads);
      INFO("bf16 hd " << m->head_dim() << " gradient relative error " << e);
      CHECK(e <= 5e-2);
    }
  }
}

TEST_CASE("cuda: FP8 training steps of the tiny config against the CPU's emulation",
          "[cuda][fp8]") {
  if (!gpu_visible()) {
    WARN("no CUDA device visible: CUDA-vs-CPU FP8 training step skipped");
    return;
  }
  auto gpu = make_backend("cuda");
  if (!gpu->fp8_unsupported().empty()) {
    WARN(gpu->fp8_unsupported());
    return;
  }
  CpuBackend cpu;
  const RunConfig cfg = load_config(source_dir() + "/configs/tiny.yaml");
  ModelConfig m = cfg.model;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  const int64_t B = 2, T = 256;  // every GEMM dimension a multiple of 16: cuBLASLt's FP8 path
  // cuBLASLt's FP8 GEMMs against the CPU's dequantize-then-fp32 emulation:
  // the same products summed in another order, with bf16 activations that
  // differ as in the bf16 case above; an FP8 cast turns such a difference
  // into a whole FP8 step where a value sits near a rounding boundary (the
  // CPU layout test measures 6-8x bf16's spread, tests/layouts/compare_fp8.py),
  // so these bounds are the bf16 ones x2 (loss) and x3 (gradients). Not yet
  // measured on a GPU: the first GPU check records the figures.
  const StepRun c = train_steps(cpu, DType::BF16, m, B, T, 3, true),
                g = train_steps(*gpu, DType::BF16, m, B, T, 3, true);
  for (size_t i = 0; i < c.losses.size(); ++i) {
    INFO("fp8 step " << i << " cpu " << c.losses[i] << " cuda " << g.losses[i]);
    CHECK(std::isfinite(g.losses[i]));
    CHECK(std::abs(g.losses[i] - c.losses[i]) <= 2e-2 * c.losses[i]);
  }
  const double e = test::rel_fro(g.grads, c.grads);
  INFO("fp8 gradient relative error " << e);
  std::printf("cuda fp8 vs cpu emulation: loss step0 %.6g vs %.6g, gradient rel err %.3e\n",
              g.losses[0], c.losses[0], e);
  CHECK(e <= 1.5e-1);
}

// ---------------------------------------------------------------------------
// The issue-4 benchmark: a LLaMA-style ~1.3B model (d 2048, 24 layers, 16
// heads, ffn 5632, T 2048, V 32000) in bf16 mixed precision: whole training
// steps (forward, backward, gradient norm, AdamW + bf16 cast), tokens/s and
// MFU against 989 TFLOP/s (H100/H200 dense bf16) with the FLOP count
// adgt-train reports (parallel/cost/flops.cpp, PaLM convention:
// 6 N_matmul + 12 L H hd T per token). Knobs: ADGT_BENCH_BATCH (8),
// ADGT_BENCH_STEPS (10), ADGT_BENCH_LAYERS (24), ADGT_BENCH_JSON (a file for
// the figures), ADGT_BENCH_ATTENTION (train.attention: auto, the default, or
// flash, cudnn, exact; ADGT_ATTENTION still overrides it), ADGT_BENCH_FUSED
// (train.fused_projections: 1, the default, or 0), ADGT_BENCH_FP8 (1: the
// layers' linears in FP8, train.dtype fp8 with tensorwise scaling; MFU stays
// against the bf16 peak, as the TFLOP/s are model FLOPs either way).
TEST_CASE("cuda: 1.3B bf16 training-step benchmark", "[.cudabench][model]") {
  if (!gpu_visible()) {
    WARN("no CUDA device visible: benchmark skipped");
    return;
  }
  auto env = [](const char* k, int64_t d) {
    const char* v = std::getenv(k);
    return v ? int64_t(std::atoll(v)) : d;
  };
  ModelConfig m;
  m.vocab_size = 32000;
  m.d_model = 2048;
  m.n_layers = env("ADGT_BENCH_LAYERS", 24);
  m.n_heads = 16;
  m.n_kv_heads = 16;
  m.ffn_hidden = 5632;
  m.seq_len = 2048;
  m.init_std = 0.02;
  const int64_t B = env("ADGT_BENCH_BATCH", 8), T = 2048;
  const int steps = int(env("ADGT_BENCH_STEPS", 10));
  const char* attn_env = std::getenv("ADGT_BENCH_ATTENTION");
  const std::string attention = attn_env && *attn_env ? attn_env : "auto";
  const bool fused = env("ADGT_BENCH_FUSED", 1) != 0;
  const bool fp8 = env("ADGT_BENCH_FP8", 0) != 0;
  auto be = make_backend("cuda");
  configure_attention(*be, attention);
  Model model(m, *be, DType::BF16, B, T, {}, nullptr, {}, {}, fused);
  if (fp8) {
    if (!be->fp8_unsupported().empty()) {
      WARN(be->fp8_unsupported());
      return;
    }
    TrainConfig f;
    f.dtype = "fp8";
    model.enable_fp8(fp8_options(f), nullptr);
  }
  {
    // init_weights draws 1.4e9 normals on the host (~40 s); for timing, a
    // repeated 2^24-value N(0, 0.02) pattern with the norms at 1 does as well.
    const int64_t n = model.flat_size(), chunk = int64_t(1) << 24;
    std::vector<float> host(static_cast<size_t>(n)), pat(static_cast<size_t>(chunk));
    Rng r(1);
    for (auto& x : pat) x = float(0.02 * r.normal());
    for (int64_t o = 0; o < n; o += chunk)
      std::copy(pat.begin(), pat.begin() + std::min(chunk, n - o), host.begin() + o);
    for (const ParamSpec& p : model.table())
      if (p.shape.size() == 1) std::fill(host.begin() + p.offset, host.begin() + p.offset + p.numel, 1.0f);
    model.params_from_host(host);
  }
  TrainConfig tc;
  ShardedAdamW opt(*be, model, tc, nullptr);
  std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
  Rng r(3);
  for (auto& x : in) x = int32_t(r.next() % uint64_t(m.vocab_size));
  for (auto& x : tg) x = int32_t(r.next() % uint64_t(m.vocab_size));

  using clk = std::chrono::steady_clock;
  auto secs = [](clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::vector<double> t_step, t_fwd, t_bwd, t_opt;
  double loss = 0;
  // NVML over the timed steps (docs/telemetry.md; issue 48: the power, clocks,
  // temperature and energy per token of the 1.3B in the check's summary): GPU
  // index 0, the one device the check's machine has. Absent where NVML is.
  std::unique_ptr<TelemetrySampler> nvml;
  for (int s = 0; s < steps + 2; ++s) {  // 2 untimed warm-up steps
    be->synchronize();
    if (s == 2) {  // the sampler a CUDA rank of adgt-train opens (no UUID here: NVML index 0)
      DevicePlan plan;
      plan.device = "cuda";
      plan.device_id = "";
      plan.cuda_device = 0;
      nvml = make_telemetry_sampler(0.05, plan, /*lead=*/true);  // says what it reads, or why not
    }
    const auto t0 = clk::now();
    model.zero_grads();
    if (model.fp8()) model.fp8()->invalidate_weights();  // updated: cast once this step
    loss = model.forward(in.data(), tg.data(), 1.0);  // reads the loss: synchronises
    const auto t1 = clk::now();
    model.backward();
    be->synchronize();
    const auto t2 = clk::now();
    const double gn = global_grad_norm(*be, model.table(), model.grads(), 0, model.flat_size(), {});
    opt.step(3e-4, s + 1, clip_coefficient(gn, 1.0));
    be->synchronize();
    const auto t3 = clk::now();
    if (s < 2) continue;
    t_step.push_back(secs(t0, t3));
    t_fwd.push_back(secs(t0, t1));
    t_bwd.push_back(secs(t1, t2));
    t_opt.push_back(secs(t2, t3));
  }
  if (nvml) nvml->stop();  // its last reading closes the timed steps
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  int64_t n_matmul = 0, n_params = 0;
  for (const ParamSpec& p : build_param_table(m)) {
    n_params += p.numel;
    if (p.is_matrix) n_matmul += p.numel;
  }
  const double flops_tok = 6.0 * double(n_matmul) +
                           12.0 * double(m.n_layers) * double(m.n_heads) * double(m.head_dim()) *
                               double(T);
  std::string kernel = attention;  // under auto, the kernel it chose for this shape
#ifdef ADGT_HAVE_CUDA
  kernel = dynamic_cast<CudaBackend&>(*be).attention_kernel(
      AttentionShape{B, T, m.n_heads, m.n_kv_heads, m.head_dim()});
#endif
  const double st = median(t_step), tok_s = double(B * T) / st;
  const double tflops = flops_tok * tok_s / 1e12, mfu = tflops / 989.0;
  std::printf(
      "\nadgt 1.3B %s: %.3fB params, B=%lld T=%lld, loss %.4f, attention %s (train.attention=%s), "
      "fused projections %s\n"
      "| step ms %.1f | fwd ms %.1f | bwd ms %.1f | optimizer ms %.1f | tokens/s %.0f | "
      "%.1f TFLOP/s | MFU %.1f%% of 989 |\n",
      fp8 ? "fp8" : "bf16", double(n_params) / 1e9, (long long)B, (long long)T, loss, kernel.c_str(), attention.c_str(),
      fused ? "on" : "off", st * 1e3, median(t_fwd) * 1e3,
      median(t_bwd) * 1e3, median(t_opt) * 1e3, tok_s, tflops, 100 * mfu);
  // Measured against the power model: the timed steps' NVML energy over their
  // tokens, and the simulator's energy per token of the same step on the
  // preset of this GPU (dgx-h200 for an H200, else dgx-h100).
  double j_tok = -1, watts = -1, predicted_j_tok = -1;
  if (nvml) {
    const TelemetryInterval w = nvml->take();
    const TelemetryTotals tot = nvml->totals();
    const auto mean = [&](int g) { return w.gauge[g].n ? w.gauge[g].sum / double(w.gauge[g].n) : -1.0; };
    if (tot.has_energy) j_tok = tot.energy_j / double(int64_t(steps) * B * T);
    watts = mean(kPowerW);
    RunConfig rc;
    rc.model = m;
    rc.train.micro_batch = B;
    rc.train.global_batch = B;
    rc.train.dtype = fp8 ? "fp8" : "bf16";
    rc.train.device = "cuda";
    const bool h200 = be->name().find("H200") != std::string::npos;
    const cluster::Cluster cl = cluster::with_gpus(cluster::load_cluster(h200 ? "dgx-h200" : "dgx-h100"), 1);
    sim::DeviceModelCosts costs(cl.device);
    try {
      predicted_j_tok = sim::simulate_step(rc, cl, costs).energy_per_token_j;
    } catch (const std::exception& e) {  // the measurement still stands
      std::printf("power model: no prediction (%s)\n", e.what());
    }
    std::printf("| power W %.0f | SM clock MHz %.0f of %.0f | GPU temp C %.0f | memory temp C %.0f | "
                "energy %.4g J/token | the power model (%s) %.4g J/token: %+.1f%% (issue 48: within 15%%) |\n",
                watts, mean(kSmClockMhz), mean(kSmClockMaxMhz), mean(kGpuTempC), mean(kMemTempC), j_tok,
                cl.device.name.c_str(), predicted_j_tok,
                j_tok > 0 && predicted_j_tok > 0 ? 100 * (predicted_j_tok / j_tok - 1) : 0.0);
  }
  std::fflush(stdout);
  if (const char* path = std::getenv("ADGT_BENCH_JSON")) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fprintf(f,
                   "{\"impl\": \"%s\", \"params\": %lld, \"batch\": %lld, \"seq\": %lld, "
                   "\"step_ms\": %.3f, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"opt_ms\": %.3f, "
                   "\"tokens_per_s\": %.1f, \"tflops\": %.2f, \"mfu\": %.4f, \"loss\": %.5f, "
                   "\"attention\": \"%s\", \"attention_setting\": \"%s\", \"fused\": %s}\n",
                   fp8 ? "adgt-fp8" : "adgt", (long long)n_params, (long long)B, (long long)T,
                   st * 1e3,
                   median(t_fwd) * 1e3, median(t_bwd) * 1e3, median(t_opt) * 1e3, tok_s, tflops,
                   mfu, loss, kernel.c_str(), attention.c_str(), fused ? "true" : "false");
      std::fclose(f);
    }
  }
  CHECK(std::isfinite(loss));
}
