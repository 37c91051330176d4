// Classifier kernels (kernels/cuda/loss_kernels.cuh) in the CUDA emulation
// against the CPU backend: cross_entropy, and the vocab-parallel
// ce_partial_stats, ce_combine and ce_finish, in f32, f64 and bf16 logits (f32
// stats). Rows shorter and longer than a block (bf16: than 512 threads x 8),
// every row start alignment (odd V: the bf16 head / vectors / tail split),
// misaligned views, ignored rows (target -1), targets in another shard and in
// the next shard's first column, and the device-side target range check
// (target >= V: loss NaN, gradient 0, the error words set). See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"

#include "kernels/cuda/loss_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

DType stat_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

std::string name(const char* op, DType dt, int64_t N, int64_t V, int mis) {
  return std::string(op) + " " + dtname(dt) + " N=" + std::to_string(N) + " V=" +
         std::to_string(V) + (mis ? " misaligned" : "");
}

// Targets in [0, V), with row 0 ignored (-1) when N > 1, and the first and
// last columns among them.
Tensor make_targets(Mem& m, int64_t N, int64_t V, std::mt19937& rng) {
  Tensor t = m.make(DType::I32, {N});
  std::uniform_int_distribution<int64_t> u(0, V - 1);
  for (int64_t i = 0; i < N; ++i) t.ptr<int32_t>()[i] = int32_t(u(rng));
  if (N > 1) t.ptr<int32_t>()[0] = -1;
  if (N > 2) t.ptr<int32_t>()[1] = 0;
  if (N > 3) t.ptr<int32_t>()[2] = int32_t(V - 1);
  return t;
}

// Gradient tolerance: a column's gradient is p * gs, the target's p * gs - gs
// (cancels when p is near 1): relative to the logits' dtype, and absolute in
// units of gs.
constexpr double kGs = 0.5;

// cross_entropy; `bad` rows get targets V and V + 7 (the device range check).
void check_cross_entropy(DType dt, int64_t N, int64_t V, int mis, bool bad) {
  const std::string what = name("cross_entropy", dt, N, V, mis) + (bad ? " bad targets" : "");
  std::mt19937 rng(unsigned(N * 977 + V + mis));
  Mem m;
  Ctx ctx;
  const DType sd = stat_dtype(dt);
  Tensor x = m.make(dt, {N, V}, mis), tg = make_targets(m, N, V, rng);
  fill(x, rng, -4, 4);
  std::vector<int64_t> bad_rows;
  Tensor tgc = m.make(DType::I32, {N});  // the CPU's targets: bad rows ignored
  copy(tgc, tg);
  if (bad) {
    bad_rows = {N / 2, N - 1};
    tg.ptr<int32_t>()[N / 2] = int32_t(V);
    tg.ptr<int32_t>()[N - 1] = int32_t(V + 7);
    for (int64_t r : bad_rows) tgc.ptr<int32_t>()[r] = -1;
  }
  Tensor gc = m.make(dt, {N, V}), lc = m.make(sd, {N});
  copy(gc, x);
  cpu().cross_entropy(gc, lc, tgc, kGs);

  Tensor gs[2], ls[2];
  int64_t err[2][4];
  int k = 0;
  run_both([&] {
    gs[k] = m.make(dt, {N, V}, mis), ls[k] = m.make(sd, {N});
    copy(gs[k], x);
    std::fill(ctx.err(), ctx.err() + 4, int64_t(0));
    cuda::cross_entropy(ctx.get(), gs[k], ls[k], tg, kGs);
    std::copy(ctx.err(), ctx.err() + 4, err[k]);
    ++k;
  });
  m.guards_ok(what);
  for (int o = 0; o < 2; ++o) {
    if (!bad) {
      if (err[o][0] != 0) fail(what + ": error words set with every target in range");
      continue;
    }
    // One bad row's row and target (either: the blocks race), and V.
    const int64_t row = err[o][1] >> 32, t = int32_t(uint32_t(err[o][1] & 0xffffffff));
    bool named = false;
    for (int64_t r : bad_rows) named |= row == r && t == tg.ptr<int32_t>()[r];
    if (err[o][0] != 1 || !named || err[o][2] != V)
      fail(what + ": error words [" + std::to_string(err[o][0]) + ", row " + std::to_string(row) +
           " target " + std::to_string(t) + ", V " + std::to_string(err[o][2]) +
           "] do not name a bad row");
  }
  for (int64_t r : bad_rows) {
    if (!std::isnan(at(ls[0], r))) fail(what + ": a bad row's loss is not NaN");
    sd == DType::F32 ? void(ls[0].ptr<float>()[r] = 0) : void(ls[0].ptr<double>()[r] = 0);
    sd == DType::F32 ? void(ls[1].ptr<float>()[r] = 0) : void(ls[1].ptr<double>()[r] = 0);
  }
  const double rt = rtol_of(dt), rs = rtol_of(sd);
  close(what + " losses", ls[0], lc, rs, rs);
  close(what + " gradient", gs[0], gc, rt, rt * kGs);
  if (!same_bits(gs[0], gs[1]) || !same_bits(ls[0], ls[1]))
    fail(what + ": the two warp orders differ");
}

