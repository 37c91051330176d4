// The boundary rule of packed documents (train.document_mask,
// model.rope_reset_per_document), one place for the model (documents.cpp) and
// context parallelism (parallel/cp/chunks.cpp): a document starts at every
// sequence's first token and after each end-of-document token, as
// Megatron-LM's reset_attention_mask / reset_position_ids take them from its
// EOD token.
#pragma once
#include <cstdint>

namespace adgt {

// start[b*T + t] = the position in sequence b (of B, T tokens each, row-major
// `tokens`) where token t's document begins.
inline void sequence_document_starts(const int32_t* tokens, int64_t B, int64_t T, int32_t eos,
                                     int32_t* start) {
  for (int64_t b = 0; b < B; ++b) {
    int32_t first = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && tokens[b * T + t - 1] == eos) first = int32_t(t);
      start[b * T + t] = first;
    }
  }
}

}  // namespace adgt
