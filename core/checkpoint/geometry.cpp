// Checkpoint geometry: regions, ownership, pieces and moves; no HDF5 (see the
// header and docs/checkpoint-format.md).
#include "core/checkpoint/geometry.hpp"

#include <algorithm>
#include <map>
#include <numeric>

namespace adgt {

bool Region::contains(const Region& o) const {
  for (size_t d = 0; d < 2; ++d)
    if (o.start[d] < start[d] || o.start[d] + o.count[d] > start[d] + count[d]) return false;
  return true;
}

Region whole_region(const std::vector<int64_t>& g, const std::string& name) {
  if (g.size() > 2)
    throw CheckpointError("checkpoint: parameter " + name + " has " + std::to_string(g.size()) +
                          " dimensions; checkpoints hold tensors of at most 2");
  Region r;
  r.nd = int(g.size());
  for (size_t d = 0; d < g.size(); ++d) r.count[d] = g[d];
  return r;
}

std::string region_str(const Region& r) {
  std::string s = "[";
  for (int d = 0; d < r.nd; ++d)
    s += (d ? ", " : "") + std::to_string(r.start[size_t(d)]) + ":" +
         std::to_string(r.start[size_t(d)] + r.count[size_t(d)]);
  return s + "]";
}

Region intersect(const Region& a, const Region& b) {
  Region r;
  r.nd = a.nd;
  for (size_t d = 0; d < 2; ++d) {
    const int64_t lo = std::max(a.start[d], b.start[d]);
    const int64_t hi = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]);
    r.start[d] = lo;
    r.count[d] = std::max<int64_t>(hi - lo, 0);
  }
  return r;
}

Region shard_region(const ParamSpec& l, int tp_rank, int tp) {
  Region r = whole_region(l.global_shape, l.name);
  if (l.shard_dim < 0 || tp <= 1) return r;
  const auto d = size_t(l.shard_dim);
  const int64_t ext = l.shape[d], s = int64_t(tp_rank) * ext;
  r.start[d] = s;
  r.count[d] = std::clamp<int64_t>(l.global_shape[d] - s, 0, ext);
  return r;
}

int64_t local_flat_index(const ParamSpec& l, const Region& mine, int64_t row, int64_t col) {
  const int64_t cols = l.shape.size() > 1 ? l.shape[1] : 1;
  return l.offset + (row - mine.start[0]) * cols + (col - mine.start[1]);
}

std::vector<int> piece_writers(const std::vector<ParamSpec>& local, int dp, int ep, int ep_rank) {
  std::vector<int> w(local.size(), 0);
  if (dp <= 1) return w;
  if (ep < 1 || dp % ep != 0 || ep_rank < 0 || ep_rank >= ep)
    throw CheckpointError("piece_writers: ep " + std::to_string(ep) + " (rank " + std::to_string(ep_rank) +
                          ") does not divide dp " + std::to_string(dp));
  std::vector<size_t> order(local.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return local[a].numel > local[b].numel; });
  std::vector<int64_t> load(size_t(dp), 0);
  // The non-expert tensors over every dp rank (the same on every ep rank), then
  // the expert weights over the dp ranks of this ep rank (ep_rank + ep * j).
  for (const bool experts : {false, true}) {
    const int stride = experts ? ep : 1, first = experts ? ep_rank : 0;
    for (size_t i : order) {
      if ((local[i].expert >= 0) != experts) continue;
      int best = first;
      for (int d = first; d < dp; d += stride)
        if (load[size_t(d)] < load[size_t(best)]) best = d;
      w[i] = best;
      load[size_t(best)] += std::max<int64_t>(local[i].numel, 1);
    }
  }
  return w;
}

bool writes_piece(const std::vector<ParamSpec>& local, const std::vector<int>& writers, size_t i,
                  const ShardLayout& lay) {
  const ParamSpec& l = local[i];
  if (writers[i] != lay.dp_rank) return false;
  if ((l.shard_dim < 0 || lay.tp <= 1) && lay.tp_rank != 0) return false;
  return shard_region(l, lay.tp_rank, lay.tp).numel() > 0;
}

