// The compressed reduce of one bucket (parallel/compress/bucket_reduce.hpp)
// under mpirun on 4 ranks:  mpirun -np 4 adgt_compress_reduce_test
//
//  - exact cases: inputs every codec represents exactly (compressed elements
//    +-qmax, with signs that sum to 0 or +-4 qmax over the ranks; exact
//    elements small integers), so the result must be the fp32 sum, computed
//    here from the definition, bit for bit — for the all-reduce and, for
//    ZeRO-1, the reduce-scatter's own chunk [r n/D, (r+1) n/D);
//  - random inputs: every rank's result bitwise identical, within the
//    codec's error of the sum;
//  - int2 and int3 (no zero level, an rms step): blocks built of its levels,
//    the same on every rank, exact likewise;
//  - bytes each rank sent (Comm stats) against the fp32 ring's;
//  - PowerSGD on matrices whose sum has rank r: exact to fp32 rounding;
//  - batches (reduce_buckets): three buckets of one level reduced together
//    give bit for bit the per-bucket results, residuals and Q (quantized
//    with an all-reduce and a reduce-scatter bucket mixed; PowerSGD at ranks
//    1, 2, 3 in one batch) over 3 steps, in 2 collectives instead of up to 6;
//    all_reduce_batched equals one all-reduce per buffer bit for bit.
// Prints every failure with its rank; exits non-zero on any.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/compress/block_codec.hpp"
#include "parallel/compress/bucket_reduce.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;
using namespace adgt::compress;

namespace {

ParamSpec spec(const char* name, std::vector<int64_t> shape, int64_t offset) {
  ParamSpec p;
  p.name = name;
  p.shape = shape;
  p.global_shape = shape;
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  p.offset = offset;
  p.is_matrix = shape.size() == 2;
  return p;
}

// A bucket of matrices, a 1-D tensor and a small matrix (both sent exact).
std::vector<ParamSpec> mixed_table(int64_t& n) {
  std::vector<ParamSpec> t = {spec("a.weight", {64, 72}, 0), spec("a.bias", {32}, 4608),
                              spec("b.weight", {48, 100}, 4640), spec("c.weight", {8, 8}, 9440)};
  n = 9504;  // divisible by 4 (ZeRO-1)
  return t;
}

uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return uint32_t(x);
}

bool compressed_at(const std::vector<ParamSpec>& t, int64_t i, int64_t min_elems) {
  for (const ParamSpec& p : t)
    if (i >= p.offset && i < p.offset + p.numel) return p.shape.size() == 2 && p.numel >= min_elems;
  return false;
}

// Rank r's exact-case input at element i.
float exact_input(const std::vector<ParamSpec>& t, int r, int64_t i, int qmax) {
  if (!compressed_at(t, i, 4096)) return float(int(mix(uint64_t(i) * 7 + uint64_t(r)) % 41) - 20);
  const uint32_t h = mix(uint64_t(i));
  if (i % 4 != 3) return (h & 1) ? float(qmax) : -float(qmax);  // all ranks agree
  static const int balanced[6][4] = {{1, 1, -1, -1}, {1, -1, 1, -1}, {1, -1, -1, 1},
                                     {-1, 1, 1, -1}, {-1, 1, -1, 1}, {-1, -1, 1, 1}};
  return float(balanced[h % 6][r] * qmax);
}

void test_exact(MpiComm& c, Level l, bool rs) {
  int64_t n = 0;
  const std::vector<ParamSpec> t = mixed_table(n);
  const int D = c.size(), me = c.rank();
  const int qmax = l == Level::Int4 ? 7 : 127;
  std::vector<float> g(static_cast<size_t>(n)), want(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    g[size_t(i)] = exact_input(t, me, i, qmax);
    for (int r = 0; r < D; ++r) want[size_t(i)] += exact_input(t, r, i, qmax);  // fp32, rank order
  }
  Settings s;
  s.min_elems = 4096;
  BucketCodecState st;
  for (int step = 0; step < 2; ++step) {  // the second step runs with the (zero) residuals
    std::vector<float> x = g;
    reduce_bucket(c, l, BucketView{x.data(), 0, n, rs}, t, s, st);
    const int64_t lo = rs ? me * n / D : 0, hi = rs ? lo + n / D : n;
    int64_t bad = 0, first = -1;
    for (int64_t i = lo; i < hi; ++i)
      if (std::memcmp(&x[size_t(i)], &want[size_t(i)], 4) != 0 && bad++ == 0) first = i;
    PCHECK(bad == 0, level_name(l) << (rs ? " reduce-scatter" : " all-reduce") << " step " << step
                                   << ": " << bad << " elements differ from the fp32 sum, first at "
                                   << first << ": " << x[size_t(std::max<int64_t>(first, 0))]
                                   << " vs " << want[size_t(std::max<int64_t>(first, 0))]);
    for (float v : st.residual) PCHECK(v == 0.0f, "exact inputs left a residual " << v);
  }
}

