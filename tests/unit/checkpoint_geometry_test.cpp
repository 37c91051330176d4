// Checkpoint geometry without HDF5: region arithmetic, the pieces a rank
// writes (their blocks and flat runs agree), and resharding plans between
// layouts checked by brute force over every element index: each element a
// destination rank holds is moved exactly once, from the source rank's buffer
// position holding that same global element.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint/geometry.hpp"
#include "core/model/stage_slice.hpp"

using namespace adgt;

namespace {

ModelConfig geometry_model(bool moe) {
  ModelConfig m;
  m.vocab_size = 63;  // odd: tp=2 and tp=4 pad the vocabulary
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 4;  // tp=4 shards the k and v projections too
  m.ffn_hidden = 40;
  m.seq_len = 8;
  if (moe) {
    m.n_experts = 4;
    m.expert_ffn_hidden = 24;
    m.moe_every = 2;  // layer 1 only
  }
  return m;
}

struct Grid {
  int tp = 1, dp = 1, pp = 1, ep = 1;
  bool zero = false;  // ZeRO-1 state chunks: dp rank d holds [n d / dp, n (d + 1) / dp)
};

std::string grid_str(const Grid& g) {
  return "tp " + std::to_string(g.tp) + " dp " + std::to_string(g.dp) + " pp " + std::to_string(g.pp) + " ep " +
         std::to_string(g.ep) + (g.zero ? " zero" : "");
}

// Every rank of `g` in world order (tp fastest, then dp, then pp): pipeline
// rank p holds an equal share of the layers (the embedding on the first, the
// head on the last), ep rank e the experts x with x % ep == e.
std::vector<RankShards> ranks_of(const ModelConfig& m, const Grid& g) {
  std::vector<RankShards> out;
  for (int p = 0; p < g.pp; ++p)
    for (int d = 0; d < g.dp; ++d)
      for (int t = 0; t < g.tp; ++t) {
        StageSlice slice;
        slice.chunks = {{m.n_layers * p / g.pp, m.n_layers * (p + 1) / g.pp}};
        slice.embedding = p == 0;
        slice.head = p == g.pp - 1;
        std::vector<int64_t> experts;
        for (int64_t x = 0; x < m.n_experts; ++x)
          if (x % g.ep == d % g.ep) experts.push_back(x);
        RankShards r;
        r.lay.tp = g.tp, r.lay.tp_rank = t, r.lay.dp = g.dp, r.lay.dp_rank = d;
        r.lay.pp = g.pp, r.lay.pp_rank = p, r.lay.ep = g.ep, r.lay.ep_rank = d % g.ep;
        r.local = build_param_table(m, g.tp, t, &slice, m.n_experts > 0 ? &experts : nullptr);
        if (g.zero) {
          const int64_t n = total_numel(r.local);
          r.lay.state_lo = n * d / g.dp;
          r.lay.state_hi = n * (d + 1) / g.dp;
        }
        out.push_back(std::move(r));
      }
  return out;
}

// The value every buffer holds for element (row, col) of tensor `name` in `group`.
int64_t value_of(int group, const std::string& name, int64_t row, int64_t col) {
  return int64_t(std::hash<std::string>{}(name) % 1000003) * 1000000 + group * 100000 + row * 256 + col;
}

// Rank s's buffer for `group`: what it holds set to value_of, the rest (padding,
// outside its ZeRO chunk) -1.
std::vector<int64_t> held_buffer(const RankShards& s, int group) {
  const int64_t n = total_numel(s.local);
  const bool chunk = group > 0 && s.lay.state_hi >= 0;
  std::vector<int64_t> buf(size_t(chunk ? s.lay.state_hi - s.lay.state_lo : n), -1);
  const auto blocks = held_blocks(s.local, s.lay, group);
  for (size_t i = 0; i < s.local.size(); ++i)
    for (const Region& b : blocks[i])
      for (int64_t r = b.start[0]; r < b.start[0] + b.count[0]; ++r)
        for (int64_t c = b.start[1]; c < b.start[1] + b.count[1]; ++c) {
          const int64_t at = held_index(s, group, i, r, c);
          REQUIRE((at >= 0 && at < int64_t(buf.size())));
          buf[size_t(at)] = value_of(group, s.local[i].name, r, c);
        }
  return buf;
}

// Plans the moves from `a` to `b`, carries them out on buffers and checks that
// every element each destination holds arrives exactly once, with its value.
void require_reshard(const ModelConfig& m, const Grid& a, const Grid& b) {
  INFO(grid_str(a) << " -> " << grid_str(b));
  const std::vector<RankShards> from = ranks_of(m, a), to = ranks_of(m, b);
  const std::vector<RegionMove> moves = plan_moves(from, to);
  std::vector<std::vector<int64_t>> src(from.size() * 3), dst(to.size() * 3), hits(to.size() * 3);
  for (size_t s = 0; s < from.size(); ++s)
    for (int g = 0; g < 3; ++g) src[s * 3 + size_t(g)] = held_buffer(from[s], g);
  for (size_t d = 0; d < to.size(); ++d)
    for (int g = 0; g < 3; ++g) {
      const size_t n = held_buffer(to[d], g).size();
      dst[d * 3 + size_t(g)].assign(n, -1);
      hits[d * 3 + size_t(g)].assign(n, 0);
    }
  for (const RegionMove& mv : moves) {
    REQUIRE(from[size_t(mv.src)].local[mv.src_param].name == to[size_t(mv.dst)].local[mv.dst_param].name);
    const std::vector<int64_t>& in = src[size_t(mv.src) * 3 + size_t(mv.group)];
    std::vector<int64_t>& out = dst[size_t(mv.dst) * 3 + size_t(mv.group)];
    std::vector<int64_t>& hit = hits[size_t(mv.dst) * 3 + size_t(mv.group)];
    for (int64_t r = mv.r.start[0]; r < mv.r.start[0] + mv.r.count[0]; ++r)
      for (int64_t c = mv.r.start[1]; c < mv.r.start[1] + mv.r.count[1]; ++c) {
        const int64_t i = held_index(from[size_t(mv.src)], mv.group, mv.src_param, r, c);
        const int64_t o = held_index(to[size_t(mv.dst)], mv.group, mv.dst_param, r, c);
        REQUIRE((i >= 0 && i < int64_t(in.size()) && o >= 0 && o < int64_t(out.size())));
        out[size_t(o)] = in[size_t(i)];
        ++hit[size_t(o)];
      }
  }
  // Brute force: each destination buffer equals what that rank holds, every
  // held element hit once, nothing else written.
  for (size_t d = 0; d < to.size(); ++d)
    for (int g = 0; g < 3; ++g) {
      INFO("destination rank " << d << " group " << g);
      const std::vector<int64_t> want = held_buffer(to[d], g);
      const std::vector<int64_t>& hit = hits[d * 3 + size_t(g)];
      REQUIRE(dst[d * 3 + size_t(g)] == want);
      for (size_t k = 0; k < want.size(); ++k) REQUIRE(hit[k] == (want[k] >= 0 ? 1 : 0));
    }
}

}  // namespace

