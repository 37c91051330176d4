// The run's data inputs checked before anything is launched or allocated:
// the token shards exist, have valid headers and fit the model's vocabulary.
// Input errors, so a
// ConfigError naming the key, the file and the fix (adgt-train exits 2 with
// one message; the trainer still checks what it opens, for files that vanish).
#pragma once
#include "core/config.hpp"

namespace adgt {

void check_data_inputs(const RunConfig& cfg);

}  // namespace adgt
