// Mixed precision (train.dtype: bf16) in the model and optimizer, on the CPU
// backend: bf16 weights and activations derived from fp32 master weights,
// fp32 gradients, the fused AdamW + cast, and how far a bf16 model's loss and
// gradients are from the fp32 model's on the same (bf16-representable) weights.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/dp/grad_norm.hpp"
#include "parallel/dp/sharded_adamw.hpp"
#include "core/model/model.hpp"
#include "core/rng.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;

namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 96;
  m.d_model = 64;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 128;
  m.seq_len = 32;
  m.init_std = 0.05;
  return m;
}

struct Batch {
  std::vector<int32_t> in, tg;
};
Batch make_batch(int64_t n, int64_t vocab, uint64_t seed) {
  Batch b;
  Rng r(seed);
  for (int64_t i = 0; i < n; ++i) {
    b.in.push_back(int32_t(r.next() % uint64_t(vocab)));
    b.tg.push_back(int32_t(r.next() % uint64_t(vocab)));
  }
  b.tg[3] = -1;  // an ignored target
  return b;
}

std::vector<bf16_bits> host_bf16(Backend& be, const Tensor& t) {
  std::vector<bf16_bits> h(size_t(t.numel()));
  be.to_host(h.data(), t.data, h.size() * 2);
  return h;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

TEST_CASE("bf16 model: fp32 master weights, bf16 params are their rounding, fp32 grads",
          "[bf16][model]") {
  CpuBackend be;
  const ModelConfig m = small_model();
  Model f32(m, be, DType::F32, 2, 16), b16(m, be, DType::BF16, 2, 16);
  f32.init_weights(5);
  b16.init_weights(5);
  CHECK(b16.mixed());
  CHECK_FALSE(f32.mixed());
  CHECK(b16.params().dtype == DType::BF16);
  CHECK(b16.master().dtype == DType::F32);
  CHECK(b16.grads().dtype == DType::F32);
  CHECK(b16.grad(1).dtype == DType::F32);
  CHECK(b16.param(1).dtype == DType::BF16);
  // The master holds the same fp32 initialisation as the fp32 model.
  const std::vector<float> mf = f32.params_to_host(), mb = b16.params_to_host();
  REQUIRE(mf.size() == mb.size());
  CHECK(mf == mb);
  // The compute copy is the master rounded to nearest even, element by element.
  const std::vector<bf16_bits> p = host_bf16(be, b16.params());
  size_t bad = 0;
  for (size_t i = 0; i < p.size(); ++i) bad += p[i] != float_to_bf16(mb[i]);
  CHECK(bad == 0);
  // And a loaded master (a checkpoint) refreshes it.
  std::vector<float> w = mb;
  for (float& x : w) x *= 1.5f;
  b16.params_from_host(w);
  CHECK(b16.params_to_host() == w);
  const std::vector<bf16_bits> p2 = host_bf16(be, b16.params());
  bad = 0;
  for (size_t i = 0; i < p2.size(); ++i) bad += p2[i] != float_to_bf16(w[i]);
  CHECK(bad == 0);
}

TEST_CASE("bf16 model: loss and gradients close to the fp32 model on the same weights",
          "[bf16][model]") {
  CpuBackend be;
  const ModelConfig m = small_model();
  const int64_t B = 2, T = 32;
  Model f32(m, be, DType::F32, B, T), b16(m, be, DType::BF16, B, T);
  b16.init_weights(11);
  // Both models compute with the same bf16-representable weights.
  f32.params_from_host(rounded(b16.params_to_host()));
  const Batch bt = make_batch(B * T, m.vocab_size, 17);
  f32.zero_grads();
  b16.zero_grads();
  const double lf = f32.forward(bt.in.data(), bt.tg.data(), 1.0);
  const double lb = b16.forward(bt.in.data(), bt.tg.data(), 1.0);
  f32.backward();
  b16.backward();
  // Measured with this model: loss 3.2e-7 relative (a mean over 63 tokens: the
  // roundings average out), gradients 6.9e-3 relative
  // overall and 1.1e-2 for the worst tensor (bf16 has an 8-bit significand:
  // 2^-9 = 2e-3 per rounding, and activation gradients are rounded at every op
  // of 2 layers). The gradient bounds are ~4x the measured values, the loss's 30x: a wrong dtype
  // reading (bf16 bits as f32), a statistic or gradient kept in bf16 or a
  // skipped op moves them by far more.
  INFO("loss f32 " << lf << " bf16 " << lb << " relative gap " << std::abs(lb - lf) / lf);
  CHECK(std::abs(lb - lf) / lf < 1e-5);
  const std::vector<double> gf = f32.grads_to_host_f64(), gb = b16.grads_to_host_f64();
  const double e_all = rel(gb, gf);
  INFO("gradient relative error " << e_all);
  CHECK(e_all < 3e-2);
  for (const ParamSpec& s : f32.table()) {
    std::vector<double> a(gb.begin() + s.offset, gb.begin() + s.offset + s.numel),
        b(gf.begin() + s.offset, gf.begin() + s.offset + s.numel);
    INFO(s.name << " relative error " << rel(a, b));
    CHECK(rel(a, b) < 5e-2);
  }
}

TEST_CASE("bf16 model: the AdamW step updates the fp32 master and rounds the copy once",
          "[bf16][model]") {
  CpuBackend be;
  const ModelConfig m = small_model();
  const int64_t B = 2, T = 16;
  Model b16(m, be, DType::BF16, B, T);
  b16.init_weights(3);
  TrainConfig tc;
  tc.lr = 1e-2;
  tc.weight_decay = 0.1;
  ShardedAdamW opt(be, b16, tc, nullptr);
  const Batch bt = make_batch(B * T, m.vocab_size, 23);
  b16.zero_grads();
  b16.forward(bt.in.data(), bt.tg.data(), 1.0);
  b16.backward();
  // The reference: the same AdamW on an fp32 copy of the master and gradients.
  const int64_t n = b16.flat_size();
  const std::vector<float> master = b16.params_to_host();
  std::vector<float> grads(static_cast<size_t>(n));
  be.to_host(grads.data(), b16.grads().data, size_t(n) * 4);
  Buffer mb(be, size_t(n) * 4), gb(be, size_t(n) * 4);
  be.to_device(mb.data(), master.data(), size_t(n) * 4);
  be.to_device(gb.data(), grads.data(), size_t(n) * 4);
  AdamW ref(be, b16.table(), tc, DType::F32);
  ref.step(Tensor(mb.data(), DType::F32, {n}), Tensor(gb.data(), DType::F32, {n}), 1e-2, 1);
  std::vector<float> want(static_cast<size_t>(n));
  be.to_host(want.data(), mb.data(), size_t(n) * 4);

  opt.step(1e-2, 1, 1.0);
  const std::vector<float> got = b16.params_to_host();
  CHECK(got == want);
  CHECK(got != master);
  const std::vector<bf16_bits> p = host_bf16(be, b16.params());
  size_t bad = 0;
  for (size_t i = 0; i < p.size(); ++i) bad += p[i] != float_to_bf16(got[i]);
  CHECK(bad == 0);
}

TEST_CASE("AdamW clips as it reads each gradient: the update of scaling the gradients first, "
          "the gradient buffer left unscaled", "[model][optimizer]") {
  // The clip coefficient went from a separate scale pass over the gradients
  // into AdamW's read (AdamWHyper::grad_scale). Reference: the old order,
  // scale_inplace then AdamW, on copies. Two steps with different
  // coefficients (one AdamW step alone does not depend on a gradient's scale).
  CpuBackend be;
  const ModelConfig m = small_model();
  const int64_t B = 2, T = 16;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    INFO("dtype " << dtype_name(dt));
    Model model(m, be, dt, B, T);
    model.init_weights(5);
    TrainConfig tc;
    tc.lr = 1e-2;
    tc.weight_decay = 0.1;
    ShardedAdamW opt(be, model, tc, nullptr);
    const int64_t n = model.flat_size();
    const DType mdt = model.master_dtype();
    const size_t bytes = size_t(n) * dtype_size(mdt);
    Buffer mb(be, bytes), gb(be, bytes);
    be.copy(Tensor(mb.data(), mdt, {n}), model.master());
    AdamW ref(be, model.table(), tc, mdt);
    const double coef[2] = {0.8, 0.3};
    for (int s = 0; s < 2; ++s) {
      model.zero_grads();
      const Batch bt = make_batch(B * T, m.vocab_size, 40 + uint64_t(s));
      model.forward(bt.in.data(), bt.tg.data(), 1.0);
      model.backward();
      const std::vector<double> g0 = model.grads_to_host_f64();
      be.copy(Tensor(gb.data(), mdt, {n}), model.grads());
      be.scale_inplace(Tensor(gb.data(), mdt, {n}), coef[s]);
      ref.step(Tensor(mb.data(), mdt, {n}), Tensor(gb.data(), mdt, {n}), 1e-2, s + 1);
      opt.step(1e-2, s + 1, coef[s]);
      CHECK(model.grads_to_host_f64() == g0);  // unscaled
    }
    std::vector<double> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    {
      Buffer w(be, size_t(n) * 8), g(be, size_t(n) * 8);
      be.cast(Tensor(w.data(), DType::F64, {n}), Tensor(mb.data(), mdt, {n}));
      be.cast(Tensor(g.data(), DType::F64, {n}), model.master());
      be.to_host(want.data(), w.data(), size_t(n) * 8);
      be.to_host(got.data(), g.data(), size_t(n) * 8);
    }
    // The same products, at most rounded differently where the compiler
    // fuses g * scale into the moment's update (one rounding of the working
    // precision in m and v, a few of it in p).
    const double tol = mdt == DType::F64 ? 1e-14 : 1e-6;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - want[i]) / (std::fabs(want[i]) + 1e-3));
    INFO("worst relative difference " << worst);
    CHECK(worst <= tol);
  }
}

