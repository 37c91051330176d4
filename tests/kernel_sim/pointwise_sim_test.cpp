// Elementwise kernels (kernels/cuda/pointwise_kernels.cuh) in the CUDA
// emulation against the CPU backend: add_inplace, scale_inplace, cast (every
// pair of f32, f64, bf16, and the same-dtype copy), swiglu_forward/backward
// and rope_forward/backward, in f32, f64 and bf16; the fused projections'
// ops: swiglu_packed_forward/backward (gate and up side by side in each row)
// and qkv_rope_split / qkv_rope_merge_backward. The bf16 ops take the
// vectorised path (8 elements per thread; the grid of the launch shows which
// path ran) when every tensor is aligned, with a scalar tail, and the scalar
// path when any one tensor is misaligned; the rotary kernels with W = 8
// (half % 8 == 0) and W = 1, tables longer than T. Shapes span several
// blocks; the grid-stride loops' later rounds run on small grids launched
// directly (grid_stride()). The ops' shape and dtype checks refuse bad calls
// (bad_calls()). See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"
// (the emulated CUDA first: the kernel header builds on it)

#include "kernels/cuda/pointwise_kernels.cuh"

#include <cfloat>
#include <limits>

namespace {
using namespace adgt;
using namespace adgt::sim_check;

// One tensor of a case: its dtype and shape, `mis` elements off 16-byte
// alignment in the emulated call, values uniform in [lo, hi); `out` marks
// what the op writes (in-place operands included).
struct Arg {
  DType dt;
  std::vector<int64_t> shape;
  bool out = false;
  int mis = 0;
  double lo = -1, hi = 1;
};

Tensor make(Mem& m, const Arg& a, int mis) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  Tensor t = m.make(a.dt, {n}, mis);
  t.ndim = int(a.shape.size());
  for (size_t i = 0; i < a.shape.size(); ++i) t.shape[i] = a.shape[i];
  return t;
}

// The first element where a and b differ bitwise, except that any NaN
// equals any NaN (a NaN's payload is not part of the contract,
// kernels/common/bf16.hpp); -1 if none.
int64_t first_diff(const Tensor& a, const Tensor& b) {
  const size_t es = dtype_size(a.dtype);
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(at(a, i)) && std::isnan(at(b, i))) continue;
    if (std::memcmp(static_cast<const char*>(a.data) + i * es,
                    static_cast<const char*>(b.data) + i * es, es) != 0)
      return i;
  }
  return -1;
}

using Fn = std::function<void(const std::vector<Tensor>&)>;

// Runs `sim_fn` (the CUDA op, in both warp orders, on tensors misaligned as
// the args say) and `cpu_fn` (aligned copies) on the same random inputs; compares
// every output with the CPU's (bitwise when rtol < 0, else within rtol and
// atol = rtol), the two warp orders bitwise, the inputs unchanged, the guard
// bytes intact, and the grid of the op's last launch with `grid` (the path
// taken; 0: unchecked). `plant` may overwrite inputs (special values).
void check(const std::string& what, const std::vector<Arg>& args, const Fn& cpu_fn,
           const Fn& sim_fn, double rtol, unsigned grid,
           const std::function<void(const std::vector<Tensor>&)>& plant = nullptr) {
  std::mt19937 rng(unsigned(std::hash<std::string>{}(what)));
  Mem m;
  std::vector<Tensor> in, want;
  for (const Arg& a : args) {
    in.push_back(make(m, a, 0));
    fill(in.back(), rng, a.lo, a.hi);
  }
  if (plant) plant(in);
  for (size_t i = 0; i < args.size(); ++i) {
    want.push_back(make(m, args[i], 0));
    copy(want.back(), in[i]);
  }
  cpu_fn(want);

  std::vector<Tensor> got[2];
  int k = 0;
  unsigned grid_seen[2] = {0, 0};
  run_both([&] {
    for (size_t i = 0; i < args.size(); ++i) {
      got[k].push_back(make(m, args[i], args[i].mis));
      copy(got[k].back(), in[i]);
    }
    const size_t before = cuda_sim::launches.size();
    sim_fn(got[k]);
    if (cuda_sim::launches.size() > before) grid_seen[k] = cuda_sim::launches.back().grid.x;
    ++k;
  });
  m.guards_ok(what);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string t = what + " tensor #" + std::to_string(i);
    if (!args[i].out) {
      ++checks;
      if (!same_bits(got[0][i], in[i])) fail(t + ": an input was written");
      continue;
    }
    if (rtol < 0) {
      ++checks;
      if (const int64_t e = first_diff(got[0][i], want[i]); e >= 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, ": element %lld of %lld: got %.17g, want %.17g (bitwise)",
                      (long long)e, (long long)want[i].numel(), at(got[0][i], e), at(want[i], e));
        fail(t + buf);
      }
    } else {
      close(t, got[0][i], want[i], rtol, rtol);
    }
    if (!same_bits(got[0][i], got[1][i])) fail(t + ": the two warp orders differ");
  }
  if (grid && grid_seen[0] != grid)
    fail(what + ": grid " + std::to_string(grid_seen[0]) + ", expected " + std::to_string(grid) +
         " (the wrong path)");
}

