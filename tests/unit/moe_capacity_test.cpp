// Expert capacity groups that span context-parallel ranks
// (core/model/moe_capacity.hpp, Backend::MoeCapacity's priors): each rank's
// plan of its chunks, from the all-gathered run counts, must keep and drop
// exactly the assignments one process keeps and drops on the whole
// micro-batch (the plan without priors, one group per segment).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "core/model/moe_capacity.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace {
using namespace adgt;

// cp rank r of P: chunks r and 2P-1-r of c tokens each (parallel/cp/chunks.hpp).
std::vector<int64_t> chunk_positions(int r, int P, int64_t c) {
  std::vector<int64_t> p;
  for (int64_t chunk : {int64_t(r), int64_t(2 * P - 1 - r)})
    for (int64_t i = 0; i < c; ++i) p.push_back(chunk * c + i);
  return p;
}

struct Plan {
  std::vector<int32_t> pos;
  double dropped = 0;
};

Plan plan(CpuBackend& be, std::vector<int32_t> choice, int64_t N, int64_t E, int64_t k,
          const Backend::MoeCapacity& cap) {
  std::vector<float> probs(size_t(N * E), 1.0f / float(E));
  std::vector<int32_t> slot(static_cast<size_t>(E)), tok(static_cast<size_t>(std::max<int64_t>(N * k, 1)));
  for (int64_t e = 0; e < E; ++e) slot[size_t(e)] = int32_t(e);
  Plan p;
  p.pos.assign(size_t(N * k), 0);
  std::vector<double> st(size_t(3 * E + 2));
  be.moe_dispatch_plan(Tensor(p.pos.data(), DType::I32, {N, k}), Tensor(tok.data(), DType::I32, {N * k}),
                       Tensor(st.data(), DType::F64, {3 * E + 2}),
                       Tensor(choice.data(), DType::I32, {N, k}), Tensor(probs.data(), DType::F32, {N, E}),
                       Tensor(slot.data(), DType::I32, {E}), cap);
  p.dropped = st[size_t(2 * E + 1)];
  return p;
}

}  // namespace

TEST_CASE("moe capacity runs: the largest run inside one group and one chunk", "[moe][cp]") {
  // seq_len 24 at cp2: chunks of 6; rank 0 holds positions 0-5 and 18-23.
  MoeSequenceSplit s{nullptr, chunk_positions(0, 2, 6), 24, 6};
  const int64_t N = 3 * 12;  // B = 3 sequences
  auto runs = [&](int64_t seg) { return moe_capacity_runs(s, seg, N); };
  CHECK(runs(0).run == 6);
  CHECK(runs(0).group_rows == 72);  // the whole micro-batch
  CHECK(runs(0).spans);
  CHECK(runs(12).run == 6);
  CHECK(runs(12).group_rows == 12);
  CHECK(runs(12).spans);
  CHECK(runs(8).run == 2);  // groups of 8 cut chunks of 6 at 2s
  CHECK(runs(8).spans);
  CHECK(runs(3).run == 3);  // inside the chunks: no counts from other ranks
  CHECK_FALSE(runs(3).spans);
  CHECK_FALSE(runs(6).spans);
  CHECK(moe_run_starts(s, 6, N) == std::vector<int64_t>{0, 18, 24, 42, 48, 66});
  CHECK_THROWS(moe_capacity_runs(s, 0, 35));  // not whole sequences
  // cp3's middle rank holds chunks 2 and 3, adjacent: its runs are still
  // chunk-sized, as on the other ranks (the all-gather's sizes agree).
  CHECK(moe_capacity_runs({nullptr, chunk_positions(2, 3, 4), 24, 4}, 0, 24).run == 4);
  CHECK_THROWS(moe_capacity_runs({nullptr, {0, 1, 2, 3, 5, 6, 7, 8}, 24, 4}, 0, 8));
}