namespace {
// Overfits one batch for 30 steps in f32 and in bf16 from the same weights.
struct OverfitRun {
  double first_f = 0, first_b = 0, last_f = 0, last_b = 0;
  double worst = 0;  // largest relative gap between the two runs' losses
};
OverfitRun overfit_f32_and_bf16(const ModelConfig& m, uint64_t batch_seed, bool check_grads_f32) {
  CpuBackend be;
  const int64_t B = 2, T = 32;
  Model f32(m, be, DType::F32, B, T), b16(m, be, DType::BF16, B, T);
  if (check_grads_f32) CHECK(b16.grads().dtype == DType::F32);
  f32.init_weights(9);
  b16.init_weights(9);
  TrainConfig tc;
  tc.weight_decay = 0.0;
  ShardedAdamW of(be, f32, tc, nullptr), ob(be, b16, tc, nullptr);
  const Batch bt = make_batch(B * T, m.vocab_size, batch_seed);
  OverfitRun r;
  for (int s = 0; s < 30; ++s) {
    f32.zero_grads();
    b16.zero_grads();
    const double lf = f32.forward(bt.in.data(), bt.tg.data(), 1.0);
    const double lb = b16.forward(bt.in.data(), bt.tg.data(), 1.0);
    f32.backward();
    b16.backward();
    of.step(3e-3, s + 1, 1.0);
    ob.step(3e-3, s + 1, 1.0);
    if (s == 0) r.first_f = lf, r.first_b = lb;
    r.last_f = lf;
    r.last_b = lb;
    r.worst = std::max(r.worst, std::abs(lb - lf) / lf);
  }
  INFO("f32 " << r.first_f << " -> " << r.last_f << ", bf16 " << r.first_b << " -> " << r.last_b
              << ", worst relative gap " << r.worst);
  CHECK(r.last_f < 0.7 * r.first_f);
  CHECK(r.last_b < 0.7 * r.first_b);
  return r;
}
}  // namespace

TEST_CASE("bf16 model: training follows the fp32 run", "[bf16][model][slow]") {
  // Overfitting one batch for 30 steps: the bf16 run's losses stay within 2%
  // of the fp32 run's (measured: 0.4% at most) and fall as far.
  const OverfitRun r = overfit_f32_and_bf16(small_model(), 29, false);
  INFO("worst relative gap " << r.worst);
  CHECK(r.worst < 0.02);
}

TEST_CASE("bf16 model: a mixture-of-experts model trains like the fp32 one", "[bf16][model][slow]") {
  // 4 experts, top-2, the same: bound 4x the worst gap measured when this test
  // was written (1.07%; the dense model's is 0.4%, routing near-ties in bf16
  // add the rest); the gradients are fp32.
  ModelConfig m = small_model();
  m.n_experts = 4;
  m.moe_top_k = 2;
  const OverfitRun r = overfit_f32_and_bf16(m, 31, true);
  INFO("worst relative gap " << r.worst);
  CHECK(r.worst < 0.043);
}
