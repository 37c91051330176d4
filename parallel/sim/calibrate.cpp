// The profile's in-situ factor (profile.hpp ProfileCosts::calibrate;
// docs/simulator.md, "Cost tables").
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <omp.h>

#include "core/layout.hpp"
#include "core/model/model.hpp"
#include "core/rng.hpp"
#include "kernels/clock.hpp"
#include "parallel/sim/profile.hpp"
#include "parallel/sim/work.hpp"

namespace adgt::sim {
namespace {

DType dtype_of_run(const RunConfig& cfg) {
  return cfg.train.dtype == "f64" ? DType::F64 : bf16_compute(cfg.train) ? DType::BF16 : DType::F32;
}

// The run on one rank: the whole model, one micro-batch per step.
RunConfig one_rank(const RunConfig& cfg) {
  RunConfig c = cfg;
  Layout l;  // tp = pp = dp = ep = 1
  c.parallel = with_layout(cfg.parallel, l);
  c.parallel.sequence_parallel = false;
  c.parallel.zero = 0;
  c.parallel.virtual_stages = 1;
  c.parallel.expert_placement.clear();
  c.parallel.stage_layers.clear();
  c.train.global_batch = c.train.micro_batch;
  return c;
}

// The factor's key in the cache: the one-rank run's model and micro-batch.
std::string calibrate_signature(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  char sig[320];
  std::snprintf(sig, sizeof sig,
                "in_situ v%ld d%ld L%ld h%ld kv%ld f%ld E%ld/%ld/%ld/%ld mb%ld T%ld rc=%s/%ld fused%d",
                long(m.vocab_size), long(m.d_model), long(m.n_layers), long(m.n_heads),
                long(m.n_kv_heads), long(m.ffn_hidden), long(m.n_experts), long(m.moe_top_k),
                long(m.moe_every), long(m.expert_ffn()),
                long(cfg.train.micro_batch), long(m.seq_len), cfg.train.recompute.c_str(),
                long(cfg.train.recompute_layers), int(cfg.train.fused_projections));
  return sig;
}

}  // namespace

bool ProfileCosts::calibrated(const RunConfig& run) const {
  if (!be_.is_host() || flop_rate_ > 0) return true;
  const RunConfig cfg = one_rank(run);
  return table_.count(key_prefix(dtype_of_run(cfg)) + calibrate_signature(cfg)) > 0;
}

double ProfileCosts::calibrate(const RunConfig& run) {
  scale_ = 1;
  if (!be_.is_host() || flop_rate_ > 0) return 1;
  const RunConfig cfg = one_rank(run);
  const int bytes = compute_bytes(cfg);
  const RankWork w = rank_work(cfg, 0);
  // Larger models than a CPU rank trains here: the ops alone.
  if (w.param_elems > kCalibrateMaxParams || w.chunks.empty()) return 1;
  const ModelConfig& m = cfg.model;
  const std::string key = key_prefix(dtype_of_run(cfg)) + calibrate_signature(cfg);
  if (auto it = table_.find(key); it != table_.end()) return scale_ = it->second;
  announce();

  // The profile's sum for one micro-batch's forward and backward.
  double summed = 0;
  const StageWork& s = w.chunks.front();
  for (const PassWork* pass : {&s.forward, &s.backward})
    for (const Piece& p : pass->pieces)
      for (const Op& op : p.ops) summed += seconds(op, bytes);
  if (!(summed > 0)) return 1;

  // The same micro-batch run by the model, timed as the ops are (the
  // thread's CPU time on one thread, else wall time); the fastest of the
  // rounds, as for an op.
  Model model(m, be_, dtype_of_run(cfg), cfg.train.micro_batch, m.seq_len, {}, nullptr, {},
              RecomputePolicy{parse_recompute(cfg.train.recompute), cfg.train.recompute_layers},
              cfg.train.fused_projections);
  model.init_weights(1);
  std::vector<int32_t> in(size_t(cfg.train.micro_batch * m.seq_len)), tg(in.size());
  Rng r(3);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = int32_t(r.next() % uint64_t(m.vocab_size));
    tg[i] = int32_t(r.next() % uint64_t(m.vocab_size));
  }
  const auto now = [cpu = cpu_time()] {
    return cpu ? thread_cpu_seconds() : wall_seconds();
  };
  const auto pass = [&] {
    model.zero_grads();
    (void)model.forward(in.data(), tg.data(), 1.0);
    model.backward();
    be_.synchronize();
  };
  pass();  // warm-up: first touch
  double best = 0;
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    const double t0 = now();
    pass();
    const double t = now() - t0;
    if (round == 0 || t < best) best = t;
  }
  scale_ = best / summed;
  table_[key] = scale_;
  dirty_ = true;
  return scale_;
}

}  // namespace adgt::sim