TEST_CASE("moe capacity: groups spanning cp ranks drop what one process drops", "[moe][cp]") {
  CpuBackend be;
  const int64_t B = 3, T = 24, E = 4, k = 2;
  std::mt19937 rng(11);
  for (int P : {2, 3}) {
    const int64_t c = T / (2 * P), Tl = 2 * c, Nl = B * Tl, N = B * T;
    // Skewed choices: expert 0 most often, so caps bind.
    std::vector<int32_t> full(size_t(N * k));
    std::discrete_distribution<int> pick({6, 3, 2, 1});
    for (int64_t t = 0; t < N; ++t) {
      const int a = pick(rng);
      int b = pick(rng);
      while (b == a) b = pick(rng);
      full[size_t(t * k)] = a, full[size_t(t * k + 1)] = b;
    }
    for (int64_t seg : {int64_t(0), int64_t(12), int64_t(8), int64_t(24), int64_t(2)})
      for (double cf : {0.5, 1.0}) {
        CAPTURE(P, seg, cf);
        const Plan one = plan(be, full, N, E, k, {.factor = cf, .segment = seg});
        REQUIRE(one.dropped > 0);
        // Each rank: its chunks' choices, run counts, then the all-gather.
        std::vector<std::vector<int32_t>> local(static_cast<size_t>(P));
        std::vector<double> gathered;
        MoeCapacityRuns runs{};
        std::vector<MoeSequenceSplit> split;
        for (int r = 0; r < P; ++r) {
          split.push_back({nullptr, chunk_positions(r, P, c), T, c});
          for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < Tl; ++j)
              for (int64_t i = 0; i < k; ++i)
                local[size_t(r)].push_back(full[size_t((b * T + split[size_t(r)].positions[size_t(j)]) * k + i)]);
          runs = moe_capacity_runs(split[size_t(r)], seg, Nl);
          const auto cnt = moe_run_counts(local[size_t(r)].data(), Nl, k, E, runs.run);
          const auto st = moe_run_starts(split[size_t(r)], runs.run, Nl);
          for (size_t i = 0; i < st.size(); ++i) {
            gathered.push_back(double(st[i]));
            for (int64_t e = 0; e < E; ++e) gathered.push_back(double(cnt[i * size_t(E) + size_t(e)]));
          }
        }
        double dropped = 0;
        for (int r = 0; r < P; ++r) {
          const int64_t R = Nl / runs.run;
          std::vector<int32_t> prior = moe_run_priors(gathered, r, P, R, E, runs.group_rows);
          Backend::MoeCapacity cap{.factor = cf, .segment = seg};
          if (runs.spans) {
            cap.segment = runs.run, cap.group_rows = runs.group_rows;
            cap.prior = Tensor(prior.data(), DType::I32, {R, E});
          }
          const Plan mine = plan(be, local[size_t(r)], Nl, E, k, cap);
          dropped += mine.dropped;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < Tl; ++j)
              for (int64_t i = 0; i < k; ++i) {
                const int64_t g = (b * T + split[size_t(r)].positions[size_t(j)]) * k + i;
                CHECK((mine.pos[size_t((b * Tl + j) * k + i)] < 0) == (one.pos[size_t(g)] < 0));
              }
        }
        CHECK(dropped == one.dropped);
      }
  }
  // Without the priors (each rank's rows its own groups) the drops differ:
  // the check above can fail.
  {
    const int P = 2;
    const int64_t c = T / 4, Tl = 2 * c, Nl = B * Tl;
    std::vector<int32_t> ch(size_t(Nl * k));
    for (int64_t t = 0; t < Nl; ++t) ch[size_t(t * k)] = 0, ch[size_t(t * k + 1)] = 1;
    MoeSequenceSplit s{nullptr, chunk_positions(0, P, c), T, c};
    const MoeCapacityRuns runs = moe_capacity_runs(s, 0, Nl);
    const int64_t R = Nl / runs.run;
    std::vector<double> gathered;
    for (int r = 0; r < P; ++r) {
      const auto st = moe_run_starts({nullptr, chunk_positions(r, P, c), T, c}, runs.run, Nl);
      const auto cnt = moe_run_counts(ch.data(), Nl, k, E, runs.run);
      for (size_t i = 0; i < st.size(); ++i) {
        gathered.push_back(double(st[i]));
        for (int64_t e = 0; e < E; ++e) gathered.push_back(double(cnt[i * size_t(E) + size_t(e)]));
      }
    }
    std::vector<int32_t> prior = moe_run_priors(gathered, 1, P, R, E, runs.group_rows);
    // Rank 1's first run (chunk 1 of sequence 0) follows rank 0's chunk 0.
    CHECK(prior[0] == int32_t(c));
    CHECK(prior[1] == int32_t(c));
    CHECK(prior[2] == 0);
    const Plan with = plan(be, ch, Nl, E, k,
                           {.factor = 0.5, .segment = runs.run, .group_rows = runs.group_rows,
                            .prior = Tensor(prior.data(), DType::I32, {R, E})});
    const Plan without = plan(be, ch, Nl, E, k, {.factor = 0.5});
    CHECK(with.dropped != without.dropped);
    // Overlapping chunks are refused by name.
    std::vector<double> twice = gathered;
    std::copy(gathered.begin(), gathered.begin() + (E + 1), twice.begin() + R * (E + 1));
    CHECK_THROWS(moe_run_priors(twice, 0, P, R, E, runs.group_rows));
  }
}
