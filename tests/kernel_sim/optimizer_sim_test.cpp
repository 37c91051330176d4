// Optimizer kernels (kernels/cuda/optimizer_kernels.cuh) in the CUDA
// emulation against the CPU backend: the two-pass sum of squares (as
// CudaBackend::sum_squares runs it, the result in the reduce scratch after
// the partials) in f32, f64 and bf16, vectorised and scalar (misaligned),
// one chunk, several (with a remainder), and more partials than pass 2's 1024
// threads; sum_squares_ranges (misaligned and empty ranges, bit for bit the
// sums of the ranges); adamw in f32 and f64 over several blocks; adamw_cast
// (f32 master, bf16 copy) vectorised with a tail, and scalar. See
// sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"

#include "kernels/cuda/optimizer_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

// Sums of squares: double accumulation in another grouping (blocks of 256
// threads, a tree) than the CPU's (chunks summed in order).
constexpr double kSumRtol = 1e-12;

std::string name(const char* op, DType dt, int64_t n, int mis) {
  return std::string(op) + " " + dtname(dt) + " n=" + std::to_string(n) +
         (mis ? " misaligned" : "");
}

// CudaBackend::sum_squares without its read-back: the result at the reduce
// scratch's slot after the partials.
double sum_squares(Ctx& ctx, const Tensor& x) {
  const int64_t nparts = cuda::sumsq_parts(x.numel());
  auto* part = static_cast<double*>(
      ctx.get().scratch(CudaBackend::kScratchReduce, size_t(nparts + 1) * sizeof(double)));
  cuda::sum_squares_into(ctx.get(), part + nparts, x);
  return part[nparts];
}

void check_sum_squares(DType dt, int64_t n, int mis) {
  const std::string what = name("sum_squares", dt, n, mis);
  std::mt19937 rng(unsigned(n * 3 + mis));
  Mem m;
  Ctx ctx;
  Tensor x = m.make(dt, {n}, mis);
  fill(x, rng, -2, 2);
  const double want = cpu().sum_squares(x);
  double got[2];
  int k = 0;
  run_both([&] { got[k++] = sum_squares(ctx, x); });
  m.guards_ok(what);
  ++checks;
  if (!(std::fabs(got[0] - want) <= kSumRtol * want)) {
    char buf[128];
    std::snprintf(buf, sizeof buf, ": got %.17g, want %.17g", got[0], want);
    fail(what + buf);
  }
  if (std::memcmp(&got[0], &got[1], sizeof(double)) != 0)
    fail(what + ": the two warp orders differ");
}

void check_ranges(DType dt, int mis) {
  const int64_t n = 40000;
  const std::string what = name("sum_squares_ranges", dt, n, mis);
  std::mt19937 rng(unsigned(n + mis));
  Mem m;
  Ctx ctx;
  Tensor x = m.make(dt, {n}, mis);
  fill(x, rng, -2, 2);
  // Empty, short, misaligned starts, one over two chunks, the whole tensor.
  const std::vector<int64_t> bounds = {0, 100, 5, 5, 3, 19, 101, 34000, 17, 18, 0, n, 9, 16393};
  const int64_t k = int64_t(bounds.size() / 2);
  Tensor want = m.make(DType::F64, {k});
  cpu().sum_squares_ranges(want, x, bounds);
  Tensor outs[2];
  int o = 0;
  run_both([&] {
    outs[o] = m.make(DType::F64, {k + 1});  // one past the ranges: left alone
    cuda::sum_squares_ranges(ctx.get(), outs[o], x, bounds);
    ++o;
  });
  m.guards_ok(what);
  Tensor got(outs[0].data, DType::F64, {k});
  close(what, got, want, kSumRtol, 0);
  ++checks;
  for (const Tensor& t : outs)
    if (!std::isnan(t.ptr<double>()[k])) fail(what + ": wrote past the ranges' sums");
  // Bit for bit the sums of the ranges (the contract).
  for (int64_t i = 0; i < k; ++i) {
    const Tensor r(static_cast<char*>(x.data) + size_t(bounds[2 * i]) * dtype_size(dt), dt,
                   {bounds[2 * i + 1] - bounds[2 * i]});
    const double s = sum_squares(ctx, r);  // an empty range: 0 too
    ++checks;
    if (std::memcmp(&s, outs[0].ptr<double>() + i, sizeof s) != 0)
      fail(what + ": range " + std::to_string(i) + " differs from its sum_squares");
  }
  if (!same_bits(outs[0], outs[1])) fail(what + ": the two warp orders differ");
}

AdamWHyper hyper(int64_t step) {
  AdamWHyper h;
  h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = 0.1, h.step = step;
  h.grad_scale = step == 1 ? 1.0 : 0.37;  // clipping applied as g is read, from the second step
  return h;
}

// p, g, m, v as an optimizer step sees them (v >= 0).
struct State {
  Tensor p, g, m, v;
};
State make_state(Mem& mem, DType dt, int64_t n, int mis, std::mt19937& rng) {
  State s{mem.make(dt, {n}, mis), mem.make(dt, {n}, mis), mem.make(dt, {n}, mis),
          mem.make(dt, {n}, mis)};
  fill(s.p, rng), fill(s.g, rng), fill(s.m, rng, -0.1, 0.1), fill(s.v, rng, 0, 0.01);
  return s;
}
State clone(Mem& mem, const State& s, int mis) {
  const DType dt = s.p.dtype;
  const int64_t n = s.p.numel();
  State c{mem.make(dt, {n}, mis), mem.make(dt, {n}, mis), mem.make(dt, {n}, mis),
          mem.make(dt, {n}, mis)};
  copy(c.p, s.p), copy(c.g, s.g), copy(c.m, s.m), copy(c.v, s.v);
  return c;
}

