// Helper for tests/checkpoint_h5py_check.py: writes checkpoints with known
// values for h5py to read, and loads checkpoints that h5py wrote.
//
//   adgt_checkpoint_fixture write <root> <step> <keep>
//       tiny model (config below); tensor k of the parameter table (HF order),
//       element i in C order: param = float(k + i*0.001), exp_avg = -param,
//       exp_avg_sq = float(param_double^2); flat-buffer padding = 12345.
//   adgt_checkpoint_fixture load <step_dir> <out.bin>
//       loads with the same model's table; writes params, exp_avg, exp_avg_sq
//       of every tensor back to back (table order, no padding) as float32 to
//       out.bin and prints the meta fields as JSON.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"

namespace {

constexpr const char* kConfigYaml =
    "model:\n  vocab_size: 64\n  d_model: 16\n  n_layers: 2\n  n_heads: 4\n  n_kv_heads: 2\n"
    "  ffn_hidden: 40\n  tie_embeddings: false\n";

adgt::ModelConfig model() {
  adgt::ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.tie_embeddings = false;
  return m;
}

int write(const std::string& root, int64_t step, int64_t keep) {
  adgt::CheckpointState st;
  st.step = step;
  st.samples_seen = step * 8;
  st.seed = 0xDEADBEEFCAFEF00Dull;
  st.config_yaml = kConfigYaml;
  st.rng_state = {static_cast<uint64_t>(step), 42, 0xFFFFFFFFFFFFFFFFull};
  st.specs = adgt::build_param_table(model());
  const auto n = static_cast<size_t>(adgt::total_numel(st.specs));
  st.params.assign(n, 12345.0f);
  st.exp_avg.assign(n, 12345.0f);
  st.exp_avg_sq.assign(n, 12345.0f);
  for (size_t k = 0; k < st.specs.size(); ++k) {
    const adgt::ParamSpec& p = st.specs[k];
    for (int64_t i = 0; i < p.numel; ++i) {
      const double v = static_cast<double>(k) + static_cast<double>(i) * 0.001;
      const auto at = static_cast<size_t>(p.offset + i);
      st.params[at] = static_cast<float>(v);
      st.exp_avg[at] = static_cast<float>(-v);
      st.exp_avg_sq[at] = static_cast<float>(v * v);
    }
  }
  std::cout << adgt::save_checkpoint(root, st, keep) << "\n";
  return 0;
}

int load(const std::string& dir, const std::string& out) {
  const auto specs = adgt::build_param_table(model());
  const adgt::CheckpointState st = adgt::load_checkpoint(dir, specs);
  std::ofstream f(out, std::ios::binary);
  for (const auto* buf : {&st.params, &st.exp_avg, &st.exp_avg_sq})
    for (const adgt::ParamSpec& p : specs)
      f.write(reinterpret_cast<const char*>(buf->data() + p.offset),
              static_cast<std::streamsize>(p.numel * sizeof(float)));
  nlohmann::json j;
  j["step"] = st.step;
  j["samples_seen"] = st.samples_seen;
  j["seed"] = st.seed;
  j["config_yaml"] = st.config_yaml;
  j["rng_state"] = st.rng_state;
  std::cout << j.dump() << "\n";
  return f.good() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 5) return write(argv[2], std::atoll(argv[3]), std::atoll(argv[4]));
    if (mode == "load" && argc == 4) return load(argv[2], argv[3]);
    std::cerr << "usage: " << argv[0] << " write <root> <step> <keep> | load <step_dir> <out.bin>\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