bool stage_leader(const ShardLayout& lay) { return lay.tp_rank == 0 && lay.dp_rank < lay.ep; }

ShardLayout shard_layout_of(const Layout& l, const RankCoords& c) {
  ShardLayout s;
  s.tp = int(l.tp), s.tp_rank = c.tp;
  // Context parallelism: the cp ranks of a replica hold the same weights, so
  // a checkpoint sees dp x cp replicas, this rank the dpcp group's rank (over
  // which ZeRO-1 chunks the AdamW state too; ep fastest, so the rank modulo
  // ep is still its ep rank); cp is not in the saved tensors.
  s.dp = int(l.dp * l.cp), s.dp_rank = c.ep + int(l.ep) * (c.cp + int(l.cp) * c.edp);
  s.pp = int(l.pp), s.pp_rank = c.pp;
  s.ep = int(l.ep), s.ep_rank = c.ep;
  s.description = describe(l);
  return s;
}

namespace {
// The ep rank that dp rank `dp_rank` has in the layout (core/layout.cpp's formula).
int ep_rank_of(const ShardLayout& lay, int dp_rank) {
  Layout l;
  l.tp = lay.tp, l.dp = lay.dp, l.pp = lay.pp, l.ep = lay.ep;
  return coords_of(l, rank_of(l, RankCoords{0, dp_rank, 0, 0, 0})).ep;
}
}  // namespace

void check_expert_layout(const ShardLayout& lay, const std::string& who) {
  if (lay.ep < 1 || lay.dp % lay.ep != 0 || lay.dp_rank < 0 || lay.dp_rank >= lay.dp ||
      lay.ep_rank != ep_rank_of(lay, lay.dp_rank))
    throw CheckpointError(who + ": expert parallelism ep " + std::to_string(lay.ep) + " (this rank ep " +
                          std::to_string(lay.ep_rank) + ", dp " + std::to_string(lay.dp_rank) + " of dp " +
                          std::to_string(lay.dp) + "): ep must divide dp and ep_rank = dp_rank % ep");
}

void chunk_blocks(const ParamSpec& l, const Region& mine, int64_t lo, int64_t hi, WrittenPiece& p) {
  // [a, b): the range in the shard's own elements (0 = l.offset).
  const int64_t a = std::max(l.offset, lo) - l.offset, b = std::min(l.offset + l.numel, hi) - l.offset;
  if (a >= b) return;
  const int64_t cols = l.shape.size() > 1 ? l.shape[1] : 1;
  const int64_t vr = mine.count[0], vc = mine.count[1];
  auto add = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    r1 = std::min(r1, vr);
    c1 = std::min(c1, vc);
    if (r0 >= r1 || c0 >= c1) return;
    Block bl;
    bl.r.nd = mine.nd;
    bl.r.start = {mine.start[0] + r0, mine.start[1] + c0};
    bl.r.count = {r1 - r0, c1 - c0};
    bl.src_offset = p.numel;
    p.numel += bl.r.numel();
    p.blocks.push_back(bl);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t x = l.offset + r * cols + c0, y = l.offset + r * cols + c1;
      if (!p.runs.empty() && p.runs.back().second == x)
        p.runs.back().second = y;
      else
        p.runs.emplace_back(x, y);
    }
  };
  int64_t ra = a / cols;
  const int64_t ca = a % cols, rb = b / cols, cb = b % cols;
  if (ra == rb) {
    add(ra, ra + 1, ca, cb);
    return;
  }
  if (ca > 0) {
    add(ra, ra + 1, ca, cols);
    ++ra;
  }
  add(ra, rb, 0, cols);
  if (cb > 0) add(rb, rb + 1, 0, cb);
}

