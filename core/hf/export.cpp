// HuggingFace export and import; the user-facing description is
// docs/huggingface.md (keep the two in step).
#include "core/hf/export.hpp"

#include "core/data/hf_tokenizer.hpp"
#include "core/data/tokenizer.hpp"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/hdf5_util.hpp"
#include "core/model/param_table.hpp"

namespace adgt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

// Creates `path` exclusively, writes `text`, fsyncs and closes it.
void write_file_synced(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw HfError(path.string() + ": cannot create: " + std::strerror(errno));
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      throw HfError(path.string() + ": write failed: " + std::strerror(e));
    }
    p += r;
    n -= size_t(r);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw HfError(path.string() + ": fsync/close failed: " + std::strerror(errno));
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the files themselves are synced
  ::fsync(fd);
  ::close(fd);
}

// "out/" -> "out"; relative paths stay relative.
fs::path clean_dir(const std::string& s) {
  fs::path p = fs::path(s).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

bool is_nonempty_target(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return false;
  return !fs::is_directory(out, ec) || !fs::is_empty(out, ec);
}

// Renames the finished `tmp` to `out` (see export_hf).
void install_dir(const fs::path& tmp, const fs::path& out, bool force) {
  std::error_code ec;
  fs::path old;
  if (is_nonempty_target(out)) {
    if (!force)
      throw HfError(out.string() + ": exists and is not empty; remove it, choose another directory or "
                    "pass --force to replace it");
    old = out.string() + ".old-" + std::to_string(::getpid());
    fs::rename(out, old);
  }
  fs::rename(tmp, out);  // replaces an empty directory
  fsync_dir(out.has_parent_path() ? out.parent_path() : fs::path("."));
  if (!old.empty()) fs::remove_all(old, ec);
}

// bos/eos ids of a SentencePiece model or a tokenizer.json; both -1 (and a note) when unknown.
void special_ids(const std::string& spec, int64_t vocab, HfExportResult& r) {
  std::error_code ec;
  if (spec == "byte") {
    r.note = "byte tokenizer: no bos/eos tokens, bos_token_id/eos_token_id omitted";
    return;
  }
  if (!fs::is_regular_file(spec, ec)) {
    r.note = "tokenizer " + spec + " not found: bos_token_id/eos_token_id omitted (pass --tokenizer)";
    return;
  }
  if (is_hf_tokenizer_spec(spec)) {
    // Its bos/eos: tokenizer_config.json's bos_token/eos_token beside it, or
    // the known special-token names (Tokenizer::bos_id/eos_id).
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = Tokenizer::load(spec);
    } catch (const std::exception& e) {
      r.note = "tokenizer " + spec + " could not be read (" + e.what() +
               "): bos_token_id/eos_token_id omitted";
      return;
    }
    if (tok->bos_id() >= 0 && tok->bos_id() < vocab) r.bos_token_id = tok->bos_id();
    if (tok->eos_id() >= 0 && tok->eos_id() < vocab) r.eos_token_id = tok->eos_id();
    if (r.bos_token_id < 0 && r.eos_token_id < 0)
      r.note = "tokenizer " + spec + " (tokenizer.json) copied beside the weights; it names no "
               "bos/eos token (no tokenizer_config.json beside it, no known special-token name): "
               "bos_token_id/eos_token_id omitted";
    return;
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(spec);
  if (!status.ok()) {
    r.note = "tokenizer " + spec + " is not a SentencePiece model (" + status.ToString() +
             "): bos_token_id/eos_token_id omitted";
    return;
  }
  if (sp.bos_id() >= 0 && sp.bos_id() < vocab) r.bos_token_id = sp.bos_id();
  if (sp.eos_id() >= 0 && sp.eos_id() < vocab) r.eos_token_id = sp.eos_id();
}

std::string shard_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char b[64];
  std::snprintf(b, sizeof b, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return b;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw HfError(p.string() + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw HfError(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Where each HF tensor lives: the index's weight_map, or the single file.
struct TensorSource {
  std::map<std::string, std::string> file_of;  // tensor -> file name in the HF dir
  std::string listed_in;                       // the file that says so (for errors)
};

TensorSource locate_tensors(const fs::path& dir) {
  std::error_code ec;
  TensorSource src;
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(index, ec)) {
    src.listed_in = index.string();
    const json j = read_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw HfError(index.string() + ": no \"weight_map\" object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string())
        throw HfError(index.string() + ": weight_map entry for tensor " + it.key() + " is not a file name");
      const std::string f = it->get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw HfError(index.string() + ": weight_map entry for tensor " + it.key() + " is \"" + f +
                      "\"; expected a file name in " + dir.string());
      src.file_of[it.key()] = f;
    }
    return src;
  }
  if (!fs::exists(single, ec))
    throw HfError(dir.string() + ": neither model.safetensors nor model.safetensors.index.json found "
                  "(PyTorch .bin checkpoints are not read; save with safe_serialization=True)");
  src.listed_in = single.string();
  for (const auto& [name, t] : read_safetensors_header(single.string()).tensors)
    src.file_of[name] = "model.safetensors";
  return src;
}

}  // namespace

// ---------------------------------------------------------------- checkpoint config

std::string read_checkpoint_config_yaml(const std::string& step_dir) {
  std::error_code ec;
  fs::path file = step_dir;
  if (!fs::exists(file, ec))
    throw CheckpointError("checkpoint " + step_dir + ": no such file or directory; pass a step "
                          "directory such as runs/tiny/checkpoints/step_300");
  if (fs::is_directory(file, ec)) file /= "checkpoint.h5";
  const std::string where = "checkpoint " + file.string() + ": ";
  if (!fs::is_regular_file(file, ec))
    throw CheckpointError(where + "file not found; pass a step directory such as "
                          "runs/tiny/checkpoints/step_300");
  try {
    h5::QuietErrors quiet;
    if (ADGT_H5(H5Fis_hdf5(file.c_str())) <= 0) throw CheckpointError(where + "not an HDF5 file");
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    if (ADGT_H5(H5Lexists(f, "meta", H5P_DEFAULT)) <= 0 ||
        ADGT_H5(H5Lexists(f, "meta/config_yaml", H5P_DEFAULT)) <= 0)
      throw CheckpointError(where + "no meta/config_yaml; not an adgt checkpoint (docs/checkpoint-format.md)");
    h5::Id ds(ADGT_H5(H5Dopen2(f, "meta/config_yaml", H5P_DEFAULT)), H5Dclose);
    h5::Id ftype(ADGT_H5(H5Dget_type(ds)), H5Tclose);
    if (ADGT_H5(H5Tget_class(ftype)) != H5T_STRING)
      throw CheckpointError(where + "meta/config_yaml is not a string");
    h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
    std::string s;
    if (ADGT_H5(H5Tis_variable_str(ftype)) > 0) {
      h5::Id mtype(ADGT_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
      ADGT_H5(H5Tset_size(mtype, H5T_VARIABLE));
      char* p = nullptr;
      ADGT_H5(H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
      if (p) s = p;
      ADGT_H5(H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, &p));
    } else {
      s.assign(H5Tget_size(ftype), '\0');
      ADGT_H5(H5Dread(ds, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()));
      s.resize(std::strlen(s.c_str()));
    }
    return s;
  } catch (const h5::Error& e) {
    throw CheckpointError(where + "cannot read meta/config_yaml: " + e.what());
  }
}

RunConfig checkpoint_run_config(const std::string& step_dir) {
  std::error_code ec;
  fs::path file = step_dir;
  if (fs::is_directory(file, ec)) file /= "checkpoint.h5";
  return load_config_text(read_checkpoint_config_yaml(step_dir), file.string() + ":meta/config_yaml");
}

// ---------------------------------------------------------------- sizes and shards

int64_t parse_byte_size(const std::string& s) {
  const std::string bad = "max shard size \"" + s +
                          "\": expected a number with an optional unit B, KB, MB, GB, TB (powers of "
                          "1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 5GB";
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) throw HfError(bad);
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(s.substr(0, i), &used);
    if (used != i) throw HfError(bad);
  } catch (const std::logic_error&) {
    throw HfError(bad);
  }
  std::string unit;
  for (size_t k = i; k < s.size(); ++k)
    if (!std::isspace(static_cast<unsigned char>(s[k])))
      unit += char(std::toupper(static_cast<unsigned char>(s[k])));
  static const std::map<std::string, double> kUnits = {
      {"", 1},         {"B", 1},          {"KB", 1e3},         {"MB", 1e6},
      {"GB", 1e9},     {"TB", 1e12},      {"KIB", 1024.0},     {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) throw HfError(bad);
  const double bytes = v * it->second;
  if (!(bytes >= 1) || bytes > 9e18) throw HfError(bad + " (at least 1 byte)");
  return int64_t(bytes);
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t cur = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (shards.empty() || (!shards.back().empty() && cur + bytes[i] > max_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += bytes[i];
  }
  return shards;
}

// ---------------------------------------------------------------- export

HfExportResult export_hf(const std::string& step_dir, const std::string& out_dir,
                         const HfExportOptions& opt) {
  if (opt.dtype != StDType::F32 && opt.dtype != StDType::BF16)
    throw HfError("export dtype must be float32 or bfloat16");
  const fs::path out = clean_dir(out_dir);
  if (out.empty()) throw HfError("export: empty output directory");
  if (!opt.force && is_nonempty_target(out))
    throw HfError(out.string() + ": exists and is not empty; remove it, choose another directory or "
                  "pass --force to replace it");

  const RunConfig cfg = checkpoint_run_config(step_dir);
  HfExportResult r;
  try {
    r.notes = hf_export_check(cfg.model);
  } catch (const HfError& e) {
    throw HfError("export of " + step_dir + " as " + hf_architecture_name(hf_arch(cfg.model)) + ": " + e.what());
  }
  const std::vector<ParamSpec> specs = build_param_table(cfg.model);
  const CheckpointState st = load_checkpoint(step_dir, specs);
  const HfArch arch = hf_arch(cfg.model);

  special_ids(opt.tokenizer.empty() ? cfg.data.tokenizer : opt.tokenizer, cfg.model.vocab_size, r);
  std::vector<StWriteTensor> tensors;
  std::vector<int64_t> bytes;
  const int64_t esize = st_dtype_size(opt.dtype);
  for (const ParamSpec& p : specs) {
    tensors.push_back({hf_tensor_name(arch, p.name), p.global_shape, st.params.data() + p.offset});
    bytes.push_back(p.numel * esize);
    r.tensor_bytes += p.numel * esize;
  }
  r.n_tensors = int64_t(tensors.size());
  const auto plan = plan_shards(bytes, opt.max_shard_bytes);

  std::error_code ec;
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    nlohmann::ordered_json weight_map;
    for (size_t s = 0; s < plan.size(); ++s) {
      std::vector<StWriteTensor> part;
      for (size_t i : plan[s]) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].name] = shard_name(s, plan.size());
      }
      write_safetensors((tmp / shard_name(s, plan.size())).string(), part, opt.dtype,
                        {{"format", "pt"}});
      r.files.push_back(shard_name(s, plan.size()));
    }
    if (plan.size() > 1) {
      nlohmann::ordered_json index;
      index["metadata"] = {{"total_size", r.tensor_bytes}};
      index["weight_map"] = weight_map;
      write_file_synced(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
      r.files.push_back("model.safetensors.index.json");
    }
    HfConfigExtras extra;
    extra.torch_dtype = opt.dtype == StDType::BF16 ? "bfloat16" : "float32";
    extra.bos_token_id = r.bos_token_id;
    extra.eos_token_id = r.eos_token_id;
    write_file_synced(tmp / "config.json", hf_config_json(cfg.model, extra).dump(2) + "\n");
    r.files.push_back("config.json");
    if (r.bos_token_id >= 0 || r.eos_token_id >= 0) {
      nlohmann::ordered_json g;
      g["_from_model_config"] = true;
      if (r.bos_token_id >= 0) g["bos_token_id"] = r.bos_token_id;
      if (r.eos_token_id >= 0) g["eos_token_id"] = r.eos_token_id;
      write_file_synced(tmp / "generation_config.json", g.dump(2) + "\n");
      r.files.push_back("generation_config.json");
    }
    // A tokenizer.json the run read goes with the weights, as HuggingFace
    // models carry it (bos/eos ids are not guessed from it).
    const std::string spec = opt.tokenizer.empty() ? cfg.data.tokenizer : opt.tokenizer;
    if (is_hf_tokenizer_spec(spec) && fs::is_regular_file(spec, ec)) {
      fs::copy_file(spec, tmp / "tokenizer.json", fs::copy_options::overwrite_existing);
      r.files.push_back("tokenizer.json");
    }
    fsync_dir(tmp);
    install_dir(tmp, out, opt.force);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw HfError(std::string("export to ") + out.string() + ": " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return r;
}

// ---------------------------------------------------------------- import

namespace {

// The model's tokenizer.json goes beside the imported checkpoint, and
// data.tokenizer names it when adgt reads it (docs/data-format.md,
// "Tokenizers") and no base config chose the data; notes say otherwise.
// Returns whether there is one to copy (copy_tokenizer_files).
bool adopt_tokenizer(const fs::path& dir, const fs::path& out, const std::string& base_config, RunConfig& cfg,
                     std::vector<std::string>& notes) {
  std::error_code ec;
  const fs::path tok_src = dir / "tokenizer.json", tok_dst = out / "tokenizer.json";
  if (!fs::is_regular_file(tok_src, ec)) return false;
  try {
    const int64_t v = Tokenizer::load(tok_src.string())->vocab_size();
    if (v > cfg.model.vocab_size)
      notes.push_back("tokenizer.json copied; its vocabulary (" + std::to_string(v) + ") exceeds vocab_size " +
                      std::to_string(cfg.model.vocab_size) + ", so data.tokenizer does not name it");
    else if (!base_config.empty())
      notes.push_back("tokenizer.json copied to " + tok_dst.string() + "; data.tokenizer is " + base_config + "'s");
    else
      cfg.data.tokenizer = tok_dst.string();
  } catch (const std::exception& e) {
    notes.push_back(std::string("tokenizer.json copied, but adgt cannot encode with it: ") + e.what());
  }
  return true;
}

// tokenizer.json, and the tokenizer_config.json that names its end and
// beginning tokens when there is one, from dir into out.
void copy_tokenizer_files(const fs::path& dir, const fs::path& out) {
  std::error_code ec;
  fs::copy_file(dir / "tokenizer.json", out / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
  if (ec) throw HfError("cannot copy " + (dir / "tokenizer.json").string() + " into " + out.string() + ": " + ec.message());
  if (fs::is_regular_file(dir / "tokenizer_config.json", ec))
    fs::copy_file(dir / "tokenizer_config.json", out / "tokenizer_config.json", fs::copy_options::overwrite_existing,
                  ec);
}

// <out>/config.yaml of an import (written to a temporary name, synced,
// renamed), headed by the command that starts from `step_dir`.
fs::path write_import_config(const fs::path& dir, const fs::path& out, const std::string& step_dir,
                             const RunConfig& cfg) {
  std::error_code ec;
  const fs::path yaml = out / "config.yaml";
  const fs::path tmp = out / (".config.yaml.tmp-" + std::to_string(::getpid()));
  fs::remove(tmp, ec);
  write_file_synced(tmp, "# imported from " + dir.string() + " by adgt-ckpt import-hf; start with\n" +
                             "#   adgt-train --config " + yaml.string() + " --resume " + step_dir +
                             "\n" + to_yaml(cfg));
  fs::rename(tmp, yaml);
  fsync_dir(out);
  return yaml;
}

}  // namespace

HfImportResult import_hf(const std::string& hf_dir_s, const std::string& out_dir,
                         const std::string& base_config) {
  std::error_code ec;
  const fs::path dir = clean_dir(hf_dir_s), out = clean_dir(out_dir);
  if (!fs::is_directory(dir, ec)) throw HfError(dir.string() + ": not a directory");
  const fs::path cfg_path = dir / "config.json";
  if (!fs::is_regular_file(cfg_path, ec))
    throw HfError(cfg_path.string() + ": not found; a HuggingFace model directory holds config.json");

  HfImportResult r;
  RunConfig cfg;
  bool base_sets_seq_len = false;
  if (!base_config.empty()) {
    cfg = load_config(base_config);
    try {
      const YAML::Node n = YAML::LoadFile(base_config);
      base_sets_seq_len = n["model"] && n["model"]["seq_len"];
    } catch (const YAML::Exception&) {
    }  // load_config parsed it already
  } else {
    cfg.checkpoint.dir = (out / "checkpoints").string();
    cfg.log.dir = out.string();
  }
  HfArch arch{};
  ModelConfig m =
      model_from_hf_config(read_json_file(cfg_path), cfg_path.string(), cfg.model, &arch, &r.notes);
  if (base_sets_seq_len) {
    if (cfg.model.seq_len != m.seq_len)
      r.notes.push_back("model.seq_len=" + std::to_string(cfg.model.seq_len) + " from " + base_config +
                        " (config.json's max_position_embeddings is " + std::to_string(m.seq_len) + ")");
    m.seq_len = cfg.model.seq_len;
  }
  cfg.model = m;
  cfg.source = cfg_path.string() + (base_config.empty() ? "" : " with " + base_config);
  validate(cfg);

  const TensorSource src = locate_tensors(dir);
  std::map<std::string, StFile> headers;
  auto header = [&](const std::string& file) -> const StFile& {
    auto it = headers.find(file);
    if (it == headers.end()) {
      const fs::path p = dir / file;
      if (!fs::is_regular_file(p, ec))
        throw HfError(p.string() + ": not found (" + src.listed_in + " lists it)");
      it = headers.emplace(file, read_safetensors_header(p.string())).first;
    }
    return it->second;
  };
  // The tensor `name`, checked against `shape`, as fp32.
  auto read = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const auto f = src.file_of.find(name);
    if (f == src.file_of.end())
      throw HfError(src.listed_in + ": tensor " + name + " is missing (" + cfg_path.string() +
                    " describes a model that needs it)");
    const StFile& h = header(f->second);
    const StTensor* t = h.find(name);
    if (!t) throw HfError(h.path + ": tensor " + name + " is missing (" + src.listed_in + " maps it here)");
    if (t->shape != shape)
      throw HfError(h.path + ": tensor " + name + " has shape " + shape_str(t->shape) + ", but " +
                    cfg_path.string() + " implies " + shape_str(shape));
    return read_safetensors_f32(h, *t);
  };

  const bool copy_tokenizer = adopt_tokenizer(dir, out, base_config, cfg, r.notes);

  const std::vector<ParamSpec> specs = build_param_table(cfg.model);
  CheckpointState st;
  st.step = 0;
  st.samples_seen = 0;
  st.seed = cfg.train.seed;
  st.config_yaml = to_yaml(cfg);
  st.state["trainer/opt_steps"] = StateEntry::of_ints({0});  // AdamW updates applied
  st.specs = specs;
  const auto total = size_t(total_numel(specs));
  st.params.assign(total, 0.0f);
  st.exp_avg.assign(total, 0.0f);
  st.exp_avg_sq.assign(total, 0.0f);
  std::set<std::string> expected;
  for (const ParamSpec& p : specs) {
    const std::string name = hf_tensor_name(arch, p.name);
    expected.insert(name);
    const std::vector<float> v = read(name, p.global_shape);
    std::copy(v.begin(), v.end(), st.params.begin() + p.offset);
  }
  r.n_tensors = int64_t(specs.size());

  // Tensors the model does not use: known harmless ones are noted, anything
  // else means config.json and the weights disagree.
  for (const auto& [name, file] : src.file_of) {
    if (expected.count(name)) continue;
    const std::string where = (dir / file).string();
    if (ends_with(name, "rotary_emb.inv_freq")) {
      r.notes.push_back("ignored " + name + " (rotary frequencies are recomputed)");
    } else if (name == "lm_head.weight" && cfg.model.tie_embeddings) {
      const ParamSpec& emb = specs.front();
      const std::vector<float> head = read(name, emb.global_shape);
      if (!std::equal(head.begin(), head.end(), st.params.begin() + emb.offset))
        throw HfError(where + ": tensor lm_head.weight differs from model.embed_tokens.weight, but " +
                      cfg_path.string() + " says tie_word_embeddings: true");
      r.notes.push_back("ignored lm_head.weight (equal to model.embed_tokens.weight; tied)");
    } else {
      throw HfError(where + ": tensor " + name + " is not part of " +
                    hf_architecture_name(arch) + " as " + cfg_path.string() +
                    " describes it (another architecture, biases, or untied embeddings?); "
                    "refusing to drop it");
    }
  }

  fs::create_directories(out, ec);
  if (copy_tokenizer) copy_tokenizer_files(dir, out);
  r.step_dir = save_checkpoint(out.string(), st, 0);
  const fs::path yaml = write_import_config(dir, out, r.step_dir, cfg);
  r.config_path = yaml.string();
  r.cfg = cfg;
  return r;
}

}  // namespace adgt
