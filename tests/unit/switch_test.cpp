// The in-memory layout switch's pure parts: the control file's requests, the
// refusal of keys that are not layout keys, and the pack / unpack of a
// resharding plan checked element by element against the global tensors
// (each element's value is a function of its tensor, group and global index,
// so any misplaced element shows).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>
#include <vector>

#include "core/checkpoint/geometry.hpp"
#include "core/config.hpp"
#include "core/model/param_table.hpp"
#include "parallel/switch/reshard.hpp"
#include "parallel/switch/switch_request.hpp"

using namespace adgt;

TEST_CASE("switch requests parse, fall due by step and refuse non-layout keys", "[switch]") {
  const auto reqs = parse_switch_requests(
      "# comment\nparallel.tp=1 parallel.pp=4   # now\n\n@6 parallel.dp=4 parallel.tp=2\n", "RUN/switch");
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].at_step == -1);
  CHECK(reqs[0].line == 2);
  CHECK(reqs[0].overrides == std::vector<std::string>{"parallel.tp=1", "parallel.pp=4"});
  CHECK(reqs[1].at_step == 6);
  CHECK(reqs[1].line == 4);
  std::vector<SwitchRequest> due, later;
  split_due(reqs, 5, due, later);
  CHECK(due.size() == 1);
  CHECK(later.size() == 1);
  split_due(reqs, 6, due, later);
  CHECK(due.size() == 2);
  CHECK(later.empty());
  CHECK(format_switch_requests({reqs[1]}) == "@6 parallel.dp=4 parallel.tp=2\n");

  CHECK_THROWS_WITH(parse_switch_requests("@x parallel.tp=1\n", "S"), Catch::Contains("S:1") &&
                                                                         Catch::Contains("@x"));
  CHECK_THROWS_WITH(parse_switch_requests("\ntp=2\n", "S"), Catch::Contains("S:2") &&
                                                              Catch::Contains("section.key=value"));
  CHECK_THROWS_WITH(parse_switch_requests("@3\n", "S"), Catch::Contains("no section.key=value"));

  RunConfig cfg;
  cfg.train.global_batch = 16;
  cfg.train.micro_batch = 2;
  cfg.parallel.tp = 2;
  cfg.parallel.dp = 2;
  SwitchRequest r;
  r.line = 3;
  r.overrides = {"parallel.tp=1", "parallel.dp=4"};
  const RunConfig next = switched_config(cfg, r, 4, "S");
  CHECK(next.parallel.tp == 1);
  CHECK(next.parallel.dp == 4);
  CHECK(next.train.lr == cfg.train.lr);
  r.overrides = {"train.lr=1"};
  CHECK_THROWS_WITH(switched_config(cfg, r, 4, "S"),
                    Catch::Contains("S:3") && Catch::Contains("train.lr cannot change"));
  r.overrides = {"parallel.tp=4"};  // 4 x 2 = 8 ranks on a world of 4
  CHECK_THROWS_WITH(switched_config(cfg, r, 4, "S"), Catch::Contains("S:3"));
}

namespace {
// The value of element (row, col) of tensor `name` in group g: distinct for
// every element of the model.
float value_of(const std::string& name, int g, int64_t row, int64_t col) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  return float(h % 997) + float(g) * 1000.0f + float(row) * 0.001f + float(col) * 1e-6f;
}

// Rank tp_rank of tp (one stage, dp 1), its buffers filled from value_of;
// with `zero` the moments hold only the chunk [lo, hi) of the flat buffer.
RankState rank_state(const ModelConfig& m, int tp, int tp_rank, int64_t lo = 0, int64_t hi = -1) {
  RankState s;
  s.shards.lay.tp = tp;
  s.shards.lay.tp_rank = tp_rank;
  s.shards.lay.state_lo = lo;
  s.shards.lay.state_hi = hi;
  s.shards.local = build_param_table(m, tp, tp_rank);
  const int64_t n = total_numel(s.shards.local);
  s.params.assign(size_t(n), 0.0f);
  s.exp_avg.assign(size_t(hi >= 0 ? hi - lo : n), 0.0f);
  s.exp_avg_sq = s.exp_avg;
  for (int g = 0; g < 3; ++g) {
    const auto held = held_blocks(s.shards.local, s.shards.lay, g);
    std::vector<float>& buf = g == 0 ? s.params : g == 1 ? s.exp_avg : s.exp_avg_sq;
    for (size_t i = 0; i < held.size(); ++i)
      for (const Region& r : held[i])
        for (int64_t a = 0; a < r.count[0]; ++a)
          for (int64_t b = 0; b < r.count[1]; ++b)
            buf[size_t(held_index(s.shards, g, i, r.start[0] + a, r.start[1] + b))] =
                value_of(s.shards.local[i].name, g, r.start[0] + a, r.start[1] + b);
  }
  return s;
}
}  // namespace

