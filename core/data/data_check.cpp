#include "core/data/data_check.hpp"

#include "core/data/document_eos.hpp"

#include "core/data/blend.hpp"

#include <filesystem>
#include <stdexcept>
#include <string>

#include "core/data/token_shard.hpp"

namespace adgt {

std::unique_ptr<TokenShard> open_checked_shard(const std::string& path, const char* key,
                                               const ModelConfig& m, const std::string& where) {
  if (!token_file_exists(path))
    throw ConfigError(where + key + ": token shard '" + path +
                      "' does not exist; prepare it with `adgt-data prepare` "
                      "(scripts/prepare_data.sh)");
  std::unique_ptr<TokenShard> s;
  try {
    s = std::make_unique<TokenShard>(path);
  } catch (const std::exception& e) {
    throw ConfigError(where + key + ": " + e.what());
  }
  if (s->vocab_size() > m.vocab_size && !s->vocab_from_header())
    throw ConfigError(where + key + ": " + token_file_format_name(s->format()) + " file '" + path +
                      "' holds token id " + std::to_string(s->vocab_size() - 1) +
                      ", outside model.vocab_size=" + std::to_string(m.vocab_size) +
                      "; set model.vocab_size >= " + std::to_string(s->vocab_size()) +
                      " (the vocabulary the file was tokenized with)");
  if (s->vocab_size() > m.vocab_size)
    throw ConfigError(where + key + ": shard '" + path + "' was tokenized with vocabulary " +
                      std::to_string(s->vocab_size()) + " but model.vocab_size=" +
                      std::to_string(m.vocab_size) + "; set model.vocab_size >= " +
                      std::to_string(s->vocab_size()));
  return s;
}

std::string tokenizer_warning(const RunConfig& cfg) {
  std::error_code ec;
  if (cfg.data.tokenizer == "byte" || std::filesystem::is_regular_file(cfg.data.tokenizer, ec))
    return "";
  return "data.tokenizer: '" + cfg.data.tokenizer +
         "' is not a file (working directory " + std::filesystem::current_path(ec).string() +
         "); training reads token ids only, but the checkpoints record this path and "
         "`adgt-ckpt export-hf` reads bos/eos from it: give the SentencePiece model the shards "
         "were made with (adgt-data prepare writes <out>/tokenizer.model), or byte";
}

std::vector<std::unique_ptr<TokenShard>> open_checked_blend(const std::string& value, const char* key,
                                                            const ModelConfig& m, const std::string& where) {
  std::vector<BlendSource> blend;
  try {
    blend = parse_blend(value, key);
  } catch (const std::runtime_error& e) {
    throw ConfigError(where + e.what());
  }
  // A directory in a blend stands for its split's file.
  const std::string split = std::string(key) == "data.val" ? "val.bin" : "train.bin";
  std::vector<std::unique_ptr<TokenShard>> out;
  for (const BlendSource& s : blend)
    out.push_back(open_checked_shard(blend_source_file(s.path, blend.size(), split), key, m, where));
  return out;
}

void check_data_inputs(const RunConfig& cfg) {
  const std::string where = (cfg.source.empty() ? std::string("config") : cfg.source) + ": ";
  const auto train = open_checked_blend(cfg.data.train, "data.train", cfg.model, where);
  (void)open_checked_blend(cfg.data.val, "data.val", cfg.model, where);
  if (cfg.train.document_mask || cfg.model.rope_reset_per_document) {
    std::vector<std::string> files;
    for (const auto& s : train) files.push_back(s->path());
    try {
      (void)resolve_document_eos(cfg.data.eos_id, files, cfg.data.tokenizer, cfg.model.vocab_size);
    } catch (const std::runtime_error& e) {
      throw ConfigError(where + e.what());
    }
  }
}

}  // namespace adgt
