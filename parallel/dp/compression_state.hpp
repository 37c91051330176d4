// Gradient compression's state in a checkpoint (per rank,
// CheckpointState::rank_state; docs/checkpoint-format.md): the buckets'
// geometry and levels, and their error-feedback residuals and PowerSGD's Q,
// read from and restored into a GradReducer. Apart from the reducer, which
// reduces and keeps the state, but knows nothing of checkpoints.
#pragma once
#include <map>
#include <string>

#include "core/checkpoint/checkpoint.hpp"
#include "parallel/dp/grad_reducer.hpp"

namespace adgt {

// The reducer's compression state for its rank's checkpoint file. Empty
// when no bucket holds any.
std::map<std::string, StateEntry> compression_state(const GradReducer& r);

// Restores compression_state() of a checkpoint into r. Returns "" when
// restored (or there was none), else why it cannot be (a different dp size
// or bucket plan): the caller agrees over the ranks and drops it everywhere
// (GradReducer::clear_compression_state) with a note.
std::string restore_compression_state(GradReducer& r, const std::map<std::string, StateEntry>& s);

}  // namespace adgt
