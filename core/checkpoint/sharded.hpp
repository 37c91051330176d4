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
// Ownership (which rank writes which piece), regions and the layout:
// core/checkpoint/geometry.hpp. Code: the save in core/checkpoint/save.cpp,
// the load in core/checkpoint/load.cpp.
//
// Every function taking a Comm is collective over it: all ranks call it, and an
// error on any rank is thrown, with that rank's message, on every rank.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/geometry.hpp"
#include "core/comm.hpp"

namespace adgt {

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

// The save above in its three phases, which the synchronous save runs in a row
// and the asynchronous one (core/checkpoint/async_save.hpp) spreads over step
// boundaries, the write on a thread of its own:
//   begin   collective: the checks, rank 0's temporary directory, agreement;
//   write   this rank alone, no communication (may run on any one thread, as
//           long as no other thread makes an HDF5 call meanwhile): writes and
//           fsyncs rank_<R>.h5 and encodes its report; an error is recorded in
//           ShardedSave::error, never thrown;
//   commit  collective, once every rank's write has finished: agreement on the
//           writes' errors, the gather of the reports, rank 0's index, COMPLETE,
//           rename and prune. Returns the step directory.
// An error in begin or commit is thrown on every rank, after rank 0 has
// removed the temporary directory. discard_sharded_save (not collective)
// abandons a save that will not be committed: rank 0 removes the temporary
// directory (call it only once every rank has stopped writing, or accept that
// a rank still writing may fail or leave its file in an unlinked directory).
struct ShardedSave {
  std::string who;         // "save_checkpoint(<root>, step <N>)", for messages
  std::string root, name;  // <root>, step_<N>
  std::string tmp;         // <root>/.tmp_step_<N>_<pid of rank 0>
  int64_t step = 0, keep = 0;
  int rank = 0, world_size = 1;
  bool tmp_made = false;            // rank 0: the temporary directory is ours to remove
  std::vector<int> writers;         // piece_writers of this rank's table
  std::string error;                // the write phase's error ("" when it succeeded)
  std::vector<int64_t> report;      // the write phase's piece report for rank 0
};
ShardedSave begin_sharded_save(const std::string& root, const CheckpointState& st, const ShardLayout& lay,
                               Comm& world, int64_t keep);
void write_sharded_rank_file(ShardedSave& s, const CheckpointState& st, const ShardLayout& lay);
// st: only its meta fields and named state are used (world rank 0's), not the buffers.
std::string commit_sharded_save(ShardedSave& s, const CheckpointState& st, const ShardLayout& lay, Comm& world);
void discard_sharded_save(ShardedSave& s) noexcept;

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

// This rank's own named state (CheckpointState::rank_state) from
// <step_dir>/rank_<world_rank>.h5: empty when the file or its state/ group
// does not exist (a checkpoint of fewer ranks, or written without any).
// Checksums verified. Not collective.
std::map<std::string, StateEntry> load_rank_state(const std::string& step_dir, int world_rank);

// Collective over `world`: "" when `mine` is "" on every rank, else the message
// of the lowest rank that has one (with a note naming that rank when it is not
// this one). Every rank gets the same answer, so they can all throw together.
std::string agree_error(Comm& world, const std::string& mine);

}  // namespace adgt