// The grid of launch_map (cuda_common.cuh): vectorised or scalar.
unsigned map_grid(int64_t n, bool vec) {
  const int64_t nvec = vec ? n / 8 : 0, tail = n - nvec * 8;
  return cuda::grid_for(nvec > tail ? nvec : tail, 256);
}

std::string label(const char* op, DType dt, int64_t n, int mis_at = -1) {
  return std::string(op) + " " + dtname(dt) + " n=" + std::to_string(n) +
         (mis_at >= 0 ? " misaligned #" + std::to_string(mis_at) : "");
}

Ctx ctx;

// ---- add, scale: one correctly rounded operation per element, so bitwise ----

void add_scale(DType dt, int64_t n, int mis_at) {
  const bool bf = dt == DType::BF16;
  {
    std::vector<Arg> a = {{dt, {n}, true}, {dt, {n}}};
    if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
    const unsigned g = bf ? map_grid(n, mis_at < 0) : cuda::grid_for(n, 256);
    check(
        label("add_inplace", dt, n, mis_at), a, [](auto& t) { cpu().add_inplace(t[0], t[1]); },
        [](auto& t) { cuda::add_inplace(ctx.get(), t[0], t[1]); }, -1, g);
  }
  if (mis_at <= 0) {
    std::vector<Arg> a = {{dt, {n}, true, mis_at == 0 ? 1 : 0}};
    const unsigned g = bf ? map_grid(n, mis_at < 0) : cuda::grid_for(n, 256);
    // 0.37 is not an f32 value: f64 must scale by the double.
    check(
        label("scale_inplace", dt, n, mis_at), a, [](auto& t) { cpu().scale_inplace(t[0], 0.37); },
        [](auto& t) { cuda::scale_inplace(ctx.get(), t[0], 0.37); }, -1, g);
  }
}

// ---- cast: each conversion rounds once (nearest even), so bitwise ----

// Special values at the front of src: zeros, infinities, NaN, f32/bf16
// subnormals, the largest values and past them, and values just off the
// bf16 rounding ties, where rounding f64 to f32 first lands on the tie.
void plant_specials(const Tensor& t) {
  const double inf = std::numeric_limits<double>::infinity();
  const double tie = 1.00390625;   // halfway between the bf16 values 1 and 1 + 2^-7
  const double tie2 = 1.01171875;  // halfway between 1 + 2^-7 and 1 + 2^-6
  // clang-format off
  const double v[] = {0.0, -0.0, inf, -inf, std::nan(""), 1e-40, -1e-42, 1e-300,
                      3.3e38, 3.3961e38, 3.40282e38, 1e39, -1e39, FLT_MAX,
                      tie, tie + 0x1p-40, tie - 0x1p-40, -(tie + 0x1p-40),
                      tie2, tie2 + 0x1p-40, tie2 - 0x1p-40, -(tie2 - 0x1p-40),
                      0x1p-130 * 1.00390625 + 0x1p-170, 1.0 + 0x1p-24 + 0x1p-60};
  // clang-format on
  for (size_t i = 0; i < sizeof v / sizeof v[0] && int64_t(i) < t.numel(); ++i) {
    switch (t.dtype) {
      case DType::F32:
        t.ptr<float>()[i] = float(v[i]);
        break;
      case DType::F64:
        t.ptr<double>()[i] = v[i];
        break;
      case DType::BF16:
        t.ptr<bf16_bits>()[i] = float_to_bf16(float(v[i]));
        break;
      default:
        break;
    }
  }
}

