// The run's data inputs checked before anything is launched or allocated:
// the token shards exist, have valid headers and fit the model's vocabulary.
// Input errors, so a
// ConfigError naming the key, the file and the fix (adgt-train exits 2 with
// one message; the trainer still checks what it opens, for files that vanish).
#pragma once
#include <memory>
#include <vector>
#include <string>

#include "core/config.hpp"
#include "core/data/token_shard.hpp"

namespace adgt {

void check_data_inputs(const RunConfig& cfg);

// Training reads token ids only; data.tokenizer is recorded in the
// checkpoints for `adgt-ckpt export-hf` (bos/eos ids). A path that is not a
// file is said at the start ("" when it is a file or "byte"), not an error:
// the run does not need it, the export will.
std::string tokenizer_warning(const RunConfig& cfg);

// The shard of `key` ("data.train") opened and checked against the model's
// vocabulary; ConfigError naming the key, the file and the fix otherwise.
// `where`: the message's prefix ("configs/tiny.yaml: ", or "").
std::unique_ptr<TokenShard> open_checked_shard(const std::string& path, const char* key,
                                               const ModelConfig& m, const std::string& where = "");

// Every source of a blend ("PATH", or "0.7 A 0.3 B": core/data/blend.hpp; a
// directory stands for its train.bin, or its val.bin when `key` is
// "data.val") opened and checked as above, in order.
std::vector<std::unique_ptr<TokenShard>> open_checked_blend(const std::string& value, const char* key,
                                                            const ModelConfig& m, const std::string& where = "");

}  // namespace adgt