// int2's exact case: its four levels (q + 1/2) s have no zero, and s is the
// block's rms, so a block decodes exactly when 3/8 of its elements are
// +-3c/2 and 5/8 are +-c/2 (rms c). The table's chunks over 4 ranks pack
// blocks whose lengths are multiples of 8 (2056 = 8 x 257 and 2040 elements
// of the matrices a chunk holds), and each rank's compressed element at
// packed position p of its chunk gets magnitude 3c/2 when p % 8 < 3; every
// rank sends the same value there, so the owner's sum is 4 times one such
// block (rms 4c) and decodes exactly too. The bias (exact elements, bf16 at
// int2) holds small integers that differ per rank. int3 (l = Int3) gets
// blocks of its own (below), summed exactly the same way.
void test_exact_rms(MpiComm& c, Level l, bool rs) {
  const std::vector<ParamSpec> t = {spec("a.weight", {64, 64}, 0), spec("a.bias", {32}, 4096),
                                    spec("b.weight", {64, 64}, 4128)};
  const int64_t n = 8224;
  const int D = c.size(), me = c.rank();
  const float unit = std::ldexp(1.0f, -6);
  std::vector<float> g(static_cast<size_t>(n)), want(size_t(n), 0.0f);
  std::vector<int64_t> packed(static_cast<size_t>(n), -1);  // position in its chunk's packed elements
  std::vector<int64_t> whole(static_cast<size_t>(n), 0);    // its chunk's packed elements in whole blocks
  for (int d = 0; d < D; ++d) {
    const auto [lo, hi] = chunk_range(n, D, d, rs);
    int64_t p = 0;
    for (int64_t i = lo; i < hi; ++i)
      if (compressed_at(t, i, 4096)) packed[size_t(i)] = p++;
    for (int64_t i = lo; i < hi; ++i) whole[size_t(i)] = p / kBlock * kBlock;
  }
  // int3's blocks: 213 magnitudes 3c/2 and 43 of 5c/2 in a fixed shuffled
  // order (mean |x| / rms >= 0.75 picks the factor 75/128, and bf16(75/128
  // x rms) is c exactly; the codec test found these counts); no period of
  // 8 elements has that property, so the partial last block of a chunk is
  // zeros (step 0, exact).
  std::vector<float> pattern3;
  for (int k = 0; k < 256; ++k) pattern3.push_back(k < 213 ? 1.5f : 2.5f);
  std::shuffle(pattern3.begin(), pattern3.end(), std::mt19937(5));
  auto input = [&](int r, int64_t i) {
    const int64_t p = packed[size_t(i)];
    if (p < 0) return float(int(mix(uint64_t(i) * 7 + uint64_t(r)) % 41) - 20);
    float mag;
    if (l == Level::Int3)
      mag = p < whole[size_t(i)] ? pattern3[size_t(p % kBlock)] * unit : 0.0f;
    else
      mag = p % 8 < 3 ? 1.5f * unit : 0.5f * unit;
    return (mix(uint64_t(i)) & 1) ? mag : -mag;
  };
  for (int64_t i = 0; i < n; ++i) {
    g[size_t(i)] = input(me, i);
    for (int r = 0; r < D; ++r) want[size_t(i)] += input(r, i);  // fp32, rank order
  }
  Settings s;
  s.min_elems = 4096;
  BucketCodecState st;
  for (int step = 0; step < 2; ++step) {
    std::vector<float> x = g;
    reduce_bucket(c, l, BucketView{x.data(), 0, n, rs}, t, s, st);
    const int64_t lo = rs ? me * n / D : 0, hi = rs ? lo + n / D : n;
    int64_t bad = 0, first = -1;
    for (int64_t i = lo; i < hi; ++i)
      if (std::memcmp(&x[size_t(i)], &want[size_t(i)], 4) != 0 && bad++ == 0) first = i;
    PCHECK(bad == 0, level_name(l) << (rs ? " reduce-scatter" : " all-reduce") << " step " << step << ": "
                                   << bad << " elements differ from the fp32 sum, first at " << first << ": "
                                   << x[size_t(std::max<int64_t>(first, 0))] << " vs "
                                   << want[size_t(std::max<int64_t>(first, 0))]);
    for (float v : st.residual) PCHECK(v == 0.0f, level_name(l) << " exact inputs left a residual " << v);
    for (float v : st.owner_residual)
      PCHECK(v == 0.0f, level_name(l) << " exact inputs left an owner residual " << v);
  }
}

