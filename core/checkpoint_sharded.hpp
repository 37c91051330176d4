// Checkpoints written by every rank in parallel and read back into any layout
// (format version 2, docs/checkpoint-format.md):
//
//   <root>/step_<N>/rank_<R>.h5     world rank R's pieces: model/<name>,
//                                   optim/exp_avg/<name>, optim/exp_avg_sq/<name>,
//                                   each a part of the global tensor, crc32 attribute
//   <root>/step_<N>/checkpoint.h5   the index: the same paths as HDF5 virtual
//                                   datasets of the global shape over the rank
//                                   files' pieces, and meta/ (incl. meta/pieces)
//   <root>/step_<N>/COMPLETE        written last, by world rank 0
//
// Ownership: a parameter's weights are written as its tensor-parallel shards
// (valid rows or columns only; a replicated tensor whole, by tp rank 0), each
// by one of its dp replicas: dp rank piece_writers(...)[i]. The AdamW state
// likewise, except under ZeRO-1: there every dp rank writes the part of each
// shard that lies in its own chunk of the flat buffer (no communication).
// With pipeline parallelism each stage holds (and writes, by the same rule
// within the stage) only its own tensors; a tensor lives on exactly one stage
// when saving, and the index covers every stage's tensors. With expert
// parallelism (ep > 1) an expert weight (ParamSpec::expert >= 0) is held only
// by the dp ranks of its owner ep rank (its expert-data-parallel replicas) and
// written by one of them; every expert of every MoE layer must be held by
// exactly one ep rank of its stage when saving.
//
// Every function taking a Comm is collective over it: all ranks call it, and an
// error on any rank is thrown, with that rank's message, on every rank.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/comm.hpp"

