// Expert capacity groups that span ranks (moe_capacity.hpp).
#include "core/model/moe_capacity.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "kernels/check.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {

MoeCapacityRuns moe_capacity_runs(const MoeSequenceSplit& s, int64_t segment, int64_t N) {
  ADGT_CHECK(segment >= 0, "moe: capacity_segment=" << segment << " must be >= 0");
  const auto T = int64_t(s.positions.size());
  ADGT_CHECK(T > 0 && N % T == 0 && s.seq_len >= T && s.chunk > 0 && T % s.chunk == 0 &&
                 s.seq_len % s.chunk == 0,
             "moe: " << N << " rows are not whole sequences of this rank's " << T << " of "
                     << s.seq_len << " tokens in chunks of " << s.chunk
                     << " (context parallelism)");
  for (int64_t j = 0; j < T; ++j) {
    const int64_t p = s.positions[size_t(j)];
    ADGT_CHECK(p >= 0 && p < s.seq_len &&
                   (j % s.chunk == 0 ? p % s.chunk == 0 : p == s.positions[size_t(j) - 1] + 1),
               "moe: position " << p << " of local token " << j << " (chunks of " << s.chunk
                                << " consecutive positions < seq_len=" << s.seq_len
                                << " expected)");
  }
  const int64_t G = segment > 0 ? segment : N / T * s.seq_len;
  ADGT_CHECK(s.seq_len % G == 0 || G % s.seq_len == 0,
             "moe: capacity_segment=" << segment << " does not divide seq_len=" << s.seq_len);
  // Runs: the largest length that no group boundary or chunk edge (nor so a
  // sequence's end) falls inside; the same on every rank.
  const int64_t L = std::gcd(G, s.chunk);
  return {L, G, !(segment > 0 && L == segment)};
}

std::vector<int64_t> moe_run_starts(const MoeSequenceSplit& s, int64_t run, int64_t N) {
  const auto T = int64_t(s.positions.size());
  std::vector<int64_t> out;
  out.reserve(size_t(N / run));
  for (int64_t row = 0; row < N; row += run)
    out.push_back(row / T * s.seq_len + s.positions[size_t(row % T)]);
  return out;
}

std::vector<int64_t> moe_run_counts(const int32_t* choice, int64_t N, int64_t k, int64_t E,
                                    int64_t run) {
  std::vector<int64_t> c(size_t(N / run * E), 0);
  for (int64_t a = 0; a < N * k; ++a) {
    ADGT_CHECK(choice[a] >= 0 && choice[a] < E,
               "moe: choice[" << a << "] = " << choice[a] << " outside 0.." << E - 1);
    ++c[size_t(a / k / run * E + choice[a])];
  }
  return c;
}

std::vector<int32_t> moe_run_priors(const std::vector<double>& gathered, int rank, int P,
                                    int64_t R, int64_t E, int64_t group_rows) {
  ADGT_CHECK(int64_t(gathered.size()) == int64_t(P) * R * (E + 1),
             "moe: " << gathered.size() << " gathered run counts, expected " << P << " ranks x "
                     << R << " runs x " << E + 1);
  auto at = [&](int r, int64_t i) { return gathered.data() + (int64_t(r) * R + i) * (E + 1); };
  std::vector<std::tuple<int64_t, int, int64_t>> order;  // start, rank, run
  order.reserve(size_t(P * R));
  for (int r = 0; r < P; ++r)
    for (int64_t i = 0; i < R; ++i) order.emplace_back(int64_t(at(r, i)[0]), r, i);
  std::sort(order.begin(), order.end());
  std::vector<int32_t> prior(size_t(R * E), 0);
  std::vector<int64_t> sum(size_t(E), 0);
  int64_t group = -1;
  for (size_t n = 0; n < order.size(); ++n) {
    const auto [start, r, i] = order[n];
    ADGT_CHECK(n == 0 || start != std::get<0>(order[n - 1]),
               "moe: two ranks of the context-parallel group hold the run at token "
                   << start << " of the micro-batch (ranks " << std::get<1>(order[n - 1]) << " and "
                   << r << "): their chunks overlap");
    if (start / group_rows != group) group = start / group_rows, std::fill(sum.begin(), sum.end(), 0);
    for (int64_t e = 0; e < E; ++e) {
      if (r == rank) prior[size_t(i * E + e)] = int32_t(sum[size_t(e)]);
      sum[size_t(e)] += int64_t(at(r, i)[1 + e]);
    }
  }
  return prior;
}

int64_t moe_recv_reserve(double factor, int64_t segment, int64_t N, int64_t k, int64_t E, int64_t P,
                         int64_t El) {
  if (factor <= 0) return N * k;
  const int64_t seg = segment > 0 ? segment : std::max<int64_t>(N, 1);
  int64_t per = 0;  // one sender's most rows of one expert
  for (int64_t g0 = 0; g0 < N; g0 += seg)
    per += moe_capacity_limit(Backend::MoeCapacity{.factor = factor}, std::min(seg, N - g0), k, E);
  return std::min(P * El * std::min(N, per), P * N * std::min(k, El));
}

}  // namespace adgt