void cast(DType to, DType from, int64_t n, int mis_at) {
  std::vector<Arg> a = {{to, {n}, true}, {from, {n}}};
  if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
  const std::string what = std::string("cast ") + dtname(from) + "->" + dtname(to) +
                           " n=" + std::to_string(n) +
                           (mis_at >= 0 ? " misaligned #" + std::to_string(mis_at) : "");
  const bool mapped =
      (to == DType::BF16 && from == DType::F32) || (to == DType::F32 && from == DType::BF16);
  const unsigned g = to == from ? 0 : mapped ? map_grid(n, mis_at < 0) : cuda::grid_for(n, 256);
  check(
      what, a, [](auto& t) { cpu().cast(t[0], t[1]); },
      [](auto& t) { cuda::cast(ctx.get(), t[0], t[1]); }, -1, g,
      [](auto& t) { plant_specials(t[1]); });
}

// ---- SwiGLU: exp in another implementation (and order), so within rtol_of ----

void swiglu(DType dt, int64_t n, int mis_at) {
  const bool bf = dt == DType::BF16;
  const unsigned g = bf ? map_grid(n, mis_at < 0) : cuda::grid_for(n, 256);
  const double rt = rtol_of(dt);
  if (mis_at < 3) {  // h, gate, up
    std::vector<Arg> a = {{dt, {n}, true}, {dt, {n}, false, 0, -6, 6}, {dt, {n}, false, 0, -2, 2}};
    if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
    check(
        label("swiglu_forward", dt, n, mis_at), a,
        [](auto& t) { cpu().swiglu_forward(t[0], t[1], t[2]); },
        [](auto& t) { cuda::swiglu_forward(ctx.get(), t[0], t[1], t[2]); }, rt, g);
  }
  // dgate, dup (overwritten), dh, gate, up
  std::vector<Arg> a = {{dt, {n}, true},
                        {dt, {n}, true},
                        {dt, {n}},
                        {dt, {n}, false, 0, -6, 6},
                        {dt, {n}, false, 0, -2, 2}};
  if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
  check(
      label("swiglu_backward", dt, n, mis_at), a,
      [](auto& t) { cpu().swiglu_backward(t[0], t[1], t[2], t[3], t[4]); },
      [](auto& t) { cuda::swiglu_backward(ctx.get(), t[0], t[1], t[2], t[3], t[4]); }, rt, g);
}

// ---- rotary: x (B*T, H, 2*half), tables (Tmax >= T, half) ----
// Within rtol_of: x*c - y*s may be contracted to an FMA, differently by each
// compiler (host -march=x86-64-v3, nvcc's default -fmad).

struct RopeShape {
  int64_t B, T, H, half, Tmax;
};

// mis_at: 0 x, 1 cos, 2 sin misaligned; `w` the kernel's pairs per thread.
void rope(DType dt, RopeShape s, int mis_at, int w) {
  const DType tdt = dt == DType::BF16 ? DType::F32 : dt;
  const int64_t rows = s.B * s.T, n = rows * s.H * s.half;
  std::vector<Arg> a = {
      {dt, {rows, s.H, 2 * s.half}, true}, {tdt, {s.Tmax, s.half}}, {tdt, {s.Tmax, s.half}}};
  if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
  const unsigned g = cuda::grid_for(n / w, 256);
  const std::string shape = " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                            " H=" + std::to_string(s.H) + " half=" + std::to_string(s.half) +
                            " W=" + std::to_string(w) +
                            (mis_at >= 0 ? " misaligned #" + std::to_string(mis_at) : "");
  const double rt = rtol_of(dt);
  const int64_t T = s.T;
  check(
      "rope_forward " + dtname(dt) + shape, a,
      [T](auto& t) { cpu().rope_forward(t[0], t[1], t[2], T); },
      [T](auto& t) { cuda::rope_forward(ctx.get(), t[0], t[1], t[2], T); }, rt, g);
  check(
      "rope_backward " + dtname(dt) + shape, a,
      [T](auto& t) { cpu().rope_backward(t[0], t[1], t[2], T); },
      [T](auto& t) { cuda::rope_backward(ctx.get(), t[0], t[1], t[2], T); }, rt, g);
}

// ---- the fused projections' ops ----

