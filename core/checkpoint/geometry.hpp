// Checkpoint geometry: which rank holds which region of which global tensor,
// which rank writes which piece, and where a piece's elements lie in a rank's
// flat buffers. Pure layout arithmetic (no HDF5, no files, no communication),
// shared by the save (core/checkpoint/save.cpp), the load
// (core/checkpoint/load.cpp) and in-memory resharding (plan_moves).
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
// Groups: 0 is the weights (model/), 1 exp_avg, 2 exp_avg_sq (optim/...), the
// order of ckpt::kTensorGroups.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/layout.hpp"

namespace adgt {

// This rank's place in the layout that saves or loads: world = tp * dp * pp
// ranks (rank order in core/layout.hpp: tp fastest, then dp, then pp). The
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

// This rank's ShardLayout in `l` (sizes, its coordinates, describe(l));
// the ZeRO-1 state range is the caller's.
ShardLayout shard_layout_of(const Layout& l, const RankCoords& c);

// A block of a global tensor of rank nd <= 2 (a 1-D tensor is (n, 1): start[1] 0, count[1] 1).
struct Region {
  int nd = 0;
  std::array<int64_t, 2> start{0, 0}, count{1, 1};
  int64_t numel() const { return count[0] * count[1]; }
  // Whether o lies inside: per dimension o's start and end within this region's.
  bool contains(const Region& o) const;
  bool operator==(const Region& o) const = default;
};

// The whole tensor of global shape g: start 0, count g (a 1-D tensor (n, 1)).
// More than 2 dimensions is a CheckpointError naming the parameter `name`.
Region whole_region(const std::vector<int64_t>& g, const std::string& name);
// "[0:128, 0:64]": start:end per dimension, as error messages print a region.
std::string region_str(const Region& r);
// The elements in both a and b: per dimension start = max of the starts,
// count = max(0, min of the ends - start); nd from a. numel() 0 when disjoint.
Region intersect(const Region& a, const Region& b);

// The part of the global tensor that tp rank `tp_rank` (of `tp`) holds for the
// parameter whose shard on this rank is `l` (valid indices only; the whole
// tensor when replicated). Shards are equal blocks of the padded extent.
Region shard_region(const ParamSpec& l, int tp_rank, int tp);
// Where global element (row, col) of parameter l lies in the flat buffer of a
// rank whose shard of l is `mine` (shard_region of its tp rank):
// l.offset + (row - mine.start[0]) * cols + (col - mine.start[1]), cols =
// l.shape[1] (1 for a 1-D tensor: col 0). The element must lie in `mine`.
int64_t local_flat_index(const ParamSpec& l, const Region& mine, int64_t row, int64_t col);

// For each parameter, the dp rank that writes its pieces: a greedy balance of
// the shard sizes (largest first onto the least-loaded rank, ties by table
// order and lowest rank). First the non-expert parameters over all `dp` ranks,
// then the expert weights (ParamSpec::expert >= 0) over the dp ranks that hold
// them, those of ep rank `ep_rank` (ep_rank, ep_rank + ep, ...), on top of
// those loads. Depends only on the table's shard sizes and expert flags, so it
// is the same on every tp rank, the non-expert part the same on every ep rank.
std::vector<int> piece_writers(const std::vector<ParamSpec>& local, int dp, int ep = 1, int ep_rank = 0);
// Whether this rank writes parameter i's piece: writers[i] is its dp rank, it
// is tp rank 0 unless the parameter is tp-sharded (shard_dim >= 0, tp > 1),
// and its shard holds valid elements.
bool writes_piece(const std::vector<ParamSpec>& local, const std::vector<int>& writers, size_t i,
                  const ShardLayout& lay);
// Whether this rank lists its whole table in its save report: tp rank 0 and
// the first dp rank of its ep rank (dp_rank < ep).
bool stage_leader(const ShardLayout& lay);
// Throws CheckpointError "<who>: expert parallelism ep ..." unless ep >= 1
// divides dp and ep_rank = dp_rank % ep.
void check_expert_layout(const ShardLayout& lay, const std::string& who);

// A block of a global tensor and where its elements (C order) start in the
// piece (the dataset) holding them.
struct Block {
  Region r;
  int64_t src_offset = 0;
};

// A piece a rank writes: one dataset of its rank file.
struct WrittenPiece {
  int group = 0;              // 0 model, 1 exp_avg, 2 exp_avg_sq
  size_t param = 0;           // index in the rank's table
  std::vector<Block> blocks;  // in source order; src_offset = elements of the blocks before
  bool flat = false;          // stored 1-D (a ZeRO chunk's part); else in blocks[0]'s shape
  int64_t numel = 0;          // elements of all blocks
  // The piece's elements, in order, as ranges [x, y) of the rank's local flat
  // buffer (ParamSpec::offset coordinates; a flat piece's buffer is the ZeRO
  // chunk, which holds [state_lo, state_hi) of it). Adjacent ranges merged.
  std::vector<std::pair<int64_t, int64_t>> runs;
};

// Appends to p the valid elements of shard l (region `mine`; rows < its
// count[0], columns < its count[1] of the shard's (rows, cols) C-order
// layout) that lie in [lo, hi) of the local flat buffer: at most three blocks
// of the global tensor (partial first row, whole rows, partial last row) and
// their runs. Nothing when they are only padding or the range misses l.
void chunk_blocks(const ParamSpec& l, const Region& mine, int64_t lo, int64_t hi, WrittenPiece& p);

// The pieces this rank writes, in (group, table) order: for each group and
// parameter i, the whole valid shard (one block, shard_region) when
// writes_piece(local, writers, i, lay); for the optimizer groups under ZeRO-1
// (lay.state_hi >= 0) instead the valid part of the shard inside
// [state_lo, state_hi), flat, from every dp rank (tp rank 0 only unless the
// parameter is tp-sharded). `writers` is piece_writers(local, lay.dp, lay.ep, lay.ep_rank).
std::vector<WrittenPiece> written_pieces(const std::vector<ParamSpec>& local, const ShardLayout& lay,
                                         const std::vector<int>& writers);

// The region of each tensor of `local` that a rank at `lay` loads (the same in
// all three groups): shard_region(local[i], lay.tp_rank, lay.tp). Throws
// CheckpointError when a tp-sharded parameter's shard_start / shard_valid
// disagree with those of tp equal shards.
std::vector<Region> needed_regions(const std::vector<ParamSpec>& local, const ShardLayout& lay);

// ---------------------------------------------------------------- resharding

// The blocks of each tensor of `local` that a rank at `lay` holds in `group`
// (0 model, 1 exp_avg, 2 exp_avg_sq): its needed_regions block, except for the
// optimizer groups under ZeRO-1 (lay.state_hi >= 0): there the valid part of
// the shard inside [state_lo, state_hi) of the local flat buffer
// (chunk_blocks; none when the chunk misses it), on every tp rank.
std::vector<std::vector<Region>> held_blocks(const std::vector<ParamSpec>& local, const ShardLayout& lay,
                                             int group);

// A rank's place and its table, as a resharding plan sees it.
struct RankShards {
  ShardLayout lay;
  std::vector<ParamSpec> local;
};

// Where global element (row, col) of parameter s.local[i] lies in the buffer
// rank s holds for `group`: local_flat_index(...) of its shard_region, minus
// s.lay.state_lo for an optimizer group (group > 0) held as a ZeRO-1 chunk
// (s.lay.state_hi >= 0).
int64_t held_index(const RankShards& s, int group, size_t i, int64_t row, int64_t col);

// A region of one global tensor that moves from rank `src` of the source
// layout to rank `dst` of the destination (indices into plan_moves'
// vectors). Element (row, col) of r is at held_index(from[src], group,
// src_param, row, col) on the source and held_index(to[dst], group,
// dst_param, row, col) on the destination.
struct RegionMove {
  int group = 0;         // 0 model, 1 exp_avg, 2 exp_avg_sq
  int src = 0;           // index into `from`
  size_t src_param = 0;  // into from[src].local
  int dst = 0;           // index into `to`
  size_t dst_param = 0;  // into to[dst].local
  Region r;              // global coordinates
};

// In-memory resharding from the ranks `from` to the ranks `to` (each a
// RankShards; the vectors need not be whole layouts): each source rank sends
// from the pieces it would write (written_pieces with piece_writers of its own
// table and layout), each destination rank receives its held_blocks; tensors
// match by name. One move per (block of a source piece, block a destination
// holds of that tensor) that intersect, in (source, piece, block,
// destination, destination block) order. When `from` is a whole layout that
// save_checkpoint_sharded accepts, every element a destination holds is
// covered by exactly one move.
std::vector<RegionMove> plan_moves(const std::vector<RankShards>& from, const std::vector<RankShards>& to);

}  // namespace adgt
