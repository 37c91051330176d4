// Mixture-of-experts combine kernels (kernels/cuda/combine_kernels.cuh) in the
// CUDA emulation against the CPU backend: combine_rows (overwrite and
// accumulate, weighted and unweighted) and combine_rows_backward (dy and dw,
// each alone and both), in f32, f64 and bf16 (fp32 math); dropped slots
// (pos < 0) anywhere in a row and rows with none kept, rows wider than a
// block, misaligned views. See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"

#include <algorithm>
#include <numeric>

#include "kernels/cuda/combine_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

struct Case {
  int64_t N, M, k, C;
  int mis;  // elements off 16-byte alignment (out / dout / dy)
};

std::string name(const char* op, DType dt, const Case& s, bool weighted, const char* form) {
  return std::string(op) + " " + dtname(dt) + " N=" + std::to_string(s.N) + " M=" +
         std::to_string(s.M) + " k=" + std::to_string(s.k) + " C=" + std::to_string(s.C) +
         (weighted ? " weighted" : " unweighted") + form + (s.mis ? " misaligned" : "");
}

// pos(N,k): rows of y, about one slot in four dropped (-1), row 1 (when
// N > 1) all dropped. unique: every row of y named at most once (the
// backward's contract); needs M >= N k.
Tensor positions(Mem& m, std::mt19937& rng, const Case& s, bool unique) {
  Tensor p = m.make(DType::I32, {s.N, s.k});
  int32_t* pp = p.ptr<int32_t>();
  std::vector<int32_t> perm(size_t(s.M));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int32_t> row(0, int32_t(s.M - 1)), drop(0, 3);
  for (int64_t i = 0; i < s.N * s.k; ++i) {
    const bool dropped = drop(rng) == 0 || (s.N > 1 && i / s.k == 1);
    pp[i] = dropped ? -1 : unique ? perm[size_t(i)] : row(rng);
  }
  return p;
}