// h (N, F), gu (N, 2F); mis_at: 0 h (dgu), 1 gu (dh), 2 gu in the backward.
void swiglu_packed(DType dt, int64_t N, int64_t F, int mis_at) {
  const bool bf = dt == DType::BF16;
  const int64_t n = N * F;
  const unsigned g = bf ? map_grid(n, mis_at < 0 && F % 8 == 0) : cuda::grid_for(n, 256);
  const double rt = rtol_of(dt);
  const std::string shape = " N=" + std::to_string(N) + " F=" + std::to_string(F) +
                            (mis_at >= 0 ? " misaligned #" + std::to_string(mis_at) : "");
  if (mis_at < 2) {
    std::vector<Arg> a = {{dt, {N, F}, true}, {dt, {N, 2 * F}, false, 0, -6, 6}};
    if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
    check(
        "swiglu_packed_forward " + dtname(dt) + shape, a,
        [](auto& t) { cpu().swiglu_packed_forward(t[0], t[1]); },
        [](auto& t) { cuda::swiglu_packed_forward(ctx.get(), t[0], t[1]); }, rt, g);
  }
  std::vector<Arg> a = {{dt, {N, 2 * F}, true}, {dt, {N, F}}, {dt, {N, 2 * F}, false, 0, -6, 6}};
  if (mis_at >= 0) a[size_t(mis_at)].mis = 1;
  check(
      "swiglu_packed_backward " + dtname(dt) + shape, a,
      [](auto& t) { cpu().swiglu_packed_backward(t[0], t[1], t[2]); },
      [](auto& t) { cuda::swiglu_packed_backward(ctx.get(), t[0], t[1], t[2]); }, rt, g);
}

struct QkvShape {
  int64_t B, T, Hq, KV, half, Tmax;
};

// The split (q, k, v from qkv) and the merge (dqkv from dq, dk, dv); mis_at
// names the misaligned operand of each call in its argument order.
void qkv_rope(DType dt, QkvShape s, int mis_at, int w) {
  const DType tdt = dt == DType::BF16 ? DType::F32 : dt;
  const int64_t rows = s.B * s.T, hd = 2 * s.half, n = rows * (s.Hq + 2 * s.KV) * s.half;
  const Arg fused{dt, {rows, (s.Hq + 2 * s.KV) * hd}}, q{dt, {rows, s.Hq * hd}},
      kv{dt, {rows, s.KV * hd}}, tab{tdt, {s.Tmax, s.half}};
  const unsigned g = cuda::grid_for(n / w, 256);
  const std::string shape = " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                            " Hq=" + std::to_string(s.Hq) + " KV=" + std::to_string(s.KV) +
                            " half=" + std::to_string(s.half) + " W=" + std::to_string(w) +
                            (mis_at >= 0 ? " misaligned #" + std::to_string(mis_at) : "");
  const double rt = rtol_of(dt);
  const int64_t T = s.T;
  std::vector<Arg> split = {q, kv, kv, fused, tab, tab};
  for (int i = 0; i < 3; ++i) split[size_t(i)].out = true;
  if (mis_at >= 0) split[size_t(mis_at)].mis = 1;
  check(
      "qkv_rope_split " + dtname(dt) + shape, split,
      [T](auto& t) { cpu().qkv_rope_split(t[0], t[1], t[2], t[3], t[4], t[5], T); },
      [T](auto& t) { cuda::qkv_rope_split(ctx.get(), t[0], t[1], t[2], t[3], t[4], t[5], T); },
      rt, g);
  std::vector<Arg> merge = {fused, q, kv, kv, tab, tab};
  merge[0].out = true;
  if (mis_at >= 0) merge[size_t(mis_at)].mis = 1;
  check(
      "qkv_rope_merge_backward " + dtname(dt) + shape, merge,
      [T](auto& t) { cpu().qkv_rope_merge_backward(t[0], t[1], t[2], t[3], t[4], t[5], T); },
      [T](auto& t) {
        cuda::qkv_rope_merge_backward(ctx.get(), t[0], t[1], t[2], t[3], t[4], t[5], T);
      },
      rt, g);
}

// ---- grid-stride loops ----
//
// The ops' grids cover every element in one round up to 65536 blocks x 256
// threads; past that each thread loops. An op call that large takes ~14 s a
// launch in the emulation (measured: 29 s for scale_inplace f32, both warp
// orders), so the loops' later rounds are checked here with the kernels
// launched directly on a grid of 2 or 3 blocks, against the CPU op.

