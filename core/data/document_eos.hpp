// The end-of-document token that train.document_mask and
// model.rope_reset_per_document split packed sequences at (docs/data-format.md,
// "Documents").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adgt {

// `configured` (data.eos_id) when >= 0; else the documents.eos_id that
// `adgt-data prepare` wrote into the meta.json beside each training file
// (all that have one must agree); else the EOS of `tokenizer`
// (data.tokenizer). Throws std::runtime_error naming the files and keys when
// none is known or the id is outside [0, vocab_size).
int32_t resolve_document_eos(int64_t configured, const std::vector<std::string>& train_files,
                             const std::string& tokenizer, int64_t vocab_size);

}  // namespace adgt