void check_adamw(DType dt, int64_t n, int64_t step) {
  const std::string what = name("adamw", dt, n, 0) + " step " + std::to_string(step);
  std::mt19937 rng(unsigned(n + step));
  Mem m;
  Ctx ctx;
  const State s0 = make_state(m, dt, n, 0, rng);
  const State c = clone(m, s0, 0);
  cpu().adamw(c.p, c.g, c.m, c.v, hyper(step));
  State e[2];
  int k = 0;
  run_both([&] {
    e[k] = clone(m, s0, 0);
    cuda::adamw(ctx.get(), e[k].p, e[k].g, e[k].m, e[k].v, hyper(step));
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(dt);
  close(what + " param", e[0].p, c.p, rt, rt);
  close(what + " m", e[0].m, c.m, rt, rt);
  close(what + " v", e[0].v, c.v, rt, 0);
  if (!same_bits(e[0].p, e[1].p) || !same_bits(e[0].m, e[1].m) || !same_bits(e[0].v, e[1].v))
    fail(what + ": the two warp orders differ");
}

void check_adamw_cast(int64_t n, int mis) {
  const std::string what = name("adamw_cast", DType::F32, n, mis);
  std::mt19937 rng(unsigned(n * 7 + mis));
  Mem m;
  Ctx ctx;
  const State s0 = make_state(m, DType::F32, n, mis, rng);
  const State c = clone(m, s0, 0);
  Tensor lc = m.make(DType::BF16, {n});
  cpu().adamw_cast(c.p, c.g, c.m, c.v, lc, hyper(3));
  State e[2];
  Tensor lo[2];
  int k = 0;
  run_both([&] {
    e[k] = clone(m, s0, mis);
    lo[k] = m.make(DType::BF16, {n}, mis);
    cuda::adamw_cast(ctx.get(), e[k].p, e[k].g, e[k].m, e[k].v, lo[k], hyper(3));
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(DType::F32);
  close(what + " param", e[0].p, c.p, rt, rt);
  close(what + " m", e[0].m, c.m, rt, rt);
  close(what + " v", e[0].v, c.v, rt, 0);
  close(what + " bf16 copy", lo[0], lc, rtol_of(DType::BF16), rtol_of(DType::BF16));
  // The copy is the updated master rounded once.
  ++checks;
  for (int64_t i = 0; i < n; ++i)
    if (lo[0].ptr<bf16_bits>()[i] != float_to_bf16(e[0].p.ptr<float>()[i])) {
      fail(what + ": bf16 copy element " + std::to_string(i) + " is not the rounded master");
      break;
    }
  if (!same_bits(e[0].p, e[1].p) || !same_bits(e[0].m, e[1].m) || !same_bits(e[0].v, e[1].v) ||
      !same_bits(lo[0], lo[1]))
    fail(what + ": the two warp orders differ");
}

void refusals() {
  Mem m;
  Ctx ctx;
  Tensor b = m.make(DType::BF16, {8}), f = m.make(DType::F32, {8}), d = m.make(DType::F64, {8});
  expect_throw("adamw bf16 param", [&] { cuda::adamw(ctx.get(), b, b, b, b, hyper(1)); });
  expect_throw("adamw mixed dtypes", [&] { cuda::adamw(ctx.get(), f, d, f, f, hyper(1)); });
  expect_throw("adamw_cast f64 master", [&] { cuda::adamw_cast(ctx.get(), d, d, d, d, b, hyper(1)); });
  expect_throw("sum_squares_ranges f32 out",
               [&] { cuda::sum_squares_ranges(ctx.get(), f, d, {0, 4}); });
}

}  // namespace

int main() {
  constexpr int64_t kChunk = 1 << 14;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    // One element, a short tail only, one chunk exactly, a chunk and one,
    // three chunks with a remainder; aligned and misaligned.
    for (int64_t n : {int64_t(1), int64_t(13), kChunk, kChunk + 1, 3 * kChunk - 5})
      for (int mis : {0, 1}) check_sum_squares(dt, n, mis);
    for (int mis : {0, 3}) check_ranges(dt, mis);
  }
  // More partials (1027) than pass 2's 1024 threads.
  check_sum_squares(DType::BF16, 1027 * kChunk - 3, 0);

  // adamw: one element, a partial block, 300 blocks of 256 (grid_for's cap,
  // 65536 blocks, takes 16.7M elements: its grid-stride loop is not reached).
  for (DType dt : {DType::F32, DType::F64})
    for (int64_t n : {int64_t(1), int64_t(1003), int64_t(300 * 256 + 7)}) {
      check_adamw(dt, n, 1);
      check_adamw(dt, n, 10);
    }
  // adamw_cast: shorter than a vector, vectors and a tail, more than one
  // block, and misaligned (all scalar).
  for (int64_t n : {int64_t(5), int64_t(1003), int64_t(40000 + 3)})
    for (int mis : {0, 1}) check_adamw_cast(n, mis);
  refusals();
  return finish("optimizer");
}