namespace adgt {

// This rank's place in the layout that saves or loads: world = tp * dp * pp
// ranks (mesh order in parallel/mesh.hpp: tp fastest, then dp, then pp). The
// rank's table (`st.specs` / `local`) holds the parameters of its pipeline
// stage only (all of them when pp = 1), as tp shards, replicated over dp.
//
// Expert parallelism: ep divides dp; dp rank d is ep rank d % ep (the ep
// group of d is dp ranks [d / ep * ep, d / ep * ep + ep)). The ranks of a
// stage and tp rank hold the same non-expert tensors; their expert tensors
// (ParamSpec::expert >= 0) are those of their ep rank, so dp ranks with the
// same ep rank (the expert-data-parallel, "edp", group: d % ep equal) hold the
// same table, and ranks with different ep ranks differ exactly in their
// expert tensors.
struct ShardLayout {
  int tp = 1, tp_rank = 0;
  int dp = 1, dp_rank = 0;
  std::string description;  // stored in meta/layout, e.g. "tp=2 dp=2 pp=2 zero=1 sequence_parallel=0"
  // Saving under ZeRO-1: exp_avg / exp_avg_sq hold only this rank's chunk
  // [state_lo, state_hi) of the local flat buffer. state_hi < 0: the whole buffer.
  int64_t state_lo = 0, state_hi = -1;
  // Pipeline stages (last, so that the aggregate initialisations above keep their meaning).
  int pp = 1, pp_rank = 0;
  // Expert parallelism: ep divides dp, ep_rank = dp_rank % ep. ZeRO-1 state
  // chunks (state_hi >= 0) are not supported with ep > 1 (nor by the config).
  int ep = 1, ep_rank = 0;
};

// A block of a global tensor of rank nd <= 2 (a 1-D tensor is (n, 1): start[1] 0, count[1] 1).
struct Region {
  int nd = 0;
  std::array<int64_t, 2> start{0, 0}, count{1, 1};
  int64_t numel() const { return count[0] * count[1]; }
  bool contains(const Region& o) const;
  bool operator==(const Region& o) const = default;
};
// The part of the global tensor that tp rank `tp_rank` (of `tp`) holds for the
// parameter whose shard on this rank is `l` (valid indices only; the whole
// tensor when replicated). Shards are equal blocks of the padded extent.
Region shard_region(const ParamSpec& l, int tp_rank, int tp);

// For each parameter, the dp rank that writes its pieces: a greedy balance of
// the shard sizes (largest first onto the least-loaded rank, ties by table
// order and lowest rank). First the non-expert parameters over all `dp` ranks,
// then the expert weights (ParamSpec::expert >= 0) over the dp ranks that hold
// them, those of ep rank `ep_rank` (ep_rank, ep_rank + ep, ...), on top of
// those loads. Depends only on the table's shard sizes and expert flags, so it
// is the same on every tp rank, the non-expert part the same on every ep rank.
std::vector<int> piece_writers(const std::vector<ParamSpec>& local, int dp, int ep = 1, int ep_rank = 0);
// Whether this rank writes parameter i's piece.
bool writes_piece(const std::vector<ParamSpec>& local, const std::vector<int>& writers, size_t i,
                  const ShardLayout& lay);

// Saves step st.step: st.specs is this rank's table (model_->table(): its
// pipeline stage's parameters), st.params its local flat buffer (at least
// total_numel(specs) elements), exp_avg and exp_avg_sq the same (they need only
// hold the parameters this rank writes), or under ZeRO-1 just its chunk
// (lay.state_lo/state_hi); the meta fields are taken from world rank 0.
// lay.tp * lay.dp * lay.pp must equal world.size(); every rank of a stage must
// hold the same tensors (with ep > 1: the same non-expert tensors, and the
// same expert tensors as the ranks of its ep rank), no tensor may be held by
// two stages or an expert by two ep ranks, and every expert of each MoE layer
// (as many as the rows of its router, ParamSpec::is_router) must be held by
// some ep rank. Protocol:
// rank 0 makes <root>/.tmp_step_<N>_<pid>; every rank writes and fsyncs
// rank_<R>.h5; the pieces' records (names, blocks, checksums) are gathered to
// rank 0, which writes checkpoint.h5 (every stage's tensors) and COMPLETE,
// renames the directory to step_<N> and prunes to `keep`. Returns the step
// directory on every rank. Collective over `world`.
std::string save_checkpoint_sharded(const std::string& root, const CheckpointState& st, const ShardLayout& lay,
                                    Comm& world, int64_t keep);

// Loads a version 1 or 2 checkpoint, written by any layout, into this rank's
// shard: `local` is this rank's table (any subset of the model: its pipeline
// stage's parameters); returns params / exp_avg / exp_avg_sq in local flat
// layout (total_numel(local) elements; padding and vocabulary-padding rows
// zero), specs = local. Each rank reads only its own shard's hyperslab of each
// of its tensors (through the virtual datasets); a tensor of `local` that the
// checkpoint lacks is an error, and so is a tensor of the checkpoint that no
// rank of `world` loads. Every piece's crc32 is verified once per pipeline
// stage that holds its tensor: by a rank of the stage whose shard contains the
// piece (from the data it read), else by a rank of the stage chosen round robin
// that reads the piece from its file (for an expert's piece: among the ranks
// of the stage that hold the expert, those of ep rank lay.ep_rank). A piece of
// a loaded tensor that no rank verified (a layout that does not describe the
// tables) is an error when the world is the whole layout. No collective
// depends on the table, so ranks holding different tensors make the same
// calls. A world of one may stand in for any single rank of a bigger layout
// (tests, tools); the check for tensors nobody loads is then skipped when
// lay.pp > 1 or lay.ep > 1. Collective over `world`.
CheckpointState load_checkpoint_sharded(const std::string& step_dir, const std::vector<ParamSpec>& local,
                                        const ShardLayout& lay, Comm& world);

// Collective over `world`: "" when `mine` is "" on every rank, else the message
// of the lowest rank that has one (with a note naming that rank when it is not
// this one). Every rank gets the same answer, so they can all throw together.
std::string agree_error(Comm& world, const std::string& mine);

}  // namespace adgt
