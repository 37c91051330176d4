// adgt-ckpt: checkpoint tools. Export to and import from HuggingFace
// safetensors (docs/huggingface.md), and print what a checkpoint holds.
//
//   adgt-ckpt export-hf <step dir> <out dir> [--max-shard-size 5GB] [--dtype float32|bfloat16]
//                       (LlamaForCausalLM, or MixtralForCausalLM for a model with experts)
//   adgt-ckpt import-hf <hf dir> <out dir> [--config base.yaml]
//   adgt-ckpt info <step dir> [--tensors]
#include <CLI/CLI.hpp>

#include "apps/cli_parse.hpp"
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "core/checkpoint/checkpoint.hpp"
#include "core/config.hpp"
#include "core/hf/export.hpp"
#include "core/model/param_table.hpp"

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char s[32];
  std::snprintf(s, sizeof s, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return s;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

int run_info(const std::string& step_dir, bool list_tensors) {
  const adgt::RunConfig cfg = adgt::checkpoint_run_config(step_dir);
  const auto specs = adgt::build_param_table(cfg.model);
  const adgt::CheckpointState st = adgt::load_checkpoint(step_dir, specs);  // verifies every CRC
  namespace fs = std::filesystem;
  fs::path dir = step_dir;
  if (!fs::is_directory(dir)) dir = dir.parent_path();
  double bytes = 0;  // checkpoint.h5, and rank_<R>.h5 of a sharded (version 2) checkpoint
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".h5") {
      bytes += double(e.file_size());
      ++files;
    }
  const adgt::ModelConfig& m = cfg.model;
  const int64_t n = adgt::param_count(specs);
  std::printf("checkpoint:   %s (%d HDF5 file%s, %s)\n", dir.c_str(), files, files == 1 ? "" : "s",
              human_bytes(bytes).c_str());
  std::printf("step:         %ld\n", long(st.step));
  // The layout of the run that saved it (it loads into any other: docs/checkpoint-format.md).
  const adgt::SavedLayout saved = adgt::saved_layout(step_dir);
  if (saved.description.empty())
    std::printf("saved by:     (not recorded: a format 1 checkpoint)\n");
  else
    std::printf("saved by:     %s (%ld rank%s); loads into any layout\n", saved.description.c_str(),
                long(saved.world_size), saved.world_size == 1 ? "" : "s");
  std::printf("samples seen: %ld\n", long(st.samples_seen));
  std::printf("seed:         %llu\n", (unsigned long long)st.seed);
  std::printf("model:        %s, %ld layers, d_model %ld, %ld heads (%ld KV, head_dim %ld), ffn %ld, "
              "vocab %ld, seq_len %ld, rope_theta %g, norm_eps %g, %s embeddings\n",
              adgt::hf_architecture_name(adgt::hf_arch(m)), long(m.n_layers), long(m.d_model),
              long(m.n_heads), long(m.n_kv_heads), long(m.head_dim()), long(m.ffn_hidden),
              long(m.vocab_size), long(m.seq_len), m.rope_theta, m.norm_eps,
              m.tie_embeddings ? "tied" : "untied");
  if (m.n_experts > 0) {
    const std::string where = m.moe_every == 1 ? "every layer"
                                               : "every " + std::to_string(m.moe_every) +
                                                     "th layer; not exportable as Mixtral";
    const std::string drops = m.moe_capacity_factor > 0
                                  ? "capacity factor " + std::to_string(m.moe_capacity_factor)
                                  : std::string("dropless");
    std::printf("experts:      %ld per MoE layer (top-%ld, expert ffn %ld, %s), aux loss coef %g%s, %s\n",
                long(m.n_experts), long(m.moe_top_k), long(m.expert_ffn()), where.c_str(), m.moe_aux_loss_coef,
                m.moe_aux_free ? ", aux-loss-free bias" : "", drops.c_str());
  }
  std::printf("tensors:      %zu parameters, %ld elements, %s fp32 (x3 with the AdamW moments: %s)\n",
              specs.size(), long(n), human_bytes(double(n) * 4).c_str(),
              human_bytes(double(n) * 12).c_str());
  std::printf("checksums:    verified (%zu tensor datasets in model/ and optim/, "
              "meta/config_yaml, meta/rng_state)\n", 3 * specs.size());
  if (list_tensors)
    for (const auto& p : specs)
      std::printf("  %-50s %s\n", p.name.c_str(), shape_str(p.global_shape).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-ckpt: checkpoint tools (HuggingFace export/import, info)"};
  app.require_subcommand(1);
  std::string src, dst, shard_size = "5GB", dtype = "float32", base, tokenizer;
  bool force = false, list_tensors = false;

  auto* ex = app.add_subcommand("export-hf", "write a checkpoint as HuggingFace safetensors + config.json");
  ex->add_option("step_dir", src, "checkpoint step directory (…/step_<N>)")->required();
  ex->add_option("out_dir", dst, "output directory (created; written atomically)")->required();
  ex->add_option("--max-shard-size", shard_size, "largest shard, e.g. 5GB, 500MB, 100KB, 2GiB")
      ->capture_default_str();
  ex->add_option("--dtype", dtype, "tensor dtype in the files")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  ex->add_option("--tokenizer", tokenizer,
                 "SentencePiece model for bos/eos ids (default: the checkpoint's data.tokenizer)");
  ex->add_flag("--force", force, "replace an existing non-empty output directory");

  auto* im = app.add_subcommand("import-hf", "make an adgt checkpoint (step 0) from a HuggingFace directory");
  im->add_option("hf_dir", src, "directory with config.json and model*.safetensors")->required();
  im->add_option("out_dir", dst, "output: <out>/step_0/checkpoint.h5 and <out>/config.yaml")->required();
  im->add_option("--config", base, "base YAML supplying the train/data/parallel/checkpoint/log sections");

  auto* in = app.add_subcommand("info", "print a checkpoint's step, config and tensors; verify checksums");
  in->add_option("step_dir", src, "checkpoint step directory")->required();
  in->add_flag("--tensors", list_tensors, "list every tensor with its shape");
  ADGT_CLI_PARSE(app, argc, argv);

  try {
    if (*ex) {
      adgt::HfExportOptions opt;
      opt.max_shard_bytes = adgt::parse_byte_size(shard_size);
      opt.dtype = dtype == "bfloat16" ? adgt::StDType::BF16 : adgt::StDType::F32;
      opt.tokenizer = tokenizer;
      opt.force = force;
      const auto r = adgt::export_hf(src, dst, opt);
      if (!r.note.empty()) std::fprintf(stderr, "note: %s\n", r.note.c_str());
      for (const auto& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
      std::printf("exported %ld tensors (%s, %s) to %s:\n", long(r.n_tensors),
                  human_bytes(double(r.tensor_bytes)).c_str(), dtype.c_str(), dst.c_str());
      for (const auto& f : r.files) std::printf("  %s\n", f.c_str());
    } else if (*im) {
      const auto r = adgt::import_hf(src, dst, base);
      for (const auto& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
      std::printf("imported %ld tensors from %s\n", long(r.n_tensors), src.c_str());
      std::printf("checkpoint: %s\nconfig:     %s\n", r.step_dir.c_str(), r.config_path.c_str());
      std::printf("start a run with:\n  adgt-train --config %s --resume %s\n", r.config_path.c_str(),
                  r.step_dir.c_str());
    } else {
      return run_info(src, list_tensors);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dynamic_cast<const adgt::ConfigError*>(&e) ? 2 : 1;
  }
}