std::vector<WrittenPiece> written_pieces(const std::vector<ParamSpec>& local, const ShardLayout& lay,
                                         const std::vector<int>& writers) {
  const bool zero = lay.state_hi >= 0;
  std::vector<WrittenPiece> out;
  for (int g = 0; g < 3; ++g)
    for (size_t i = 0; i < local.size(); ++i) {
      const ParamSpec& l = local[i];
      const Region mine = shard_region(l, lay.tp_rank, lay.tp);
      WrittenPiece p;
      p.group = g;
      p.param = i;
      if (g > 0 && zero) {  // the part of this shard in this rank's chunk
        if ((l.shard_dim < 0 || lay.tp <= 1) && lay.tp_rank != 0) continue;
        chunk_blocks(l, mine, lay.state_lo, lay.state_hi, p);
        if (p.blocks.empty()) continue;  // outside the chunk, or vocabulary padding only
        p.flat = true;
      } else {  // the whole (valid) shard: one block, `mine`
        if (!writes_piece(local, writers, i, lay)) continue;
        chunk_blocks(l, mine, l.offset, l.offset + l.numel, p);
      }
      out.push_back(std::move(p));
    }
  return out;
}

std::vector<Region> needed_regions(const std::vector<ParamSpec>& local, const ShardLayout& lay) {
  std::vector<Region> mine(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const ParamSpec& l = local[i];
    mine[i] = shard_region(l, lay.tp_rank, lay.tp);
    if (l.shard_dim >= 0 &&
        (mine[i].start[size_t(l.shard_dim)] != l.shard_start || mine[i].count[size_t(l.shard_dim)] != l.shard_valid))
      throw CheckpointError("load_checkpoint: parameter " + l.name + " of tp rank " + std::to_string(lay.tp_rank) +
                            " starts at " + std::to_string(l.shard_start) + " but tp=" + std::to_string(lay.tp) +
                            " equal shards put it at " + std::to_string(mine[i].start[size_t(l.shard_dim)]));
  }
  return mine;
}

std::vector<std::vector<Region>> held_blocks(const std::vector<ParamSpec>& local, const ShardLayout& lay,
                                             int group) {
  const std::vector<Region> mine = needed_regions(local, lay);
  std::vector<std::vector<Region>> out(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    if (group == 0 || lay.state_hi < 0) {
      out[i] = {mine[i]};
      continue;
    }
    WrittenPiece p;
    chunk_blocks(local[i], mine[i], lay.state_lo, lay.state_hi, p);
    for (const Block& b : p.blocks) out[i].push_back(b.r);
  }
  return out;
}

int64_t held_index(const RankShards& s, int group, size_t i, int64_t row, int64_t col) {
  const ParamSpec& l = s.local[i];
  const int64_t at = local_flat_index(l, shard_region(l, s.lay.tp_rank, s.lay.tp), row, col);
  return group > 0 && s.lay.state_hi >= 0 ? at - s.lay.state_lo : at;
}

std::vector<RegionMove> plan_moves(const std::vector<RankShards>& from, const std::vector<RankShards>& to) {
  // held[d][g][i]: what destination d holds of its tensor i in group g.
  std::vector<std::array<std::vector<std::vector<Region>>, 3>> held(to.size());
  std::vector<std::map<std::string, size_t>> index(to.size());
  for (size_t d = 0; d < to.size(); ++d) {
    for (int g = 0; g < 3; ++g) held[d][size_t(g)] = held_blocks(to[d].local, to[d].lay, g);
    for (size_t i = 0; i < to[d].local.size(); ++i) index[d][to[d].local[i].name] = i;
  }
  std::vector<RegionMove> moves;
  for (size_t s = 0; s < from.size(); ++s) {
    const ShardLayout& lay = from[s].lay;
    const std::vector<int> writers = piece_writers(from[s].local, lay.dp, lay.ep, lay.ep_rank);
    for (const WrittenPiece& p : written_pieces(from[s].local, lay, writers)) {
      const std::string& name = from[s].local[p.param].name;
      for (const Block& b : p.blocks)
        for (size_t d = 0; d < to.size(); ++d) {
          const auto it = index[d].find(name);
          if (it == index[d].end()) continue;
          for (const Region& want : held[d][size_t(p.group)][it->second]) {
            const Region x = intersect(b.r, want);
            if (x.numel() > 0) moves.push_back({p.group, int(s), p.param, int(d), it->second, x});
          }
        }
    }
  }
  return moves;
}

}  // namespace adgt
