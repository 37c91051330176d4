// adgt-reference-dump: runs the model and optimizer on random tokens and
// writes everything an independent implementation needs to check them
// (tests/torch/compare_reference.py): initial weights, the batches, logits,
// loss and gradients of the first batch, and the losses, learning rates,
// gradient norms and final weights of S AdamW steps.
//
// --checkpoint STEP_DIR starts from an adgt checkpoint's weights instead of the
// seeded initialisation (the HuggingFace export test compares its logits).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.hpp"
#include "core/config.hpp"
#include "parallel/dp/grad_norm.hpp"
#include "parallel/dp/sharded_adamw.hpp"
#include "core/checkpoint/hdf5_util.hpp"
#include "core/model/model.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"
#include "core/model/shard_io.hpp"
#include "kernels/backend.hpp"

using namespace adgt;

namespace {

h5::Id make_group(hid_t parent, const char* name) {
  return h5::Id(ADGT_H5(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                H5Gclose);
}

void write(hid_t loc, const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
           const void* data) {
  h5::Id space(ADGT_H5(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  h5::Id ds(ADGT_H5(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT)),
            H5Dclose);
  ADGT_H5(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

// Writes every parameter-shaped slice of `flat` (double) under `group`, as the
// model's dtype.
void write_params(hid_t group, const Model& m, const std::vector<double>& flat) {
  for (const ParamSpec& p : m.table()) {
    std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
    if (m.dtype() == DType::F64) {
      write(group, p.name, H5T_NATIVE_DOUBLE, dims, flat.data() + p.offset);
    } else {
      std::vector<float> f(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
      write(group, p.name, H5T_NATIVE_FLOAT, dims, f.data());
    }
  }
}

std::vector<double> to_f64(const Model& m, const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  if (m.dtype() == DType::F64) {
    std::copy(t.ptr<double>(), t.ptr<double>() + t.numel(), out.begin());
  } else {
    std::copy(t.ptr<float>(), t.ptr<float>() + t.numel(), out.begin());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-reference-dump: model and optimizer outputs for an independent check"};
  std::string config_path, out_path, dtype = "f32", checkpoint;
  int64_t steps = -1;
  app.add_option("--config", config_path, "YAML run file")->required();
  app.add_option("--out", out_path, "output HDF5 file")->required();
  app.add_option("--dtype", dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--steps", steps, "AdamW steps (default: train.steps)");
  app.add_option("--checkpoint", checkpoint,
                 "load the weights from this checkpoint step directory instead of initialising them");
  CLI11_PARSE(app, argc, argv);
  try {
    RunConfig cfg = load_config(config_path);
    if (steps > 0) cfg.train.steps = steps;
    const int64_t S = cfg.train.steps, B = cfg.train.micro_batch, T = cfg.model.seq_len;
    auto be = make_backend("cpu");
    Model model(cfg.model, *be, dtype == "f64" ? DType::F64 : DType::F32, B, T);
    model.init_weights(cfg.train.seed);
    if (!checkpoint.empty()) {
      const auto global = build_param_table(cfg.model);
      const CheckpointState st = load_checkpoint(checkpoint, global);
      model.params_from_host(global_to_local(model.table(), global, st.params, model.flat_size()));
    }
    // The trainer's own optimizer path (gradient norm by tensor, clipping by
    // coefficient, AdamW) with single-rank groups.
    ShardedAdamW opt(*be, model, cfg.train, nullptr);

    std::vector<int32_t> tokens(size_t(S * B * (T + 1)));
    Rng rng(cfg.train.seed + 17);
    for (auto& t : tokens) t = int32_t(rng.next() % uint64_t(cfg.model.vocab_size));
    auto batch = [&](int64_t s, std::vector<int32_t>& in, std::vector<int32_t>& tg) {
      in.resize(size_t(B * T));
      tg.resize(size_t(B * T));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const int32_t* w = tokens.data() + (s * B + b) * (T + 1);
          in[size_t(b * T + t)] = w[t];
          tg[size_t(b * T + t)] = w[t + 1];
        }
    };

    h5::Id file(ADGT_H5(H5Fcreate(out_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)),
                H5Fclose);
    nlohmann::json cj;
    const ModelConfig& m = cfg.model;
    const TrainConfig& t = cfg.train;
    cj["model"] = {{"vocab_size", m.vocab_size}, {"d_model", m.d_model},
                   {"n_layers", m.n_layers},     {"n_heads", m.n_heads},
                   {"n_kv_heads", m.n_kv_heads}, {"ffn_hidden", m.ffn_hidden},
                   {"seq_len", m.seq_len},       {"rope_theta", m.rope_theta},
                   {"norm_eps", m.norm_eps},     {"tie_embeddings", m.tie_embeddings}};
    cj["train"] = {{"micro_batch", B},
                   {"lr", t.lr},
                   {"min_lr", t.min_lr},
                   {"warmup_steps", t.warmup_steps},
                   {"steps", S},
                   {"weight_decay", t.weight_decay},
                   {"decay_norms_and_embeddings", t.decay_norms_and_embeddings},
                   {"beta1", t.beta1},
                   {"beta2", t.beta2},
                   {"eps", t.eps},
                   {"grad_clip", t.grad_clip}};
    cj["dtype"] = dtype;
    {
      const std::string s = cj.dump();
      h5::Id str(ADGT_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
      ADGT_H5(H5Tset_size(str, s.size()));
      h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
      h5::Id attr(ADGT_H5(H5Acreate2(file, "config_json", str, space, H5P_DEFAULT, H5P_DEFAULT)),
                  H5Aclose);
      ADGT_H5(H5Awrite(attr, str, s.data()));
    }
    {
      h5::Id g = make_group(file, "model");
      write_params(g, model, to_f64(model, model.params()));
      h5::Id gb = make_group(file, "batch");
      write(gb, "tokens", H5T_NATIVE_INT32,
            {hsize_t(S), hsize_t(B), hsize_t(T + 1)}, tokens.data());
    }
    std::vector<int32_t> in, tg;
    {
      batch(0, in, tg);
      model.set_capture_logits(true);
      model.zero_grads();
      const double loss = model.forward(in.data(), tg.data(), 1.0);
      model.backward();
      model.set_capture_logits(false);
      h5::Id g = make_group(file, "step0");
      const auto& lg = model.captured_logits();
      write(g, "logits", H5T_NATIVE_DOUBLE, {hsize_t(B * T), hsize_t(m.vocab_size)}, lg.data());
      write(g, "loss", H5T_NATIVE_DOUBLE, {}, &loss);
      h5::Id gg = make_group(file, "grad");
      write_params(gg, model, model.grads_to_host_f64());
    }
    std::vector<double> losses, lrs, norms;
    for (int64_t s = 0; s < S; ++s) {
      batch(s, in, tg);
      model.zero_grads();
      losses.push_back(model.forward(in.data(), tg.data(), 1.0));
      model.backward();
      const double gn =
          global_grad_norm(*be, model.table(), model.grads(), 0, model.flat_size(), {});
      lrs.push_back(lr_at(t, s));
      norms.push_back(gn);
      opt.step(lrs.back(), s + 1, clip_coefficient(gn, t.grad_clip));
      std::printf("step %ld loss %.8f lr %.6e gnorm %.6f\n", long(s), losses.back(), lrs.back(),
                  gn);
    }
    h5::Id g = make_group(file, "train");
    write(g, "losses", H5T_NATIVE_DOUBLE, {hsize_t(S)}, losses.data());
    write(g, "lrs", H5T_NATIVE_DOUBLE, {hsize_t(S)}, lrs.data());
    write(g, "grad_norms", H5T_NATIVE_DOUBLE, {hsize_t(S)}, norms.data());
    h5::Id gf = make_group(file, "final");
    write_params(gf, model, to_f64(model, model.params()));
    std::printf("wrote %s\n", out_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
