// HuggingFace export and import of adgt checkpoints (docs/huggingface.md).
//
//   export_hf: <step>/checkpoint.h5 -> <out>/{model.safetensors | model-0000i-of-0000N.safetensors
//              + model.safetensors.index.json, config.json [, generation_config.json]}
//   import_hf: <hf dir> (config.json + safetensors) -> <out>/step_0/checkpoint.h5 + <out>/config.yaml
//
// Tensor names and config keys go through core/hf/config.hpp, chosen by
// architecture; the file format is core/hf/safetensors.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/hf/config.hpp"
#include "core/hf/safetensors.hpp"

namespace adgt {

// The run config stored in a checkpoint (meta/config_yaml), parsed and
// validated; `step_dir` is a step directory or its checkpoint.h5.
std::string read_checkpoint_config_yaml(const std::string& step_dir);
RunConfig checkpoint_run_config(const std::string& step_dir);

// "5GB" -> 5e9, "100KB" -> 1e5, "10MiB" -> 10*2^20, "123" -> 123 (units B, KB,
// MB, GB, TB powers of 1000; KiB, MiB, GiB, TiB powers of 1024; case-insensitive,
// as transformers' max_shard_size). Throws HfError on anything else.
int64_t parse_byte_size(const std::string& s);

// Groups tensors (sizes in bytes, in order) into shards of at most `max_bytes`
// each, in order, as transformers does: a tensor that does not fit starts a new
// shard; one larger than max_bytes gets a shard of its own. Returns, per shard,
// the indices of its tensors.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes);

struct HfExportOptions {
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  StDType dtype = StDType::F32;             // F32, or BF16 (round to nearest even)
  std::string tokenizer;  // SentencePiece model for bos/eos ids; "" = the checkpoint's data.tokenizer
  bool force = false;     // replace an existing non-empty <out>
};

struct HfExportResult {
  std::vector<std::string> files;  // written, relative to out
  int64_t n_tensors = 0;
  int64_t tensor_bytes = 0;        // index total_size
  int64_t bos_token_id = -1, eos_token_id = -1;
  std::string note;                // e.g. why bos/eos were omitted
  std::vector<std::string> notes;  // what the HF architecture drops (hf_export_check)
};

// Writes into <out>.tmp-<pid>, fsyncs, then renames it to <out> (an existing
// empty directory is replaced; a non-empty one only with force). A model with
// experts is written as MixtralForCausalLM; one Mixtral cannot represent
// (hf_export_check) is refused before anything is read or written.
HfExportResult export_hf(const std::string& step_dir, const std::string& out_dir,
                         const HfExportOptions& opt);

struct HfImportResult {
  std::string step_dir;     // <out>/step_0
  std::string config_path;  // <out>/config.yaml
  RunConfig cfg;
  int64_t n_tensors = 0;
  std::vector<std::string> notes;  // ignored tensors and the like
};

// Reads <hf_dir>/config.json and model.safetensors (or the index and its
// shards; F32, BF16 or F16), checks every tensor the model needs is there with
// its shape, and writes an adgt checkpoint at step 0 (AdamW moments zero) plus
// <out>/config.yaml. `base_config` (optional YAML) supplies the train, data,
// parallel, checkpoint and log sections, and model.seq_len / init_std when it
// sets them; without one, checkpoint.dir = <out>/checkpoints and log.dir = <out>.
HfImportResult import_hf(const std::string& hf_dir, const std::string& out_dir,
                         const std::string& base_config = "");

}  // namespace adgt