// A rank's shard: columns [vocab_start, vocab_start + valid) of the vocabulary
// in a row of Vl (the rest padding); the vocabulary is 3 shards of `valid`.
// Targets: ignored (row 0), this shard's first and last columns,
// vocab_start + valid (the next shard's first column, a padding column here
// when Vl > valid), the column before the shard, and random.
struct Shard {
  int64_t N, Vl, valid, vocab_start;
};
Tensor shard_targets(Mem& m, const Shard& s, std::mt19937& rng) {
  Tensor t = m.make(DType::I32, {s.N});
  std::uniform_int_distribution<int64_t> u(0, 3 * s.valid - 1);
  for (int64_t i = 0; i < s.N; ++i) t.ptr<int32_t>()[i] = int32_t(u(rng));
  int32_t* p = t.ptr<int32_t>();
  const int32_t pinned[] = {-1, int32_t(s.vocab_start), int32_t(s.vocab_start + s.valid - 1),
                            int32_t(s.vocab_start + s.valid),
                            int32_t(s.vocab_start ? s.vocab_start - 1 : s.valid + 3)};
  for (int64_t i = 0; i < s.N && i < 5; ++i) p[i] = pinned[i];
  return t;
}

std::string shard_name(const char* op, DType dt, const Shard& s, int mis) {
  return name(op, dt, s.N, s.Vl, mis) + " valid=" + std::to_string(s.valid) + " start=" +
         std::to_string(s.vocab_start);
}

void check_partial_stats(DType dt, const Shard& s, int mis) {
  const std::string what = shard_name("ce_partial_stats", dt, s, mis);
  std::mt19937 rng(unsigned(s.N * 31 + s.Vl + s.valid));
  Mem m;
  Ctx ctx;
  const DType sd = stat_dtype(dt);
  Tensor x = m.make(dt, {s.N, s.Vl}, mis), tg = shard_targets(m, s, rng);
  fill(x, rng, -4, 4);
  Tensor stc = m.make(sd, {s.N, 3});
  cpu().ce_partial_stats(stc, x, tg, s.vocab_start, s.valid);
  Tensor sts[2];
  int k = 0;
  run_both([&] {
    sts[k] = m.make(sd, {s.N, 3});
    cuda::ce_partial_stats(ctx.get(), sts[k], x, tg, s.vocab_start, s.valid);
    ++k;
  });
  m.guards_ok(what);
  const double rs = rtol_of(sd);
  close(what + " stats", sts[0], stc, rs, rs);
  if (!same_bits(sts[0], sts[1])) fail(what + ": the two warp orders differ");
}

// gathered (R, N, 3): realistic per-rank stats (max in [-4, 4], sum in
// [1, 100], a target logit on one rank).
void check_combine(DType dt, int64_t N, int64_t R) {
  const std::string what = "ce_combine " + dtname(dt) + " N=" + std::to_string(N) +
                           " R=" + std::to_string(R);
  std::mt19937 rng(unsigned(N * 5 + R));
  Mem m;
  Ctx ctx;
  Tensor g = m.make(dt, {R, N, 3});
  fill(g, rng, -4, 4);
  std::uniform_real_distribution<double> su(1, 100);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t e = (r * N + i) * 3;
      const double sum = su(rng), tl = int64_t(i % R) == r ? at(g, e + 2) : 0.0;
      if (dt == DType::F32) g.ptr<float>()[e + 1] = float(sum), g.ptr<float>()[e + 2] = float(tl);
      else g.ptr<double>()[e + 1] = sum, g.ptr<double>()[e + 2] = tl;
    }
  Tensor cc = m.make(dt, {N, 3});
  cpu().ce_combine(cc, g);
  Tensor cs[2];
  int k = 0;
  run_both([&] {
    cs[k] = m.make(dt, {N, 3});
    cuda::ce_combine(ctx.get(), cs[k], g);
    ++k;
  });
  m.guards_ok(what);
  const double rs = rtol_of(dt);
  close(what + " combined", cs[0], cc, rs, rs);
  if (!same_bits(cs[0], cs[1])) fail(what + ": the two warp orders differ");
}