TEST_CASE("checkpoint geometry: region intersection", "[checkpoint]") {
  Region a;
  a.nd = 2;
  a.start = {2, 0};
  a.count = {4, 8};
  Region b = a;
  b.start = {4, 6};
  b.count = {10, 10};
  const Region x = intersect(a, b);
  REQUIRE(region_str(x) == "[4:6, 6:8]");
  REQUIRE(x.numel() == 4);
  REQUIRE(a.contains(x));
  REQUIRE(b.contains(x));
  b.start = {6, 0};
  REQUIRE(intersect(a, b).numel() == 0);
  const Region v = whole_region({5}, "v");  // 1-D: (5, 1)
  REQUIRE(region_str(v) == "[0:5]");
  REQUIRE(v.numel() == 5);
  REQUIRE_THROWS_AS(whole_region({2, 2, 2}, "t"), CheckpointError);
}

TEST_CASE("checkpoint geometry: a written piece's blocks and runs hold the same elements", "[checkpoint]") {
  const ModelConfig m = geometry_model(true);
  for (const Grid& g : {Grid{2, 2, 1, 1, true}, Grid{4, 3, 1, 1, true}, Grid{2, 2, 2, 2, false}}) {
    INFO(grid_str(g));
    for (const RankShards& s : ranks_of(m, g)) {
      const std::vector<int> writers = piece_writers(s.local, s.lay.dp, s.lay.ep, s.lay.ep_rank);
      for (const WrittenPiece& p : written_pieces(s.local, s.lay, writers)) {
        // The blocks' elements in source order, as local flat indices ...
        std::vector<int64_t> from_blocks;
        int64_t offset = 0;
        for (const Block& b : p.blocks) {
          REQUIRE(b.src_offset == offset);
          offset += b.r.numel();
          for (int64_t r = b.r.start[0]; r < b.r.start[0] + b.r.count[0]; ++r)
            for (int64_t c = b.r.start[1]; c < b.r.start[1] + b.r.count[1]; ++c)
              from_blocks.push_back(local_flat_index(s.local[p.param], shard_region(s.local[p.param],
                                                                                    s.lay.tp_rank, s.lay.tp),
                                                     r, c));
        }
        REQUIRE(offset == p.numel);
        // ... are the runs, in order.
        std::vector<int64_t> from_runs;
        for (const auto& [x, y] : p.runs)
          for (int64_t k = x; k < y; ++k) from_runs.push_back(k);
        REQUIRE(from_runs == from_blocks);
        REQUIRE(p.flat == (p.group > 0 && g.zero));
      }
    }
  }
}

