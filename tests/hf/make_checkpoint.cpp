// Helper for tests/hf/hf_check.py: writes an adgt checkpoint with known,
// deterministic weights for the model of a YAML run file.
//
//   adgt_hf_fixture <config.yaml> <root> <step> [section.key=value ...]
//
// Linear weights and embeddings ~ N(0, 0.05), norm weights 1 + N(0, 0.2), MoE
// routers (block_sparse_moe.gate) ~ N(0, 0.5) so that each token's top-k
// experts are chosen by clear margins (an fp32 and an fp64 forward pick the
// same ones), each tensor from its own stream keyed by its name; the first five entries of
// model.layers.0.input_layernorm.weight are bfloat16 rounding cases (two exact
// ties, one just above and one just below a tie, a negative tie), so the bf16
// export check sees round-to-nearest-even at work. AdamW moments are non-zero
// (exp_avg = 1e-3 * w, exp_avg_sq = 1e-4 * w^2) so an import that forgot to
// zero them would show. Prints the step directory.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/config.hpp"
#include "core/rng.hpp"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " <config.yaml> <root> <step> [section.key=value ...]\n";
    return 2;
  }
  try {
    const std::vector<std::string> overrides(argv + 4, argv + argc);
    const adgt::RunConfig cfg = adgt::load_config(argv[1], overrides);
    adgt::CheckpointState st;
    st.step = std::atoll(argv[3]);
    st.samples_seen = st.step * cfg.train.global_batch;
    st.seed = cfg.train.seed;
    st.config_yaml = adgt::to_yaml(cfg);
    st.rng_state = {uint64_t(st.step)};
    st.specs = adgt::build_param_table(cfg.model);
    const auto n = size_t(adgt::total_numel(st.specs));
    st.params.assign(n, 0.0f);
    st.exp_avg.assign(n, 0.0f);
    st.exp_avg_sq.assign(n, 0.0f);
    for (const adgt::ParamSpec& p : st.specs) {
      adgt::Rng rng(cfg.train.seed ^ adgt::hash_string(p.name));
      const bool norm = p.global_shape.size() == 1;
      float* w = st.params.data() + p.offset;
      for (int64_t i = 0; i < p.numel; ++i)
        w[i] = norm ? float(1.0 + 0.2 * rng.normal()) : float((p.is_router ? 0.5 : 0.05) * rng.normal());
      if (p.name == "model.layers.0.input_layernorm.weight" && p.numel >= 5) {
        w[0] = 1.0f + 0x1p-8f;                  // tie: bf16 1.0 (even)
        w[1] = 1.0f + 3 * 0x1p-8f;              // tie: bf16 1 + 2^-6 (even)
        w[2] = 1.0f + 0x1p-8f + 0x1p-20f;       // above the tie: up
        w[3] = 1.0f + 0x1p-8f - 0x1p-20f;       // below the tie: down
        w[4] = -(1.0f + 0x1p-8f);               // negative tie: -1.0
      }
      for (int64_t i = 0; i < p.numel; ++i) {
        st.exp_avg[size_t(p.offset + i)] = 1e-3f * w[i];
        st.exp_avg_sq[size_t(p.offset + i)] = 1e-4f * w[i] * w[i];
      }
    }
    std::cout << adgt::save_checkpoint(argv[2], st, 0) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
