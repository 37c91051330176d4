// Stage partition for pipeline parallelism (parallel/cost/stages.hpp and
// core/model/stage_slice.hpp): the balancer against a brute force over every
// split (equal and per-layer costs), the stage -> rank mapping and explicit
// parallel.stage_layers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "core/config.hpp"
#include "core/model/stage_slice.hpp"
#include "parallel/cost/stages.hpp"

using namespace adgt;

namespace {

double stage_cost(const std::vector<int64_t>& counts, size_t s, double layer, double first,
                  double last) {
  return double(counts[s]) * layer + (s == 0 ? first : 0.0) +
         (s == counts.size() - 1 ? last : 0.0);
}

double max_cost(const std::vector<int64_t>& counts, double layer, double first, double last) {
  double m = 0;
  for (size_t s = 0; s < counts.size(); ++s)
    m = std::max(m, stage_cost(counts, s, layer, first, last));
  return m;
}

// The smallest largest-stage cost over every composition of L into S parts >= 1.
double brute_force(int64_t L, int S, double layer, double first, double last) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> c(size_t(S), 1);
  std::function<void(size_t, int64_t)> rec = [&](size_t s, int64_t left) {
    if (s + 1 == size_t(S)) {
      c[s] = left;
      best = std::min(best, max_cost(c, layer, first, last));
      return;
    }
    for (int64_t k = 1; k <= left - int64_t(size_t(S) - s - 1); ++k) {
      c[s] = k;
      rec(s + 1, left - k);
    }
  };
  rec(0, L);
  return best;
}

// Per-layer costs: stage s of `counts` costs its layers' sum plus its extras.
std::vector<double> stage_costs(const std::vector<int64_t>& counts,
                                const std::vector<double>& layers, double first, double last) {
  std::vector<double> out;
  size_t l = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    double c = (s == 0 ? first : 0.0) + (s + 1 == counts.size() ? last : 0.0);
    for (int64_t k = 0; k < counts[s]; ++k) c += layers[l++];
    out.push_back(c);
  }
  return out;
}

// Over every composition of the layers into S parts >= 1: the smallest largest
// stage cost, and the smallest sum of squared stage costs among the splits
// within `tol` of that optimum.
std::pair<double, double> brute_force(const std::vector<double>& layers, int S, double first,
                                      double last, double tol) {
  std::vector<std::vector<int64_t>> all;
  std::vector<int64_t> c(size_t(S), 1);
  const int64_t L = int64_t(layers.size());
  std::function<void(size_t, int64_t)> rec = [&](size_t s, int64_t left) {
    if (s + 1 == size_t(S)) {
      c[s] = left;
      all.push_back(c);
      return;
    }
    for (int64_t k = 1; k <= left - int64_t(size_t(S) - s - 1); ++k) {
      c[s] = k;
      rec(s + 1, left - k);
    }
  };
  rec(0, L);
  double best = std::numeric_limits<double>::infinity(), sq = best;
  for (const auto& x : all) {
    const auto cs = stage_costs(x, layers, first, last);
    best = std::min(best, *std::max_element(cs.begin(), cs.end()));
  }
  for (const auto& x : all) {
    const auto cs = stage_costs(x, layers, first, last);
    if (*std::max_element(cs.begin(), cs.end()) > best + tol) continue;
    double q = 0;
    for (double v : cs) q += v * v;
    sq = std::min(sq, q);
  }
  return {best, sq};
}

void check_counts(const std::vector<int64_t>& c, int64_t L, size_t S) {
  REQUIRE(c.size() == S);
  CHECK(std::accumulate(c.begin(), c.end(), int64_t{0}) == L);
  for (int64_t k : c) CHECK(k >= 1);
}

}  // namespace

TEST_CASE("balance_layers is optimal against a brute force", "[pipeline_stages]") {
  std::mt19937 rng(20240605);
  std::uniform_real_distribution<double> layer_d(0.1, 10.0), extra_d(0.0, 30.0);
  std::uniform_int_distribution<int> zero(0, 3);
  for (int S = 1; S <= 4; ++S)
    for (int64_t L = S; L <= 10; ++L)
      for (int trial = 0; trial < 25; ++trial) {
        const double layer = layer_d(rng);
        // Some trials with exact zeros and exact multiples, where ties happen.
        double first = zero(rng) == 0 ? 0.0 : extra_d(rng);
        double last = zero(rng) == 0 ? 0.0 : extra_d(rng);
        if (trial % 5 == 0) first = 0, last = 2 * layer;
        INFO("L=" << L << " S=" << S << " layer=" << layer << " first=" << first
                  << " last=" << last);
        const auto c = balance_layers(L, S, layer, first, last);
        check_counts(c, L, size_t(S));
        // Equal up to rounding (the two may sum the same terms in another order).
        CHECK(max_cost(c, layer, first, last) ==
              Approx(brute_force(L, S, layer, first, last)).epsilon(1e-9));
      }
}

