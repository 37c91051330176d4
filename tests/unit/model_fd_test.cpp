// The whole model's parameter gradients against central finite differences,
// in double precision on the CPU backend (tied and untied heads, GQA, ignored targets).
#include <catch2/catch.hpp>

#include <cmath>

#include "core/model/model.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;

namespace {
void check_model_gradients(bool tied) {
  ModelConfig m;
  m.vocab_size = 11;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.ffn_hidden = 12;
  m.seq_len = 5;
  m.tie_embeddings = tied;
  m.init_std = 0.5;  // large enough that every path carries signal
  CpuBackend be;
  const int64_t B = 2, T = 5;
  Model model(m, be, DType::F64, B, T);
  model.init_weights(42);
  // Perturb the norm weights away from 1 so their gradients are generic.
  {
    std::vector<float> p = model.params_to_host();
    Rng r(7);
    for (auto& x : p) x += float(0.1 * r.normal());
    model.params_from_host(p);
  }
  std::vector<int32_t> in(B * T), tg(B * T);
  Rng r(3);
  for (int64_t i = 0; i < B * T; ++i) {
    in[i] = int32_t(r.next() % 11);
    tg[i] = int32_t(r.next() % 11);
  }
  tg[3] = -1;  // ignored target
  model.zero_grads();
  const double loss0 = model.forward(in.data(), tg.data(), 1.0);
  REQUIRE(std::isfinite(loss0));
  model.backward();
  const std::vector<double> g = model.grads_to_host_f64();

  double* p = model.params().ptr<double>();
  const double h = 1e-6;
  for (const ParamSpec& s : model.table()) {
    double max_err = 0, max_ref = 0;
    for (int64_t j = 0; j < s.numel; ++j) {
      double& x = p[s.offset + j];
      const double old = x;
      x = old + h;
      const double lp = model.forward(in.data(), tg.data(), 1.0);
      x = old - h;
      const double lm = model.forward(in.data(), tg.data(), 1.0);
      x = old;
      const double num = (lp - lm) / (2 * h);
      max_err = std::max(max_err, std::abs(num - g[size_t(s.offset + j)]));
      max_ref = std::max(max_ref, std::abs(num));
    }
    INFO(s.name << ": max abs err " << max_err << ", max |grad| " << max_ref);
    CHECK(max_ref > 0);
    CHECK(max_err <= 1e-7 * std::max(1.0, max_ref));
  }
}
}  // namespace

TEST_CASE("model gradients match finite differences (untied head)", "[model][fd][slow]") {
  check_model_gradients(false);
}
TEST_CASE("model gradients match finite differences (tied head)", "[model][fd][slow]") {
  check_model_gradients(true);
}