// Every rank's x, gathered; true when all equal rank 0's bit for bit.
bool identical(MpiComm& c, const std::vector<float>& x) {
  std::vector<float> all(x.size() * size_t(c.size()));
  std::vector<float> mine = x;
  c.all_gather(Tensor(all.data(), DType::F32, {int64_t(all.size())}),
               Tensor(mine.data(), DType::F32, {int64_t(mine.size())}));
  for (int r = 1; r < c.size(); ++r)
    if (std::memcmp(all.data(), all.data() + size_t(r) * x.size(), x.size() * 4) != 0) return false;
  return true;
}

std::vector<float> random_input(int r, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed * 977 + uint32_t(r));
  std::normal_distribution<float> d(0.0f, 1e-2f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

void test_random(MpiComm& c, Level l) {
  int64_t n = 0;
  const std::vector<ParamSpec> t = mixed_table(n);
  const int D = c.size();
  Settings s;
  s.min_elems = 4096;
  BucketCodecState st;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> x = random_input(c.rank(), n, uint32_t(step + 1)), sum(size_t(n), 0.0f);
    for (int r = 0; r < D; ++r) {
      const std::vector<float> y = random_input(r, n, uint32_t(step + 1));
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += y[size_t(i)];
    }
    reduce_bucket(c, l, BucketView{x.data(), 0, n, false}, t, s, st);
    PCHECK(identical(c, x), level_name(l) << " step " << step << ": ranks' results differ");
    double e = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      e += std::pow(double(x[size_t(i)]) - sum[size_t(i)], 2);
      norm += double(sum[size_t(i)]) * sum[size_t(i)];
    }
    const double rel = std::sqrt(e / norm);
    // int2: two quantizations of relative squared error 0.12 each (its
    // unit test), so about sqrt(0.24) = 0.49 at step 0, more with the
    // residuals of the steps before.
    // int3: 0.037 each, sqrt(0.074) = 0.27 at step 0.
    const double bound = l == Level::Bf16 ? 0.01 : l == Level::Int8 ? 0.03 : l == Level::Int4 ? 0.5
                       : l == Level::Int3 ? 0.5 : 0.7;
    if (c.rank() == 0 && (l == Level::Int2 || l == Level::Int3))
      std::printf("%s random inputs, step %d: relative error %.3f of the sum\n", level_name(l), step, rel);
    PCHECK(rel < bound, level_name(l) << " step " << step << ": relative error " << rel << " >= " << bound);
  }
}

// Bytes this rank sends for one bucket of compressible matrices, per level,
// against the fp32 ring all-reduce of the same buffer.
void test_bytes(MpiComm& c) {
  const std::vector<ParamSpec> t = {spec("w", {256, 400}, 0)};
  const int64_t n = 256 * 400;
  std::vector<float> x = random_input(c.rank(), n, 9);
  c.reset_stats();
  c.all_reduce(Tensor(x.data(), DType::F32, {n}));
  const double fp32 = double(c.stats().bytes);
  Settings s;
  s.min_elems = 4096;
  s.powersgd_rank = 4;
  const std::pair<Level, double> want[] = {{Level::Bf16, 1.99}, {Level::Int8, 3.9}, {Level::Int4, 7.7},
                                           {Level::Int3, 10.4}, {Level::Int2, 15.5}, {Level::PowerSgd, 35.0}};
  for (auto [l, min_ratio] : want) {
    BucketCodecState st;
    std::vector<float> y = random_input(c.rank(), n, 9);
    c.reset_stats();
    reduce_bucket(c, l, BucketView{y.data(), 0, n, false}, t, s, st);
    const double ratio = fp32 / double(c.stats().bytes);
    if (c.rank() == 0)
      std::printf("bytes per rank, %d x %d all-reduce over %d ranks: fp32 %.0f, %s %ld (%.2fx less)\n", 256, 400,
                  c.size(), fp32, level_name(l), long(c.stats().bytes), ratio);
    PCHECK(ratio >= min_ratio, level_name(l) << ": sends " << c.stats().bytes << " bytes, fp32 " << fp32
                                             << ": ratio " << ratio << " < " << min_ratio);
  }
}