void grid_stride() {
  using cuda::launch;
  const int64_t n = 2000;  // 3 blocks: 3 rounds; 2 blocks: 4 rounds
  check(
      "add_kernel f32 grid 3", {{DType::F32, {n}, true}, {DType::F32, {n}}},
      [](auto& t) { cpu().add_inplace(t[0], t[1]); },
      [](auto& t) {
        launch("add_inplace", cuda::add_kernel<float>, 3, 256, 0, nullptr,
               t[0].template ptr<float>(), t[1].template ptr<float>(), t[0].numel());
      },
      -1, 3);
  check(
      "scale_kernel f64 grid 2", {{DType::F64, {n}, true}},
      [](auto& t) { cpu().scale_inplace(t[0], 0.37); },
      [](auto& t) {
        launch("scale_inplace", cuda::scale_kernel<double>, 2, 256, 0, nullptr,
               t[0].template ptr<double>(), 0.37, t[0].numel());
      },
      -1, 2);
  check(
      "cast_kernel f64->bf16 grid 2", {{DType::BF16, {n}, true}, {DType::F64, {n}}},
      [](auto& t) { cpu().cast(t[0], t[1]); },
      [](auto& t) {
        launch("cast", cuda::cast_kernel<bf16_bits, double>, 2, 256, 0, nullptr,
               t[0].template ptr<bf16_bits>(), t[1].template ptr<double>(), t[0].numel());
      },
      -1, 2, [](auto& t) { plant_specials(t[1]); });
  // launch_map's kernel: 1000 vectors and a tail of 3 on 2 blocks.
  check(
      "map_kernel add bf16 grid 2", {{DType::BF16, {8003}, true}, {DType::BF16, {8003}}},
      [](auto& t) { cpu().add_inplace(t[0], t[1]); },
      [](auto& t) {
        const cuda::AddBf16 op{t[0].template ptr<bf16_bits>(), t[1].template ptr<bf16_bits>()};
        launch("add_inplace", cuda::map_kernel<cuda::AddBf16>, 2, 256, 0, nullptr, op,
               int64_t(8003), int64_t(1000));
      },
      -1, 2);
  check(
      "swiglu_fwd_kernel f32 grid 3",
      {{DType::F32, {n}, true}, {DType::F32, {n}, false, 0, -6, 6}, {DType::F32, {n}}},
      [](auto& t) { cpu().swiglu_forward(t[0], t[1], t[2]); },
      [](auto& t) {
        launch("swiglu_forward", cuda::swiglu_fwd_kernel<float>, 3, 256, 0, nullptr,
               t[0].template ptr<float>(), t[1].template ptr<float>(), t[2].template ptr<float>(),
               t[0].numel(), t[0].numel(), t[0].numel());
      },
      rtol_of(DType::F32), 3);
  check(
      "swiglu_bwd_kernel f64 grid 3",
      {{DType::F64, {n}, true},
       {DType::F64, {n}, true},
       {DType::F64, {n}},
       {DType::F64, {n}, false, 0, -6, 6},
       {DType::F64, {n}}},
      [](auto& t) { cpu().swiglu_backward(t[0], t[1], t[2], t[3], t[4]); },
      [](auto& t) {
        launch("swiglu_backward", cuda::swiglu_bwd_kernel<double>, 3, 256, 0, nullptr,
               t[0].template ptr<double>(), t[1].template ptr<double>(),
               t[2].template ptr<double>(), t[3].template ptr<double>(),
               t[4].template ptr<double>(), t[0].numel(), t[0].numel(), t[0].numel());
      },
      rtol_of(DType::F64), 3);
  // Rotary: rows 12 (B 3, T 4), H 3, half 32 (table of 6 positions): 1152
  // pairs, 144 groups of 8.
  const std::vector<Arg> r32 = {
      {DType::F32, {12, 3, 64}, true}, {DType::F32, {6, 32}}, {DType::F32, {6, 32}}};
  check(
      "rope_kernel f32 forward grid 2", r32,
      [](auto& t) { cpu().rope_forward(t[0], t[1], t[2], 4); },
      [](auto& t) {
        launch("rope_forward", cuda::rope_kernel<float, false>, 2, 256, 0, nullptr,
               t[0].template ptr<float>(), t[1].template ptr<float>(), t[2].template ptr<float>(),
               int64_t(12), int64_t(3), int64_t(32), int64_t(4));
      },
      rtol_of(DType::F32), 2);
  std::vector<Arg> rbf = r32;
  rbf[0].dt = DType::BF16;
  for (int w : {8, 1}) {
    check(
        "rope_bf16_kernel backward W=" + std::to_string(w) + " grid " + (w == 8 ? "1" : "2"), rbf,
        [](auto& t) { cpu().rope_backward(t[0], t[1], t[2], 4); },
        [w](auto& t) {
          // W = 8 on one block of 128 threads: 144 groups, two rounds.
          launch("rope_backward",
                 w == 8 ? cuda::rope_bf16_kernel<true, 8> : cuda::rope_bf16_kernel<true, 1>,
                 1 + (w == 1), w == 8 ? 128 : 256, 0, nullptr, t[0].template ptr<bf16_bits>(),
                 t[1].template ptr<float>(), t[2].template ptr<float>(), int64_t(12), int64_t(3),
                 int64_t(32), int64_t(4));
        },
        rtol_of(DType::BF16), w == 8 ? 1 : 2);
  }
}

