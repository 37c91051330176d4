// Checkpoints: full fp32 tensors under their global (HuggingFace) names and
// global shapes, so a checkpoint written by one layout loads into any other and
// reads directly with h5py. Layout and the atomic save protocol:
// docs/checkpoint-format.md.
//
//   <root>/step_<N>/checkpoint.h5   model/<name>, optim/exp_avg/<name>,
//                                   optim/exp_avg_sq/<name>, meta/...
//   <root>/step_<N>/COMPLETE        written last; a step without it is ignored
//
// Format version 1 (save_checkpoint below: one process holding whole tensors,
// e.g. a HuggingFace import) stores real datasets in checkpoint.h5. Version 2
// (the trainer; core/checkpoint/sharded.hpp) stores each rank's pieces in
// rank_<R>.h5 and makes checkpoint.h5 an index of virtual datasets; both read
// the same way, through load_checkpoint or load_checkpoint_sharded.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/model/param_table.hpp"

namespace adgt {

// Every failure to save, find or load a checkpoint; the message names the
// file (and tensor) concerned and what to do about it.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One named, versioned entry of trainer state (state/<name> in checkpoint.h5):
// replicated — the same on every rank; world rank 0's copy is saved. Each
// component writes and reads its own entries ("trainer/opt_steps",
// "moe/bias/layer_<l>", ...); `version` lets it change an entry's meaning.
struct StateEntry {
  enum class Kind : uint8_t { Ints, Reals, Text, Floats };
  Kind kind = Kind::Ints;
  int64_t version = 1;
  std::vector<int64_t> ints;   // Kind::Ints: int64 dataset (n,)
  std::vector<double> reals;   // Kind::Reals: float64 dataset (n,), bit-exact
  std::string text;            // Kind::Text: a string dataset
  std::vector<float> floats;   // Kind::Floats: float32 dataset (n,), bit-exact (large per-rank state)
  static StateEntry of_ints(std::vector<int64_t> v, int64_t version = 1);
  static StateEntry of_floats(std::vector<float> v, int64_t version = 1);
  static StateEntry of_reals(std::vector<double> v, int64_t version = 1);
  static StateEntry of_text(std::string t, int64_t version = 1);
  bool operator==(const StateEntry&) const = default;
};

struct CheckpointState {
  int64_t step = 0;                 // optimizer steps completed
  int64_t samples_seen = 0;         // data position: global training samples consumed
  uint64_t seed = 0;
  std::string config_yaml;          // the run's full config (to_yaml output)
  std::vector<uint64_t> rng_state;  // opaque RNG words (may be empty; the trainer writes none
                                    // since named state: older checkpoints packed its state here)
  std::map<std::string, StateEntry> state;  // named trainer state, by name
  // Named state of this rank alone (gradient compression's error feedback):
  // saved by every rank into its own rank_<R>.h5 under state/, read back by
  // load_rank_state (core/checkpoint/sharded.hpp); not in the index.
  std::map<std::string, StateEntry> rank_state;
  std::vector<ParamSpec> specs;     // parameter table (names, global shapes, flat offsets)
  std::vector<float> params;        // (total_numel(specs),) flat, laid out as specs' offsets say
  std::vector<float> exp_avg;       // (total_numel(specs),) AdamW first moment, same layout
  std::vector<float> exp_avg_sq;    // (total_numel(specs),) AdamW second moment, same layout
};

// Writes <root>/step_<N>/checkpoint.h5 atomically: into <root>/.tmp_step_<N>_<pid>/,
// fsync, COMPLETE marker last, then rename to step_<N> (an existing step_<N> is
// swapped out atomically and removed, with a note on stderr). Then prunes to the
// newest `keep` complete checkpoints (0 keeps all; the one just written is never
// removed). Returns the step directory.
std::string save_checkpoint(const std::string& root, const CheckpointState& st, int64_t keep);

// Reads <step_dir>/checkpoint.h5 (or the .h5 path itself), version 1 or 2, as
// whole tensors. Checks the COMPLETE marker, the format version, the rank files
// (version 2), that the checkpoint holds exactly the tensors of `expected` with
// their global shapes, and every checksum. The returned
// params/exp_avg/exp_avg_sq follow `expected`'s offsets (padding zeroed);
// specs = expected.
CheckpointState load_checkpoint(const std::string& step_dir, const std::vector<ParamSpec>& expected);

// The layout that saved a checkpoint (format 2: meta/layout, meta/world_size,
// checksums verified); world_size 0 and "" for a format 1 checkpoint.
struct SavedLayout {
  std::string description;  // "tp=2 dp=2 zero=0 sequence_parallel=0 pp=1 ep=1"
  int64_t world_size = 0;
};
SavedLayout saved_layout(const std::string& step_dir);

// "" -> "" (no resume); "auto" -> newest complete step_<N> under root ("" if
// none); otherwise `arg` itself, which must exist.
std::string resolve_resume(const std::string& arg, const std::string& root);

// Complete checkpoints (step_<N> with COMPLETE and checkpoint.h5) under root,
// ascending by step; empty when root does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);

}  // namespace adgt