TEST_CASE("pack and unpack move every element to its place (tp2 -> tp1, tp1 -> tp2 ZeRO chunks)",
          "[switch]") {
  ModelConfig m;
  m.vocab_size = 63;  // odd: tp=2 pads the vocabulary
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.seq_len = 8;
  for (int dir = 0; dir < 2; ++dir) {
    // dir 0: two tp ranks to one; dir 1: one rank to two tp ranks whose moments are chunks.
    std::vector<RankState> from, want;
    if (dir == 0) {
      from = {rank_state(m, 2, 0), rank_state(m, 2, 1)};
      want = {rank_state(m, 1, 0)};
    } else {
      from = {rank_state(m, 1, 0)};
      const int64_t n = total_numel(build_param_table(m, 2, 0));
      want = {rank_state(m, 2, 0, 0, n / 3), rank_state(m, 2, 1, n / 3, n)};
    }
    std::vector<RankShards> fs, ts;
    for (const RankState& s : from) fs.push_back(s.shards);
    for (const RankState& s : want) ts.push_back(s.shards);
    const std::vector<RegionMove> moves = plan_moves(fs, ts);
    REQUIRE(!moves.empty());
    for (size_t d = 0; d < want.size(); ++d) {
      RankState got = want[d];
      for (auto* v : {&got.params, &got.exp_avg, &got.exp_avg_sq}) std::fill(v->begin(), v->end(), -1.0f);
      // Padding is left alone: copy it from `want` so the comparison is of the moved elements.
      // Three ways: packed and unpacked; copied straight from the source's
      // buffers; read through process_vm_readv (this process as the "peer").
      RankState direct = got, cross = got;
      for (size_t s = 0; s < from.size(); ++s) {
        std::vector<float> payload;
        pack_moves(moves, int(s), from[s], payload, int(d));
        unpack_moves(moves, int(s), int(d), got, payload.data(), int64_t(payload.size()));
        StateView v = view_of(from[s]);
        CHECK(copy_moves(moves, int(s), from[s].shards, v, int(d), direct) ==
              int64_t(payload.size()));
        v.pid = int(getpid());
        CHECK(copy_moves(moves, int(s), from[s].shards, v, int(d), cross) ==
              int64_t(payload.size()));
      }
      CHECK(direct.params == got.params);
      CHECK(direct.exp_avg == got.exp_avg);
      CHECK(direct.exp_avg_sq == got.exp_avg_sq);
      CHECK(cross.params == got.params);
      CHECK(cross.exp_avg_sq == got.exp_avg_sq);
      for (int g = 0; g < 3; ++g) {
        const auto held = held_blocks(want[d].shards.local, want[d].shards.lay, g);
        const std::vector<float>& a = g == 0 ? got.params : g == 1 ? got.exp_avg : got.exp_avg_sq;
        const std::vector<float>& b = g == 0 ? want[d].params : g == 1 ? want[d].exp_avg : want[d].exp_avg_sq;
        int64_t wrong = 0, checked = 0;
        for (size_t i = 0; i < held.size(); ++i)
          for (const Region& r : held[i])
            for (int64_t x = 0; x < r.count[0]; ++x)
              for (int64_t y = 0; y < r.count[1]; ++y) {
                const auto at = size_t(held_index(want[d].shards, g, i, r.start[0] + x, r.start[1] + y));
                wrong += a[at] != b[at];
                ++checked;
              }
        INFO("direction " << dir << ", destination " << d << ", group " << g);
        CHECK(checked > 0);
        CHECK(wrong == 0);
      }
    }
    // A source buffer shorter than its table is refused, as is a read from
    // a process that does not exist.
    {
      RankState got = want[0];
      StateView v = view_of(from[0]);
      v.size[0] = 1;
      CHECK_THROWS(copy_moves(moves, 0, from[0].shards, v, 0, got));
      v = view_of(from[0]);
      v.pid = 0x7ffffff0;
      CHECK_THROWS_WITH(copy_moves(moves, 0, from[0].shards, v, 0, got),
                        Catch::Contains("from process 2147483632"));
    }
    // A short payload is refused.
    std::vector<float> payload;
    pack_moves(moves, 0, from[0], payload, 0);
    RankState got = want[0];
    CHECK_THROWS(unpack_moves(moves, 0, 0, got, payload.data(), int64_t(payload.size()) - 1));
  }
}

