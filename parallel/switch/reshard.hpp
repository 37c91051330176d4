// In-memory resharding of the training state from one layout to another
// (docs/reliability.md, "In-memory layout switch"): the weights and
// the AdamW moments move between ranks over MPI, piece by piece, by the same
// geometry the checkpoint save and load use (core/checkpoint/geometry.hpp:
// written_pieces, held_blocks, plan_moves). No file is touched.
//
// Every rank knows its place and table in both layouts. The places and
// tables are all-gathered (as JSON), every rank computes the same plan_moves,
// packs the regions it sends in plan order per destination, one all_to_allv
// over the launcher's world moves them, and each rank unpacks what it
// receives in the same order. A ZeRO-1 source sends only its chunk of the
// moments and a ZeRO-1 destination receives only its own chunk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/geometry.hpp"
#include "core/comm.hpp"

namespace adgt {

// One rank's state in one layout: its place (lay, with the ZeRO-1 chunk
// [state_lo, state_hi) of the moments, or state_hi < 0), its table and
// its buffers (params: the whole local flat buffer; exp_avg / exp_avg_sq: the
// chunk under ZeRO-1, else the whole buffer) — what Engine::fill_checkpoint
// gives.
struct RankState {
  RankShards shards;
  std::vector<float> params, exp_avg, exp_avg_sq;
};

// A RankShards as JSON text and back (ParamSpec and ShardLayout fields).
std::string rank_shards_json(const RankShards& s);
RankShards rank_shards_from_json(const std::string& text);

// What a reshard moved, on this rank.
struct ReshardStats {
  int64_t moves = 0;         // plan_moves entries (all ranks)
  int64_t sent_bytes = 0;    // this rank's state that other processes receive
  int64_t local_bytes = 0;   // copied within this rank
  int64_t shared_bytes = 0;  // received from other processes' mapped buffers (no message)
  double plan_s = 0, pack_s = 0, transfer_s = 0, unpack_s = 0;  // this rank's seconds
};

// A rank's three buffers (params, exp_avg, exp_avg_sq) wherever they live:
// its own vectors, another process's on this node read across address
// spaces, or mapped from the node's shared memory
// (parallel/switch/shared_sources.hpp).
struct StateView {
  bool present = false;
  // 0: the buffers are in this process's memory. Else the id of the process
  // whose memory they are in, read with process_vm_readv (the buffers'
  // addresses are that process's).
  int pid = 0;
  const float* buf[3] = {nullptr, nullptr, nullptr};
  int64_t size[3] = {0, 0, 0};
};
StateView view_of(const RankState& s);

// The buffers of `dst` (its shards set; params sized to its table,
// exp_avg / exp_avg_sq to its chunk or table) filled from the ranks' source
// states (`src`: this rank's, with its shards `src_shards`). `world` holds
// every rank once (any order); src_rank / dst_rank are this rank's layout
// ranks in the old and new layouts. Every element `dst` holds is written
// (padding and vocabulary-padding rows stay as they were).
//
// `mapped[p]` (indexed by world process; may be empty): process p's source
// buffers, readable here. Those moves are copied straight from them and not
// sent; the mapping must be symmetric (p maps q exactly when q maps p: one
// node's shared memory) and the buffers stay unchanged until every process
// has returned. Other processes' moves are packed and sent in one
// all_to_allv. This rank's own moves are always copied directly.
// Collective over `world`.
ReshardStats reshard(const RankShards& src_shards, const StateView& src, int src_rank,
                     RankState& dst, int dst_rank, Comm& world,
                     const std::vector<std::string>& all_places,
                     const std::vector<StateView>& mapped = {});

// The all-gather of the places (collective over an MpiComm-like world): each
// rank's "src_rank dst_rank\n<src shards json>\n<dst shards json>". Kept
// apart so that a test can call reshard with places it made itself.
std::string place_record(int src_rank, const RankShards& src, int dst_rank, const RankShards& dst);

// Pack and unpack (pure; the parts of reshard a single-process test drives):
// the elements of the moves with m.src == s, in plan order, from `from`'s
// buffers; and into `to`'s buffers from a payload of the moves with
// m.dst == d, in plan order, from source `s`.
void pack_moves(const std::vector<RegionMove>& moves, int s, const RankState& from, std::vector<float>& out,
                int dst_filter = -1);
void unpack_moves(const std::vector<RegionMove>& moves, int s, int d, RankState& to, const float* in,
                  int64_t n);

// The moves from source rank s to destination rank d, copied row by row from
// s's buffers (`from`, with its shards `from_shards`) into `to`'s; returns
// the elements copied. What pack_moves then unpack_moves would do, without
// the payload.
int64_t copy_moves(const std::vector<RegionMove>& moves, int s, const RankShards& from_shards,
                   const StateView& from, int d, RankState& to);

// Elements a move carries.
inline int64_t move_elems(const RegionMove& m) { return m.r.numel(); }

}  // namespace adgt