TEST_CASE("checkpoint geometry: resharding plans cover every element once", "[checkpoint]") {
  const ModelConfig dense = geometry_model(false);
  SECTION("tensor parallel") {
    require_reshard(dense, Grid{2}, Grid{4});
    require_reshard(dense, Grid{4}, Grid{2});
    require_reshard(dense, Grid{1}, Grid{4});
  }
  SECTION("data parallel and ZeRO-1 chunks") {
    require_reshard(dense, Grid{2, 2, 1, 1, true}, Grid{4});
    require_reshard(dense, Grid{1, 4, 1, 1, true}, Grid{2, 3, 1, 1, true});
    require_reshard(dense, Grid{2, 3, 1, 1, false}, Grid{4, 2, 1, 1, true});
    require_reshard(dense, Grid{4, 2, 1, 1, true}, Grid{1, 1});
  }
  SECTION("pipeline stages") {
    require_reshard(dense, Grid{2, 1, 2}, Grid{4, 1, 1});
    require_reshard(dense, Grid{1, 2, 1, 1, true}, Grid{2, 2, 2, 1, true});
  }
  SECTION("expert parallelism") {
    const ModelConfig moe = geometry_model(true);
    require_reshard(moe, Grid{1, 2, 1, 2}, Grid{2, 1});
    require_reshard(moe, Grid{2, 1}, Grid{1, 4, 1, 2});
    require_reshard(moe, Grid{2, 4, 2, 4}, Grid{4, 2, 1, 2});
  }
}

TEST_CASE("checkpoint geometry: needed regions are the tp shards", "[checkpoint]") {
  const ModelConfig m = geometry_model(false);
  for (int t = 0; t < 4; ++t) {
    ShardLayout lay;
    lay.tp = 4;
    lay.tp_rank = t;
    const auto local = build_param_table(m, 4, t);
    const std::vector<Region> need = needed_regions(local, lay);
    for (size_t i = 0; i < local.size(); ++i) REQUIRE(need[i] == shard_region(local[i], t, 4));
    lay.tp_rank = (t + 1) % 4;  // another rank's table: the sharded tensors start elsewhere
    REQUIRE_THROWS_WITH(needed_regions(local, lay), Catch::Matchers::Contains("equal shards put it at"));
  }
}
