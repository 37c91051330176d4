#include "core/data/data_check.hpp"

#include <filesystem>
#include <stdexcept>
#include <string>

#include "core/data/token_shard.hpp"

namespace adgt {

namespace {

std::string src(const RunConfig& cfg) { return cfg.source.empty() ? "config" : cfg.source; }

void check_shard(const RunConfig& cfg, const std::string& path, const char* key) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(src(cfg) + ": " + key + ": token shard '" + path +
                      "' does not exist; prepare it with `adgt-data prepare` "
                      "(scripts/prepare_data.sh)");
  int64_t vocab = 0;
  try {
    vocab = TokenShard(path).vocab_size();
  } catch (const std::exception& e) {
    throw ConfigError(src(cfg) + ": " + key + ": " + e.what());
  }
  if (vocab > cfg.model.vocab_size)
    throw ConfigError(src(cfg) + ": " + key + ": shard '" + path + "' was tokenized with vocabulary " +
                      std::to_string(vocab) + " but model.vocab_size=" +
                      std::to_string(cfg.model.vocab_size) + "; set model.vocab_size >= " +
                      std::to_string(vocab));
}

}  // namespace

void check_data_inputs(const RunConfig& cfg) {
  check_shard(cfg, cfg.data.train, "data.train");
  check_shard(cfg, cfg.data.val, "data.val");
}

}  // namespace adgt