// ce_finish with the combined stats of the whole vocabulary: the CPU's
// pipeline over R = 3 shards of this shape, this one rank 1 (vocab_start ==
// valid).
void check_finish(DType dt, const Shard& s, int mis) {
  const std::string what = shard_name("ce_finish", dt, s, mis);
  std::mt19937 rng(unsigned(s.N * 17 + s.Vl * 3 + s.valid + mis));
  Mem m;
  Ctx ctx;
  const DType sd = stat_dtype(dt);
  const int64_t R = 3;
  if (s.vocab_start != s.valid) return fail(what + ": the test's shard is not rank 1");
  Tensor tg = shard_targets(m, s, rng);
  // Every rank's logits and stats (CPU), gathered in rank order.
  Tensor gathered = m.make(sd, {R, s.N, 3});
  Tensor mine;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t start = s.vocab_start + (r - 1) * s.valid;  // rank 1 is this one
    Tensor x = m.make(dt, {s.N, s.Vl}, r == 1 ? mis : 0);
    fill(x, rng, -4, 4);
    Tensor st(static_cast<char*>(gathered.data) + size_t(r * s.N * 3) * dtype_size(sd), sd,
              {s.N, 3});
    cpu().ce_partial_stats(st, x, tg, start, s.valid);
    if (r == 1) mine = x;
  }
  Tensor comb = m.make(sd, {s.N, 3});
  cpu().ce_combine(comb, gathered);
  Tensor gc = m.make(dt, {s.N, s.Vl}), lc = m.make(sd, {s.N});
  copy(gc, mine);
  cpu().ce_finish(gc, lc, comb, tg, s.vocab_start, s.valid, kGs);

  Tensor gs[2], ls[2];
  int k = 0;
  run_both([&] {
    gs[k] = m.make(dt, {s.N, s.Vl}, mis), ls[k] = m.make(sd, {s.N});
    copy(gs[k], mine);
    cuda::ce_finish(ctx.get(), gs[k], ls[k], comb, tg, s.vocab_start, s.valid, kGs);
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(dt), rs = rtol_of(sd);
  close(what + " losses", ls[0], lc, rs, rs);
  close(what + " gradient", gs[0], gc, rt, rt * kGs);
  if (!same_bits(gs[0], gs[1]) || !same_bits(ls[0], ls[1]))
    fail(what + ": the two warp orders differ");
}

// The ops' dtype checks: a mismatch throws instead of being read as another type.
void refusals() {
  Mem m;
  Ctx ctx;
  Tensor x = m.make(DType::F64, {2, 8}), l32 = m.make(DType::F32, {2}), l64 = m.make(DType::F64, {2});
  Tensor c32 = m.make(DType::F32, {2, 3}), c64 = m.make(DType::F64, {2, 3});
  Tensor tg = m.make(DType::I32, {2}), tg64 = m.make(DType::F64, {2});
  tg.ptr<int32_t>()[0] = tg.ptr<int32_t>()[1] = 1;
  expect_throw("ce_finish f64 logits, f32 losses",
               [&] { cuda::ce_finish(ctx.get(), x, l32, c64, tg, 0, 8, 1); });
  expect_throw("ce_finish f64 logits, f32 combined",
               [&] { cuda::ce_finish(ctx.get(), x, l64, c32, tg, 0, 8, 1); });
  expect_throw("ce_finish f64 targets",
               [&] { cuda::ce_finish(ctx.get(), x, l64, c64, tg64, 0, 8, 1); });
  expect_throw("cross_entropy f64 logits, f32 losses",
               [&] { cuda::cross_entropy(ctx.get(), x, l32, tg, 1); });
  expect_throw("ce_combine bf16", [&] {
    Tensor b = m.make(DType::BF16, {2, 3});
    cuda::ce_combine(ctx.get(), b, b);
  });
}

}  // namespace

int main() {
  struct Shape {
    int64_t N, V;
    int mis;
  };
  // f32/f64: a row shorter than the 512 threads, and one longer (1500).
  for (DType dt : {DType::F32, DType::F64})
    for (Shape s : {Shape{6, 37, 0}, Shape{5, 1500, 0}}) {
      check_cross_entropy(dt, s.N, s.V, 0, false);
      check_cross_entropy(dt, s.N, s.V, 0, true);
    }
  // bf16: V < 8 (head or tail only), odd V (every row start alignment: head,
  // vectors, tail), aligned V % 8 == 0, misaligned, and a row of more than
  // 512 x 8 (several vectors per thread).
  for (Shape s : {Shape{5, 5, 0}, Shape{9, 203, 0}, Shape{4, 256, 0}, Shape{4, 256, 3},
                  Shape{3, 9001, 0}}) {
    check_cross_entropy(DType::BF16, s.N, s.V, s.mis, false);
    check_cross_entropy(DType::BF16, s.N, s.V, s.mis, true);
  }

  // Shards shorter and longer than a block, with and without padding columns;
  // rank 0 (vocab_start 0) for the stats.
  for (DType dt : {DType::F32, DType::F64}) {
    for (Shard s : {Shard{7, 40, 37, 37}, Shard{6, 1200, 1100, 1100}, Shard{5, 64, 64, 64}}) {
      check_partial_stats(dt, s, 0);
      check_finish(dt, s, 0);
    }
    check_partial_stats(dt, Shard{5, 64, 60, 0}, 0);
    for (int64_t R : {1, 3}) check_combine(dt, 300, R);  // 300 rows: two blocks of 256
    check_combine(dt, 5, 4);
  }
  for (Shard s : {Shard{7, 40, 37, 37}, Shard{6, 48, 48, 48}, Shard{5, 203, 190, 190},
                  Shard{3, 9000, 8995, 8995}}) {
    check_partial_stats(DType::BF16, s, 0);
    check_partial_stats(DType::BF16, s, 1);
    check_finish(DType::BF16, s, 0);
    check_finish(DType::BF16, s, 5);
  }
  check_partial_stats(DType::BF16, Shard{5, 64, 60, 0}, 0);
  refusals();
  return finish("classifier");
}