TEST_CASE("rank shards round-trip through JSON", "[switch]") {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 16;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 32;
  RankShards s;
  s.lay.tp = 2;
  s.lay.tp_rank = 1;
  s.lay.dp = 4;
  s.lay.dp_rank = 3;
  s.lay.state_lo = 10;
  s.lay.state_hi = 20;
  s.lay.description = "tp=2 dp=4";
  s.local = build_param_table(m, 2, 1);
  const RankShards t = rank_shards_from_json(rank_shards_json(s));
  CHECK(t.lay.tp_rank == 1);
  CHECK(t.lay.dp_rank == 3);
  CHECK(t.lay.state_lo == 10);
  CHECK(t.lay.state_hi == 20);
  CHECK(t.lay.description == "tp=2 dp=4");
  REQUIRE(t.local.size() == s.local.size());
  for (size_t i = 0; i < s.local.size(); ++i) {
    CHECK(t.local[i].name == s.local[i].name);
    CHECK(t.local[i].shape == s.local[i].shape);
    CHECK(t.local[i].global_shape == s.local[i].global_shape);
    CHECK(t.local[i].offset == s.local[i].offset);
    CHECK(t.local[i].shard_dim == s.local[i].shard_dim);
    CHECK(t.local[i].shard_valid == s.local[i].shard_valid);
  }
}

#include <functional>
#include <random>

#include "parallel/adapt/layer_balance.hpp"

TEST_CASE("speed-weighted layer split is the exact min-max split (brute force)", "[adapt][switch]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 4 + trial % 6, S = 2 + trial % 3;
    if (L < S) continue;
    std::vector<double> cost(static_cast<size_t>(L)), speed(static_cast<size_t>(S));
    for (double& c : cost) c = u(rng);
    for (double& v : speed) v = u(rng);
    const double first = u(rng) * 0.5, last = u(rng);
    const auto got = adapt::speed_weighted_split(cost, first, last, speed);
    REQUIRE(got.size() == size_t(S));
    int64_t sum = 0;
    for (int64_t n : got) {
      CHECK(n >= 1);
      sum += n;
    }
    CHECK(sum == L);
    const auto worst = [&](const std::vector<int64_t>& c) {
      const auto t = adapt::split_times(c, cost, first, last, speed);
      return *std::max_element(t.begin(), t.end());
    };
    // Every composition of L into S positive parts.
    double best = 1e300;
    std::vector<int64_t> c(static_cast<size_t>(S), 1);
    std::function<void(int, int64_t)> go = [&](int s, int64_t left) {
      if (s == S - 1) {
        c[size_t(s)] = left;
        best = std::min(best, worst(c));
        return;
      }
      for (int64_t n = 1; n <= left - (S - 1 - s); ++n) {
        c[size_t(s)] = n;
        go(s + 1, left - n);
      }
    };
    go(0, L);
    CHECK(worst(got) == Approx(best).epsilon(1e-12));
  }
  // A stage at half speed gets the fewest layers: 12 equal layers on 4 stages,
  // stage 1 at half speed: the slowest stage takes 4 units whatever the split
  // ({4, 2, 3, 3} too); of those, the least sum of squared times wins.
  const std::vector<double> cost(12, 1.0);
  CHECK(adapt::speed_weighted_split(cost, 0, 0, {1, 0.5, 1, 1}) == std::vector<int64_t>{3, 1, 4, 4});
  CHECK_THROWS(adapt::speed_weighted_split(cost, 0, 0, {1, 0, 1}));
  CHECK_THROWS(adapt::speed_weighted_split({1.0}, 0, 0, {1, 1}));
}

#include <chrono>

// Hidden (run by name): the packing rate of a tp2 -> tp1 plan of a ~27M-parameter model.
TEST_CASE("pack rate of a resharding plan", "[.switchbench]") {
  ModelConfig m;
  m.vocab_size = 256;
  m.d_model = 512;
  m.n_layers = 8;
  m.n_heads = 8;
  m.n_kv_heads = 8;
  m.ffn_hidden = 1536;
  m.seq_len = 64;
  std::vector<RankState> from = {rank_state(m, 2, 0), rank_state(m, 2, 1)};
  std::vector<RankState> want = {rank_state(m, 1, 0)};
  std::vector<RankShards> fs, ts;
  for (const RankState& s : from) fs.push_back(s.shards);
  for (const RankState& s : want) ts.push_back(s.shards);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RegionMove> moves = plan_moves(fs, ts);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<float> payload;
  pack_moves(moves, 0, from[0], payload, 0);
  const auto t2 = std::chrono::steady_clock::now();
  RankState got = want[0];
  unpack_moves(moves, 0, 0, got, payload.data(), int64_t(payload.size()));
  const auto t3 = std::chrono::steady_clock::now();
  const auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  WARN("moves " << moves.size() << ", payload " << payload.size() * 4 / 1e6 << " MB: plan " << s(t0, t1)
                << " s, pack " << s(t1, t2) << " s, unpack " << s(t2, t3) << " s");
  CHECK(!payload.empty());
}