TEST_CASE("balance_layers: equal costs and its tie rule", "[pipeline_stages]") {
  CHECK(balance_layers(8, 4, 1.0, 0, 0) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(balance_layers(7, 2, 1.0, 0, 0) == std::vector<int64_t>{3, 4});  // earlier gets fewer
  CHECK(balance_layers(10, 4, 1.0, 0, 0) == std::vector<int64_t>{2, 2, 3, 3});
  CHECK(balance_layers(5, 1, 1.0, 3, 4) == std::vector<int64_t>{5});
  CHECK(balance_layers(4, 4, 1.0, 100, 100) == std::vector<int64_t>{1, 1, 1, 1});
  // A head worth two layers: the last stage gives two up.
  CHECK(balance_layers(10, 2, 1.0, 0, 2) == std::vector<int64_t>{6, 4});
  // Deterministic: the same inputs give the same split.
  CHECK(balance_layers(37, 4, 1.7, 0.3, 5.1) == balance_layers(37, 4, 1.7, 0.3, 5.1));
  CHECK_THROWS_AS(balance_layers(3, 4, 1.0, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(balance_layers(4, 2, 0.0, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(balance_layers(4, 0, 1.0, 0, 0), std::invalid_argument);
}

TEST_CASE("balance_layers with per-layer costs is optimal against a brute force",
          "[pipeline_stages]") {
  std::mt19937 rng(20240606);
  std::uniform_real_distribution<double> layer_d(0.1, 10.0), extra_d(0.0, 30.0);
  std::uniform_int_distribution<int> zero(0, 3), kind(0, 2);
  for (int S = 1; S <= 4; ++S)
    for (int64_t L = S; L <= 9; ++L)
      for (int trial = 0; trial < 20; ++trial) {
        // Random costs, or two kinds alternating (dense and MoE layers).
        std::vector<double> layers(static_cast<size_t>(L));
        const double a = layer_d(rng), b = layer_d(rng);
        for (int64_t l = 0; l < L; ++l) layers[size_t(l)] = trial % 2 ? layer_d(rng) : l % 2 ? b : a;
        double first = zero(rng) == 0 ? 0.0 : extra_d(rng);
        double last = zero(rng) == 0 ? 0.0 : extra_d(rng);
        INFO("L=" << L << " S=" << S << " trial=" << trial << " first=" << first
                  << " last=" << last);
        const auto c = balance_layers(layers, S, first, last);
        check_counts(c, L, size_t(S));
        double total = first + last;
        for (double x : layers) total += x;
        const auto [best, sq] = brute_force(layers, S, first, last, 1e-12 * total);
        const auto cs = stage_costs(c, layers, first, last);
        CHECK(*std::max_element(cs.begin(), cs.end()) == Approx(best).epsilon(1e-9));
        if (!std::all_of(layers.begin(), layers.end(), [&](double x) { return x == layers[0]; })) {
          double q = 0;
          for (double v : cs) q += v * v;
          CHECK(q == Approx(sq).epsilon(1e-9));
        }
      }
  // Equal costs: exactly the split of the single-cost overload (its tie rule).
  CHECK(balance_layers(std::vector<double>(10, 1.0), 4, 0, 0) == std::vector<int64_t>{2, 2, 3, 3});
  CHECK(balance_layers(std::vector<double>(37, 1.7), 4, 0.3, 5.1) ==
        balance_layers(37, 4, 1.7, 0.3, 5.1));
  // Among the splits of largest cost 4, {3, 3, 1} (costs 3, 3, 4) has the
  // smallest squares ({2, 4, 1} and {4, 2, 1} have 36, not 34); among equal
  // squares the earlier stage has fewer layers.
  CHECK(balance_layers({1, 1, 1, 1, 1, 1, 4}, 3, 0, 0) == std::vector<int64_t>{3, 3, 1});
  CHECK(balance_layers({1, 1, 1, 2}, 2, 0, 0) == std::vector<int64_t>{2, 2});
  CHECK(balance_layers({2, 1, 1, 1, 1, 2}, 3, 0, 0) == std::vector<int64_t>{1, 3, 2});
  CHECK_THROWS_AS(balance_layers({1, 2}, 3, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(balance_layers({1, 0}, 2, 0, 0), std::invalid_argument);
}

TEST_CASE("stage_cost_model counts a layer, the embedding and the head", "[pipeline_stages]") {
  ModelConfig m;  // d 256, 8 heads / 4 kv (hd 32), ffn 688, vocab 4096, T 256, 4 layers
  StageCostModel c = stage_cost_model(m);
  const double C = 256, kv = 4 * 32, F = 688, V = 4096, T = 256;
  REQUIRE(c.layers.size() == 4);
  for (double layer : c.layers)
    CHECK(layer == Approx(6 * (2 * C * C + 2 * C * kv + 3 * C * F) + 6 * T * C));
  CHECK(c.head == Approx(6 * C * V));
  CHECK(c.embedding == Approx(3 * C));
  // MoE every second layer (top-2 of 4 experts of width 128): those layers pay
  // two experts and the router instead of the dense FFN.
  m.n_experts = 4, m.moe_top_k = 2, m.moe_every = 2, m.expert_ffn_hidden = 128;
  c = stage_cost_model(m);
  const double attn = 6 * (2 * C * C + 2 * C * kv) + 6 * T * C;
  CHECK(c.layers[0] == Approx(attn + 6 * 3 * C * F));
  CHECK(c.layers[1] == Approx(attn + 2 * 6 * 3 * C * 128 + 6 * C * 4));
  CHECK(c.layers[2] == c.layers[0]);
  CHECK(c.layers[3] == c.layers[1]);
  // Its split on pp = 2 is the optimum over these per-layer costs.
  RunConfig cfg;
  cfg.model = m;
  cfg.parallel.pp = 2;
  const auto counts = stage_layer_counts(cfg);
  check_counts(counts, 4, 2);
  const auto cs = stage_costs(counts, c.layers, c.embedding, c.head);
  CHECK(*std::max_element(cs.begin(), cs.end()) ==
        Approx(brute_force(c.layers, 2, c.embedding, c.head, 0).first).epsilon(1e-12));
}

TEST_CASE("stage_layer_counts: balanced, equal for interleaved, or as listed",
          "[pipeline_stages]") {
  RunConfig cfg;
  cfg.model.n_layers = 8;
  CHECK(stage_layer_counts(cfg) == std::vector<int64_t>{8});  // pp = 1

  // The default (tiny) model on pp = 4: the head (6*C*V) costs 1.33 layers,
  // so the last stage holds one layer and a middle stage three.
  cfg.parallel.pp = 4;
  auto c = stage_layer_counts(cfg);
  check_counts(c, 8, 4);
  StageCostModel cm = stage_cost_model(cfg.model);
  CHECK(cm.head / cm.layers[0] == Approx(1.326).epsilon(0.01));
  CHECK(max_cost(c, cm.layers[0], cm.embedding, cm.head) ==
        Approx(brute_force(8, 4, cm.layers[0], cm.embedding, cm.head)).epsilon(1e-9));
  CHECK(c == std::vector<int64_t>{2, 2, 3, 1});

  // LLaMA-7B shapes on pp = 4: the head costs 0.6 of a layer, equal counts are optimal.
  cfg.model.d_model = 4096, cfg.model.n_heads = 32, cfg.model.n_kv_heads = 32;
  cfg.model.ffn_hidden = 11008, cfg.model.vocab_size = 32000, cfg.model.seq_len = 4096;
  cfg.model.n_layers = 32;
  c = stage_layer_counts(cfg);
  cm = stage_cost_model(cfg.model);
  CHECK(max_cost(c, cm.layers[0], cm.embedding, cm.head) ==
        Approx(brute_force(32, 4, cm.layers[0], cm.embedding, cm.head)).epsilon(1e-9));
  CHECK(c == std::vector<int64_t>{8, 8, 8, 8});

  // Interleaved: equal counts, whatever the head costs.
  cfg.parallel.virtual_stages = 2;
  CHECK(stage_layer_counts(cfg) == std::vector<int64_t>(8, 4));

  // An explicit list is returned as given.
  cfg.parallel.virtual_stages = 1;
  cfg.parallel.stage_layers = {10, 8, 8, 6};
  CHECK(stage_layer_counts(cfg) == std::vector<int64_t>{10, 8, 8, 6});
  cfg.parallel.stage_layers = {10, 8, 8};
  CHECK_THROWS_AS(stage_layer_counts(cfg), std::invalid_argument);
}

TEST_CASE("stage_slice maps chunk c of rank r to stage c*pp + r", "[pipeline_stages]") {
  // pp = 4, v = 2: 8 stages of 2 layers.
  const std::vector<int64_t> counts(8, 2);
  const StageSlice r1 = stage_slice(counts, 4, 2, 1);  // stages 1 and 5
  REQUIRE(r1.chunks.size() == 2);
  CHECK(r1.chunks[0] == std::pair<int64_t, int64_t>{2, 4});
  CHECK(r1.chunks[1] == std::pair<int64_t, int64_t>{10, 12});
  CHECK(!r1.embedding);
  CHECK(!r1.head);
  CHECK(r1.num_layers() == 4);
  const StageSlice r0 = stage_slice(counts, 4, 2, 0);  // stages 0 and 4
  CHECK(r0.chunks[0] == std::pair<int64_t, int64_t>{0, 2});
  CHECK(r0.chunks[1] == std::pair<int64_t, int64_t>{8, 10});
  CHECK(r0.embedding);
  CHECK(!r0.head);
  const StageSlice r3 = stage_slice(counts, 4, 2, 3);  // stages 3 and 7
  CHECK(r3.chunks[1] == std::pair<int64_t, int64_t>{14, 16});
  CHECK(!r3.embedding);
  CHECK(r3.head);

  // Uneven counts, v = 1: every layer on exactly one rank, in order.
  const std::vector<int64_t> uneven = {3, 1, 4, 2};
  int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const StageSlice s = stage_slice(uneven, 4, 1, r);
    REQUIRE(s.chunks.size() == 1);
    CHECK(s.chunks[0].first == next);
    CHECK(s.num_layers() == uneven[size_t(r)]);
    next = s.chunks[0].second;
    CHECK(s.embedding == (r == 0));
    CHECK(s.head == (r == 3));
  }
  CHECK(next == 10);

  // One rank holds everything.
  const StageSlice one = stage_slice({5}, 1, 1, 0);
  CHECK(one.chunks == std::vector<std::pair<int64_t, int64_t>>{{0, 5}});
  CHECK(one.embedding);
  CHECK(one.head);
  ModelConfig m;
  m.n_layers = 5;
  const StageSlice w = whole_model(m);
  CHECK(w.chunks == one.chunks);
  CHECK(w.embedding);
  CHECK(w.head);
  CHECK(w.num_layers() == 5);

  CHECK_THROWS_AS(stage_slice(counts, 4, 2, 4), std::invalid_argument);
  CHECK_THROWS_AS(stage_slice(counts, 4, 1, 0), std::invalid_argument);
}

TEST_CASE("stage_layers from the config drive the slices", "[pipeline_stages]") {
  const RunConfig cfg = load_config_text(
      "model:\n  n_layers: 8\nparallel:\n  pp: 2\n  stage_layers: [5, 3]\n"
      "train:\n  micro_batch: 1\n  global_batch: 4\n",
      "x.yaml");
  const auto counts = stage_layer_counts(cfg);
  CHECK(counts == std::vector<int64_t>{5, 3});
  CHECK(stage_slice(counts, 2, 1, 0).chunks[0] == std::pair<int64_t, int64_t>{0, 5});
  CHECK(stage_slice(counts, 2, 1, 1).chunks[0] == std::pair<int64_t, int64_t>{5, 8});
}

TEST_CASE("stage_slice on the vee placement (zb-v): rank r holds stages r and 2pp-1-r",
          "[pipeline_stages]") {
  // pp = 4, v = 2: 8 stages of 2 layers; rank 0 holds the first and the last.
  const std::vector<int64_t> counts(8, 2);
  const StageSlice r0 = stage_slice(counts, 4, 2, 0, StagePlacement::vee);  // stages 0 and 7
  CHECK(r0.chunks == std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {14, 16}});
  CHECK(r0.embedding);
  CHECK(r0.head);  // on its last chunk, as with looped
  const StageSlice r3 = stage_slice(counts, 4, 2, 3, StagePlacement::vee);  // stages 3 and 4
  CHECK(r3.chunks == std::vector<std::pair<int64_t, int64_t>>{{6, 8}, {8, 10}});
  CHECK(!r3.embedding);
  CHECK(!r3.head);
  // Every layer on exactly one chunk of one rank, uneven counts too.
  const std::vector<int64_t> uneven = {1, 2, 3, 1, 2, 1};
  std::vector<int> seen(10, 0);
  for (int r = 0; r < 3; ++r) {
    const StageSlice s = stage_slice(uneven, 3, 2, r, StagePlacement::vee);
    REQUIRE(s.chunks.size() == 2);
    CHECK(s.chunks[0].second - s.chunks[0].first == uneven[size_t(r)]);
    CHECK(s.chunks[1].second - s.chunks[1].first == uneven[size_t(5 - r)]);
    for (const auto& [a, b] : s.chunks)
      for (int64_t l = a; l < b; ++l) ++seen[size_t(l)];
    CHECK(s.embedding == (r == 0));
    CHECK(s.head == (r == 0));
  }
  CHECK(seen == std::vector<int>(10, 1));
  CHECK(placement_of_schedule("zb-v") == StagePlacement::vee);
  CHECK(placement_of_schedule("greedy") == StagePlacement::looped);
  CHECK_THROWS_AS(stage_slice(std::vector<int64_t>(12, 1), 4, 3, 0, StagePlacement::vee),
                  std::invalid_argument);
}