// PowerSGD: rank r's matrix A B_rᵀ (A shared), so the sum A (Σ B_r)ᵀ has rank r.
void test_powersgd(MpiComm& c) {
  int64_t n = 0;
  const std::vector<ParamSpec> t = mixed_table(n);
  const int D = c.size();
  const int r = 3;
  auto input = [&](int rank) {
    std::vector<float> g(static_cast<size_t>(n));
    std::mt19937 gen(uint32_t(rank) + 100);
    std::normal_distribution<float> d;
    for (float& v : g) v = std::round(d(gen) * 8.0f);  // exact elements: small integers
    for (const ParamSpec& p : t) {
      if (!(p.shape.size() == 2 && p.numel >= 4096)) continue;
      const int64_t m = p.shape[0], k = p.shape[1];
      std::mt19937 ga(uint32_t(p.offset) + 7);  // A: the same on every rank
      std::vector<float> A(size_t(m * r)), B(size_t(k * r));
      for (float& v : A) v = d(ga);
      for (float& v : B) v = d(gen);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
          float s = 0;
          for (int q = 0; q < r; ++q) s += A[size_t(i * r + q)] * B[size_t(j * r + q)];
          g[size_t(p.offset + i * k + j)] = s;
        }
    }
    return g;
  };
  std::vector<float> x = input(c.rank()), sum(size_t(n), 0.0f);
  for (int q = 0; q < D; ++q) {
    const std::vector<float> y = input(q);
    for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += y[size_t(i)];
  }
  Settings s;
  s.min_elems = 4096;
  s.powersgd_rank = r;
  s.seed = 5;
  BucketCodecState st;
  reduce_bucket(c, Level::PowerSgd, BucketView{x.data(), 0, n, false}, t, s, st);
  PCHECK(identical(c, x), "powersgd: ranks' results differ");
  double e = 0, norm = 0;
  for (const ParamSpec& p : t) {
    const bool comp = p.shape.size() == 2 && p.numel >= 4096;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      if (!comp) {
        PCHECK(x[size_t(i)] == sum[size_t(i)], "powersgd: exact element " << i << " of " << p.name << ": "
                                                                          << x[size_t(i)] << " vs " << sum[size_t(i)]);
        continue;
      }
      e += std::pow(double(x[size_t(i)]) - sum[size_t(i)], 2);
      norm += double(sum[size_t(i)]) * sum[size_t(i)];
    }
  }
  PCHECK(std::sqrt(e / norm) < 1e-5, "powersgd of a rank-" << r << " sum: relative error " << std::sqrt(e / norm));
  PCHECK(st.q.size() == size_t((72 + 100) * r), "powersgd: Q holds " << st.q.size() << " values");
  PCHECK(identical(c, st.q), "powersgd: the warm-start Q differs between ranks");
}