// ---- the ops' checks: each bad call is refused before any launch ----

void bad_calls() {
  Mem m;
  Tensor f4 = m.make(DType::F32, {4}), f5 = m.make(DType::F32, {5}), d4 = m.make(DType::F64, {4});
  Tensor i4 = m.make(DType::I32, {4});
  const auto& c = ctx.get();
  expect_throw("add_inplace f32 += f64", [&] { cuda::add_inplace(c, f4, d4); });
  expect_throw("add_inplace sizes", [&] { cuda::add_inplace(c, f4, f5); });
  expect_throw("scale_inplace i32", [&] { cuda::scale_inplace(c, i4, 2.0); });
  expect_throw("cast sizes", [&] { cuda::cast(c, f4, f5); });
  expect_throw("cast i32->f32", [&] { cuda::cast(c, f4, i4); });
  expect_throw("swiglu_forward mixed dtypes", [&] { cuda::swiglu_forward(c, f4, f4, d4); });
  // up (and dup) in another dtype than gate: up would be read as gate's type.
  expect_throw("swiglu_backward up f64, gate f32",
          [&] { cuda::swiglu_backward(c, f4, d4, f4, f4, d4); });
  Tensor x = m.make(DType::BF16, {6, 2, 8}), cb = m.make(DType::BF16, {3, 4});
  Tensor cf = m.make(DType::F32, {3, 4}), x32 = m.make(DType::F32, {6, 2, 8});
  expect_throw("rope_forward bf16 x with bf16 tables", [&] { cuda::rope_forward(c, x, cb, cb, 3); });
  expect_throw("rope_forward rows % T", [&] { cuda::rope_forward(c, x, cf, cf, 4); });
  expect_throw("rope_forward T > table", [&] {
    Tensor x8 = m.make(DType::F32, {8, 2, 8});
    cuda::rope_forward(c, x8, cf, cf, 4);
  });
  expect_throw("rope_backward f32 x, f64 tables", [&] {
    Tensor cd = m.make(DType::F64, {3, 4});
    cuda::rope_backward(c, x32, cd, cd, 3);
  });
  // The fused projections' ops: packed gate/up of the wrong width or dtype;
  // q/k/v heads that do not add up to qkv's, a dtype mix, rows % T.
  Tensor h = m.make(DType::F32, {3, 4}), gu = m.make(DType::F32, {3, 8});
  Tensor gu7 = m.make(DType::F32, {3, 7}), gud = m.make(DType::F64, {3, 8});
  expect_throw("swiglu_packed_forward gu (3,7)", [&] { cuda::swiglu_packed_forward(c, h, gu7); });
  expect_throw("swiglu_packed_forward f64 gu", [&] { cuda::swiglu_packed_forward(c, h, gud); });
  expect_throw("swiglu_packed_backward dgu (3,7)",
               [&] { cuda::swiglu_packed_backward(c, gu7, h, gu); });
  Tensor qkv = m.make(DType::F32, {6, 4 * 8}), q2 = m.make(DType::F32, {6, 2 * 8});
  Tensor k1 = m.make(DType::F32, {6, 8}), k2 = m.make(DType::F32, {6, 2 * 8});
  Tensor k1d = m.make(DType::F64, {6, 8});
  expect_throw("qkv_rope_split heads", [&] { cuda::qkv_rope_split(c, q2, k2, k1, qkv, cf, cf, 3); });
  expect_throw("qkv_rope_split f64 v", [&] { cuda::qkv_rope_split(c, q2, k1, k1d, qkv, cf, cf, 3); });
  expect_throw("qkv_rope_merge_backward rows % T",
               [&] { cuda::qkv_rope_merge_backward(c, qkv, q2, k1, k1, cf, cf, 4); });
}

}  // namespace

