// FP8 kernels (kernels/cuda/fp8_kernels.cuh) in the CUDA emulation against
// the CPU backend, bit for bit (a cast has one right answer): fp8_amax
// (fresh and accumulating, over one and many blocks, more elements than the
// partial pass's grid covers, with a NaN and with -inf), fp8_scale (E4M3,
// E5M2, margins, amax zero/inf), fp8_quantize to E4M3 and E5M2 from bf16
// and f32, its transposed output on shapes that are not multiples of the
// 32x32 tiles, and fp8_dequantize to f32 and bf16; values span the formats'
// subnormals, normals, ties and saturation. Refusals: wrong dtypes and sizes.
// See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"
// (the emulated CUDA first: the kernel header builds on it)

#include "kernels/cuda/fp8_kernels.cuh"

#include <cfloat>
#include <limits>

namespace {
using namespace adgt;
using namespace adgt::sim_check;

// Values over many binades, negative and positive, some exact FP8 ties.
void fill_wide(const Tensor& t, std::mt19937& rng, float amp) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-20, 2);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = float(std::ldexp(u(rng), e(rng))) * amp;
    if (i % 7 == 3) v = float(std::ldexp(1.0 + 1.0 / 16, e(rng)));  // an E4M3 tie
    if (t.dtype == DType::F32)
      t.ptr<float>()[i] = v;
    else
      t.ptr<bf16_bits>()[i] = float_to_bf16(v);
  }
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

void check_amax(DType dt, int64_t n, bool accumulate, float special) {
  const std::string what = "fp8_amax " + dtname(dt) + " n=" + std::to_string(n) +
                           (accumulate ? " accumulate" : "") +
                           (special != 0 ? " special " + std::to_string(special) : "");
  std::mt19937 rng(unsigned(n + accumulate));
  Mem m;
  Ctx ctx;
  Tensor x = m.make(dt, {n}), a = m.make(DType::F32, {1}), ac = m.make(DType::F32, {1});
  fill_wide(x, rng, 3.0f);
  if (special != 0 && n > 5) {
    if (dt == DType::F32)
      x.ptr<float>()[n - 5] = special;
    else
      x.ptr<bf16_bits>()[n - 5] = float_to_bf16(special);
  }
  const float old = 2.5f;
  ac.ptr<float>()[0] = old;
  cpu().fp8_amax(ac, x, accumulate);
  float got[2];
  int k = 0;
  run_both([&] {
    a.ptr<float>()[0] = old;
    cuda::fp8_amax(ctx.get(), a, x, accumulate);
    got[k++] = a.ptr<float>()[0];
  });
  m.guards_ok(what);
  ++checks;
  if (!same_float(got[0], ac.ptr<float>()[0]) || !same_float(got[1], got[0])) {
    char buf[160];
    std::snprintf(buf, sizeof buf, ": got %.9g / %.9g, want %.9g", got[0], got[1], ac.ptr<float>()[0]);
    fail(what + buf);
  }
}

void check_scale() {
  Mem m;
  Ctx ctx;
  Tensor a = m.make(DType::F32, {1}), s = m.make(DType::F32, {1}), sc = m.make(DType::F32, {1});
  for (float amax : {0.0f, 1e-30f, 0.37f, 1.75f, 1.76f, 448.0f, 449.0f, 6e4f, INFINITY})
    for (Fp8Kind k : {Fp8Kind::E4M3, Fp8Kind::E5M2})
      for (int margin : {0, 2}) {
        a.ptr<float>()[0] = amax;
        cpu().fp8_scale(sc, a, k, margin);
        cuda::fp8_scale(ctx.get(), s, a, k, margin);
        ++checks;
        if (!same_float(s.ptr<float>()[0], sc.ptr<float>()[0]))
          fail("fp8_scale amax " + std::to_string(amax) + " margin " + std::to_string(margin) +
               ": got " + std::to_string(s.ptr<float>()[0]) + ", want " +
               std::to_string(sc.ptr<float>()[0]));
      }
}