// The mixed table twice: three buckets [0, 4640), [4640, 9504) and [9504, 19008).
std::vector<ParamSpec> two_tables(int64_t& n) {
  int64_t n1 = 0;
  std::vector<ParamSpec> t = mixed_table(n1);
  const std::vector<ParamSpec> u = mixed_table(n1);
  static const char* names[] = {"d.weight", "d.bias", "e.weight", "f.weight"};
  for (size_t i = 0; i < u.size(); ++i) t.push_back(spec(names[i], u[i].shape, u[i].offset + n1));
  n = 2 * n1;
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void test_batched(MpiComm& c, Level l) {
  int64_t n = 0;
  const std::vector<ParamSpec> t = two_tables(n);
  const int64_t lo[3] = {0, 4640, 9504}, hi[3] = {4640, 9504, 19008};
  const bool rs[3] = {false, l != Level::PowerSgd, false};  // a ZeRO-1 bucket in the quantized batch
  const int ranks[3] = {1, 2, 3};
  Settings s;
  s.min_elems = 4096;
  s.powersgd_rank = 4;
  s.seed = 3;
  BucketCodecState one[3], batch[3];
  for (int step = 0; step < 3; ++step) {
    std::vector<float> x = random_input(c.rank(), n, uint32_t(step + 11)), y = x;
    for (int b = 0; b < 3; ++b) {
      Settings sb = s;
      if (l == Level::PowerSgd) sb.powersgd_rank = ranks[b];
      reduce_bucket(c, l, BucketView{x.data() + lo[b], lo[b], hi[b] - lo[b], rs[b]}, t, sb, one[b]);
    }
    std::vector<BatchItem> items;
    for (int b = 0; b < 3; ++b)
      items.push_back({BucketView{y.data() + lo[b], lo[b], hi[b] - lo[b], rs[b]}, &batch[b],
                       l == Level::PowerSgd ? ranks[b] : 0});
    c.reset_stats();
    reduce_buckets(c, l, items, t, s);
    const int64_t calls = c.stats().calls;
    PCHECK(calls == 2, level_name(l) << " step " << step << ": the batch took " << calls << " collectives, want 2");
    // The ZeRO-1 bucket's result is its own chunk; the rest of it is the input plus the residual.
    PCHECK(same_bits(x, y), level_name(l) << " step " << step << ": batched result differs from per-bucket");
    for (int b = 0; b < 3; ++b) {
      PCHECK(same_bits(one[b].residual, batch[b].residual), level_name(l) << " bucket " << b << ": residual differs");
      PCHECK(same_bits(one[b].owner_residual, batch[b].owner_residual),
             level_name(l) << " bucket " << b << ": owner residual differs");
      PCHECK(same_bits(one[b].q, batch[b].q), level_name(l) << " bucket " << b << ": Q differs");
    }
  }
  if (l == Level::PowerSgd)
    PCHECK(batch[0].q.size() == size_t(72), "powersgd rank 1 (a.weight, 64 x 72): Q holds " << batch[0].q.size() << " values");
}

void test_all_reduce_batched(MpiComm& c) {
  const int64_t sizes[] = {1, 5, 0, 7, 1001, 4};
  std::vector<std::vector<float>> a, b;
  for (size_t j = 0; j < std::size(sizes); ++j) {
    a.push_back(random_input(c.rank(), sizes[j], uint32_t(j + 40)));
    b.push_back(a.back());
  }
  for (std::vector<float>& v : a)
    if (!v.empty()) c.all_reduce(Tensor(v.data(), DType::F32, {int64_t(v.size())}));
  std::vector<std::vector<float>*> ptr;
  for (std::vector<float>& v : b) ptr.push_back(&v);
  c.reset_stats();
  all_reduce_batched(c, ptr);
  PCHECK(c.stats().calls == 1, "all_reduce_batched: " << c.stats().calls << " collectives");
  for (size_t j = 0; j < a.size(); ++j)
    PCHECK(same_bits(a[j], b[j]), "all_reduce_batched: buffer " << j << " (" << sizes[j]
                                                                << " elements) differs from its own all-reduce");
}

}  // namespace

int main(int argc, char** argv) try {
  MpiEnv mpi(&argc, &argv);
  ptest::tally().rank = mpi.rank();
  auto world = MpiComm::world();
  for (Level l : {Level::Bf16, Level::Int8, Level::Int4}) {
    test_exact(*world, l, false);
    test_exact(*world, l, true);
    test_random(*world, l);
  }
  for (Level l : {Level::Int2, Level::Int3}) {
    test_exact_rms(*world, l, false);
    test_exact_rms(*world, l, true);
    test_random(*world, l);
  }
  test_bytes(*world);
  test_powersgd(*world);
  for (Level l : {Level::Bf16, Level::Int8, Level::Int4, Level::Int3, Level::Int2, Level::PowerSgd})
    test_batched(*world, l);
  test_all_reduce_batched(*world);
  const auto& t = ptest::tally();
  long fails = t.failures, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (world->rank() == 0)
    std::printf("compress reduce: %s on %d ranks, %ld checks on rank 0, %ld failures in all\n",
                total ? "FAILED" : "ok", world->size(), t.checks, total);
  world.reset();
  return total ? 1 : 0;
} catch (const std::exception& e) {
  fatal(e);
}