int main() {
  // f32/f64: several blocks with a partial last one, and one partial block.
  for (DType dt : {DType::F32, DType::F64}) {
    for (int64_t n : {1000, 37}) {
      add_scale(dt, n, -1);
      swiglu(dt, n, -1);
    }
  }
  // bf16: 700 vectors (3 blocks) and a tail of 5; vectors only; fewer than
  // 8 elements (tail only); then each operand misaligned in turn (scalar).
  for (int64_t n : {5605, 4096, 5}) {
    add_scale(DType::BF16, n, -1);
    swiglu(DType::BF16, n, -1);
  }
  for (int mis = 0; mis < 2; ++mis) add_scale(DType::BF16, 5605, mis);
  for (int mis = 0; mis < 5; ++mis) swiglu(DType::BF16, 2053, mis);

  // Casts: every pair (and the same-dtype copies); f32<->bf16 vectorised
  // with a tail, and with either side misaligned.
  const DType all[] = {DType::F32, DType::F64, DType::BF16};
  for (DType to : all)
    for (DType from : all) cast(to, from, 1000, -1);
  for (auto p : {std::pair{DType::BF16, DType::F32}, std::pair{DType::F32, DType::BF16}}) {
    cast(p.first, p.second, 5605, -1);
    cast(p.first, p.second, 5605, 0);
    cast(p.first, p.second, 5605, 1);
  }

  // Rotary, f32/f64: odd half, several blocks, a table longer than T; H = 1.
  for (DType dt : {DType::F32, DType::F64}) {
    rope(dt, {3, 7, 3, 5, 9}, -1, 1);
    rope(dt, {2, 4, 1, 8, 4}, -1, 1);
    rope(dt, {2, 5, 2, 16, 6}, 1, 1);
  }
  // bf16, W = 8: half % 8 == 0, aligned, 384 threads' work (two blocks);
  // W = 1: half % 8 != 0, or x / cos / sin misaligned.
  rope(DType::BF16, {4, 6, 4, 32, 9}, -1, 8);
  rope(DType::BF16, {3, 5, 1, 8, 5}, -1, 8);
  rope(DType::BF16, {3, 7, 3, 12, 9}, -1, 1);
  for (int mis = 0; mis < 3; ++mis) rope(DType::BF16, {2, 6, 4, 16, 8}, mis, 1);

  // Packed SwiGLU: F % 8 == 0 vectorised (several blocks), F % 8 != 0 scalar
  // (a vector would straddle rows), each operand misaligned; f32/f64.
  for (DType dt : {DType::F32, DType::F64}) swiglu_packed(dt, 37, 21, -1);
  swiglu_packed(DType::BF16, 97, 40, -1);
  swiglu_packed(DType::BF16, 13, 12, -1);
  for (int mis = 0; mis < 3; ++mis) swiglu_packed(DType::BF16, 21, 16, mis);
  // q/k/v split and merge: GQA (Hq > KV) and MHA, odd half, tables longer
  // than T; bf16 W = 8 and each operand misaligned (W = 1).
  for (DType dt : {DType::F32, DType::F64}) {
    qkv_rope(dt, {2, 5, 4, 2, 5, 7}, -1, 1);
    qkv_rope(dt, {3, 4, 2, 2, 8, 4}, -1, 1);
  }
  qkv_rope(DType::BF16, {3, 6, 4, 2, 16, 9}, -1, 8);
  qkv_rope(DType::BF16, {2, 5, 3, 1, 12, 5}, -1, 1);
  for (int mis = 0; mis < 6; ++mis) qkv_rope(DType::BF16, {2, 4, 2, 1, 8, 4}, mis, 1);

  grid_stride();
  bad_calls();
  return finish("pointwise");
}