void check_quantize(DType dt, DType qdt, int64_t R, int64_t C, float scale) {
  const std::string what = "fp8_quantize " + dtname(dt) + "->" + dtname(qdt) + " " +
                           std::to_string(R) + "x" + std::to_string(C);
  std::mt19937 rng(unsigned(R * 31 + C));
  Mem m;
  Ctx ctx;
  Tensor x = m.make(dt, {R, C}), s = m.make(DType::F32, {1});
  fill_wide(x, rng, qdt == DType::E4M3 ? 1.0f : 100.0f);
  s.ptr<float>()[0] = scale;
  Tensor q = m.make(qdt, {R, C}), qt = m.make(qdt, {C, R}), qc = m.make(qdt, {R, C}),
         qtc = m.make(qdt, {C, R});
  cpu().fp8_quantize(qc, qtc, x, s);
  bool same[2] = {true, true};
  int k = 0;
  run_both([&] {
    cuda::fp8_quantize(ctx.get(), q, qt, x, s);
    same[k++] = same_bits(q, qc) && same_bits(qt, qtc);
  });
  ++checks;
  if (!same[0] || !same[1]) {
    int64_t i = 0;
    while (i < q.numel() && q.ptr<uint8_t>()[i] == qc.ptr<uint8_t>()[i]) ++i;
    fail(what + ": codes differ from the CPU's (first at q[" + std::to_string(i) + "]" +
         (i == q.numel() ? ", in qt" : "") + ")");
  }
  // Without the transpose: q alone.
  Tensor q2 = m.make(qdt, {R, C});
  cuda::fp8_quantize(ctx.get(), q2, Tensor(), x, s);
  ++checks;
  if (!same_bits(q2, qc)) fail(what + " (no qt): codes differ");
  // Back: f32 and bf16.
  for (DType od : {DType::F32, DType::BF16}) {
    Tensor o = m.make(od, {R, C}), oc = m.make(od, {R, C});
    cpu().fp8_dequantize(oc, qc, s);
    cuda::fp8_dequantize(ctx.get(), o, qc, s);
    ++checks;
    if (!same_bits(o, oc)) fail("fp8_dequantize " + dtname(qdt) + "->" + dtname(od) + ": differs");
  }
  m.guards_ok(what);
}

void refusals() {
  Mem m;
  Ctx ctx;
  Tensor x = m.make(DType::BF16, {4, 8}), s = m.make(DType::F32, {1}),
         q = m.make(DType::E4M3, {4, 8}), bad = m.make(DType::BF16, {4, 8}),
         small = m.make(DType::E4M3, {4, 7}), f64 = m.make(DType::F64, {4, 8});
  expect_throw("fp8_quantize into bf16", [&] { cuda::fp8_quantize(ctx.get(), bad, Tensor(), x, s); });
  expect_throw("fp8_quantize size", [&] { cuda::fp8_quantize(ctx.get(), small, Tensor(), x, s); });
  expect_throw("fp8_quantize f64 x", [&] { cuda::fp8_quantize(ctx.get(), q, Tensor(), f64, s); });
  expect_throw("fp8_quantize qt size", [&] { cuda::fp8_quantize(ctx.get(), q, small, x, s); });
  expect_throw("fp8_amax f64 amax", [&] { cuda::fp8_amax(ctx.get(), f64, x, false); });
  expect_throw("fp8_dequantize into f64", [&] { cuda::fp8_dequantize(ctx.get(), f64, q, s); });
}

}  // namespace

int main() {
  for (DType dt : {DType::F32, DType::BF16}) {
    // One element, a partial block, many blocks, and more than the partial
    // pass's 512 blocks of 256 cover in one round (its grid-stride loop).
    for (int64_t n : {int64_t(1), int64_t(300), int64_t(70000), int64_t(512 * 256 * 2 + 77)})
      for (bool acc : {false, true}) check_amax(dt, n, acc, 0.0f);
    check_amax(dt, 5000, false, std::numeric_limits<float>::quiet_NaN());
    check_amax(dt, 5000, true, -INFINITY);
    check_amax(dt, 5000, false, 1e6f);
  }
  check_amax(DType::F32, 0, true, 0.0f);  // empty: the old amax stays
  check_scale();
  for (DType qdt : {DType::E4M3, DType::E5M2})
    for (DType dt : {DType::F32, DType::BF16}) {
      check_quantize(dt, qdt, 64, 96, 1.0f);          // whole tiles
      check_quantize(dt, qdt, 37, 53, 256.0f);        // partial tiles, a large scale (saturates)
      check_quantize(dt, qdt, 1, 70, 0.0625f);        // one row
      check_quantize(dt, qdt, 300, 33, 4.0f);         // many row tiles
    }
  refusals();
  return finish("fp8");
}