void forward(DType dt, const Case& s, bool weighted, bool accumulate) {
  const std::string what =
      name("combine_rows", dt, s, weighted, accumulate ? " accumulate" : " overwrite");
  std::mt19937 rng(unsigned(s.N * 13 + s.C * 3 + s.k + accumulate));
  Mem m;
  Ctx ctx;
  Tensor y = m.make(dt, {s.M, s.C}), pos = positions(m, rng, s, false);
  Tensor w = weighted ? m.make(dt, {s.N, s.k}) : Tensor(nullptr, dt, {0});
  Tensor out0 = m.make(dt, {s.N, s.C});
  fill(y, rng), fill(out0, rng);  // the overwrite form must ignore out0
  if (weighted) fill(w, rng, 0, 1);
  Tensor outc = m.make(dt, {s.N, s.C});
  copy(outc, out0);
  cpu().combine_rows(outc, y, pos, w, accumulate);

  Tensor outs[2];
  int k = 0;
  run_both([&] {
    outs[k] = m.make(dt, {s.N, s.C}, s.mis);
    copy(outs[k], out0);
    cuda::combine_rows(ctx.get(), outs[k], y, pos, w, accumulate);
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(dt);
  close(what + " out", outs[0], outc, rt, rt);
  if (!same_bits(outs[0], outs[1])) fail(what + ": the two warp orders differ");
}

void backward(DType dt, const Case& s, bool weighted, bool want_dy, bool want_dw) {
  const std::string what = name("combine_rows_backward", dt, s, weighted,
                                want_dy && want_dw ? " dy+dw" : want_dy ? " dy" : " dw");
  std::mt19937 rng(unsigned(s.N * 11 + s.C + s.k * 5 + want_dy * 2 + want_dw));
  Mem m;
  Ctx ctx;
  const DType dwt = dt == DType::BF16 ? DType::F32 : dt;
  Tensor y = m.make(dt, {s.M, s.C}), pos = positions(m, rng, s, true);
  Tensor dout = m.make(dt, {s.N, s.C}, s.mis);
  Tensor w = weighted ? m.make(dt, {s.N, s.k}) : Tensor(nullptr, dt, {0});
  Tensor dy0 = m.make(dt, {s.M, s.C});  // rows no pos names must keep these
  fill(y, rng), fill(dout, rng), fill(dy0, rng);
  if (weighted) fill(w, rng, 0, 1);
  Tensor dyc = m.make(dt, {s.M, s.C}), dwc = m.make(dwt, {s.N, s.k});
  copy(dyc, dy0);
  const Tensor none(nullptr, dt, {0}), none_w(nullptr, dwt, {0});
  cpu().combine_rows_backward(want_dy ? dyc : none, want_dw ? dwc : none_w, dout, y, pos, w);

  Tensor dys[2], dws[2];
  int k = 0;
  run_both([&] {
    dys[k] = m.make(dt, {s.M, s.C}, s.mis);
    dws[k] = m.make(dwt, {s.N, s.k});  // NaN bytes: every element must be written
    copy(dys[k], dy0);
    cuda::combine_rows_backward(ctx.get(), want_dy ? dys[k] : none, want_dw ? dws[k] : none_w,
                                dout, y, pos, w);
    ++k;
  });
  m.guards_ok(what);
  if (want_dy) {
    // One product per element, rounded once, as the CPU's.
    close(what + " dy", dys[0], dyc, rtol_of(dt), rtol_of(dt));
    if (!same_bits(dys[0], dys[1])) fail(what + ": dy: the two warp orders differ");
  }
  if (want_dw) {
    // A dot product over C, summed in another order (a block reduction).
    close(what + " dw", dws[0], dwc, rtol_of(dwt), rtol_of(dwt));
    if (!same_bits(dws[0], dws[1])) fail(what + ": dw: the two warp orders differ");
  }
}

// The CPU backend's shape checks (kernels/op_checks.hpp), on the CUDA ops:
// weights of the wrong size, pos not int32 throw before any launch. A row
// index past y is found on the device: the slot is skipped (the other slots
// still combine), and the error words name it (kind 3: slot, pos, rows).
void refusals() {
  Mem m;
  Ctx ctx;
  Tensor y = m.make(DType::F32, {8, 16}), out = m.make(DType::F32, {2, 16});
  Tensor pos = m.make(DType::I32, {2, 2}), w = m.make(DType::F32, {2, 2});
  Tensor w3 = m.make(DType::F32, {3}), posf = m.make(DType::F32, {2, 2});
  Tensor dy = m.make(DType::F32, {8, 16}), dw = m.make(DType::F32, {2, 2});
  std::mt19937 rng(5);
  fill(y, rng), fill(w, rng), fill(out, rng);
  const int32_t rows[4] = {0, 7, -1, 8};  // 8: past y's 8 rows
  std::memcpy(pos.data, rows, sizeof rows);
  auto expect_words = [&](const std::string& what) {
    int64_t* e = ctx.err();
    if (e[0] != 3 || e[1] != 3 || e[2] != 8 || e[3] != 8)
      fail(what + ": error words [" + std::to_string(e[0]) + ", " + std::to_string(e[1]) + ", " +
           std::to_string(e[2]) + ", " + std::to_string(e[3]) + "], expected [3, 3, 8, 8]");
    std::fill(e, e + 4, int64_t(0));
  };
  cuda::combine_rows(ctx.get(), out, y, pos, w, false);
  expect_words("combine_rows pos 8 of 8 rows");
  // row 0 still combines its two in-range slots
  for (int64_t c = 0; c < 16; ++c) {
    const float want = w.ptr<float>()[0] * y.ptr<float>()[c] + w.ptr<float>()[1] * y.ptr<float>()[7 * 16 + c];
    if (std::abs(out.ptr<float>()[c] - want) > 1e-6f) {
      fail("combine_rows pos 8 of 8 rows: row 0 column " + std::to_string(c) + " wrong");
      break;
    }
  }
  cuda::combine_rows_backward(ctx.get(), dy, dw, out, y, pos, w);
  expect_words("combine_rows_backward pos 8 of 8 rows");
  if (dw.ptr<float>()[3] != 0.f) fail("combine_rows_backward pos 8 of 8 rows: its dw is not 0");
  m.guards_ok("combine refusals");
  pos.ptr<int32_t>()[3] = 3;
  expect_throw("combine_rows 3 weights for 4 slots",
               [&] { cuda::combine_rows(ctx.get(), out, y, pos, w3, false); });
  expect_throw("combine_rows f32 pos",
               [&] { cuda::combine_rows(ctx.get(), out, y, posf, w, false); });
  // and the same call with pos in range goes through, with no error words
  const size_t before = cuda_sim::launches.size();
  cuda::combine_rows(ctx.get(), out, y, pos, w, false);
  if (cuda_sim::launches.size() != before + 1) fail("combine_rows in range: not launched");
  if (ctx.err()[0] != 0) fail("combine_rows in range: error words set");
}

}  // namespace

int main() {
  refusals();
  // C = 300: rows wider than the 256 threads; C = 40: more than one warp of
  // columns, fewer than a block; C = 7, k = 1: the smallest.
  const Case cases[] = {{6, 30, 3, 300, 0}, {9, 40, 4, 40, 0}, {5, 12, 1, 7, 0},
                        {7, 32, 4, 33, 1}};
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const Case& s : cases) {
      for (bool weighted : {true, false}) {
        forward(dt, s, weighted, false);
        forward(dt, s, weighted, true);
      }
      backward(dt, s, true, true, true);
      backward(dt, s, false, true, true);
      backward(dt, s, true, true, false);
      backward(dt, s, true, false, true);
    }
  return finish("combine");
}
