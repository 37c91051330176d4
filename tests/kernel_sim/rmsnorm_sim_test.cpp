// RMSNorm kernels (kernels/cuda/rmsnorm_kernels.cuh) in the CUDA emulation
// against the CPU backend: forward, the bf16 residual form, backward (dx and
// the weight gradient, both accumulating), in f32, f64 and bf16; vectorised
// (C % 8 == 0, aligned) and scalar paths, rows longer than a block, and the
// two-pass weight gradient (N > 128 rows; every dtype). See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"

#include "kernels/cuda/rmsnorm_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

DType stat_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

std::string name(const char* op, DType dt, int64_t N, int64_t C, int mis) {
  return std::string(op) + " " + dtname(dt) + " N=" + std::to_string(N) + " C=" +
         std::to_string(C) + (mis ? " misaligned" : "");
}

void forward(DType dt, int64_t N, int64_t C, int mis, bool residual) {
  const std::string what = name(residual ? "residual_rmsnorm_forward" : "rmsnorm_forward", dt, N,
                                C, mis);
  std::mt19937 rng(unsigned(N * 131 + C));
  Mem m;
  Ctx ctx;
  const double eps = 1e-5;
  Tensor x = m.make(dt, {N, C}, mis), y = m.make(dt, {N, C}, mis), w = m.make(dt, {C});
  fill(x, rng), fill(y, rng), fill(w, rng, 0.5, 1.5);
  Tensor xc = m.make(dt, {N, C}), outc = m.make(dt, {N, C}), rc = m.make(stat_dtype(dt), {N});
  copy(xc, x);
  if (residual)
    cpu().residual_rmsnorm_forward(xc, y, outc, rc, w, eps);
  else
    cpu().rmsnorm_forward(outc, rc, xc, w, eps);

  Tensor xs[2], outs[2], rs[2];
  int k = 0;
  run_both([&] {
    xs[k] = m.make(dt, {N, C}, mis), outs[k] = m.make(dt, {N, C}, mis);
    rs[k] = m.make(stat_dtype(dt), {N});
    copy(xs[k], x);
    if (residual)
      cuda::residual_rmsnorm_forward(ctx.get(), xs[k], y, outs[k], rs[k], w, eps);
    else
      cuda::rmsnorm_forward(ctx.get(), outs[k], rs[k], xs[k], w, eps);
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(dt);
  close(what + " out", outs[0], outc, rt, rt);
  close(what + " rstd", rs[0], rc, rtol_of(stat_dtype(dt)), 0);
  if (residual) close(what + " x += y", xs[0], xc, 0, 0);
  if (!same_bits(outs[0], outs[1]) || !same_bits(rs[0], rs[1]) || !same_bits(xs[0], xs[1]))
    fail(what + ": the two warp orders differ");
}

void backward(DType dt, int64_t N, int64_t C, int mis) {
  const std::string what = name("rmsnorm_backward", dt, N, C, mis);
  std::mt19937 rng(unsigned(N * 7 + C));
  Mem m;
  Ctx ctx;
  const DType gdt = stat_dtype(dt);  // dw and rstd
  Tensor x = m.make(dt, {N, C}, mis), g = m.make(dt, {N, C}, mis), w = m.make(dt, {C});
  Tensor r = m.make(gdt, {N}), dx0 = m.make(dt, {N, C}), dw0 = m.make(gdt, {C});
  fill(x, rng), fill(g, rng), fill(w, rng, 0.5, 1.5), fill(r, rng, 0.5, 2), fill(dx0, rng),
      fill(dw0, rng);
  Tensor dxc = m.make(dt, {N, C}), dwc = m.make(gdt, {C});
  copy(dxc, dx0), copy(dwc, dw0);
  cpu().rmsnorm_backward(dxc, dwc, g, x, w, r);

  Tensor dxs[2], dws[2];
  int k = 0;
  run_both([&] {
    dxs[k] = m.make(dt, {N, C}, mis), dws[k] = m.make(gdt, {C});
    copy(dxs[k], dx0), copy(dws[k], dw0);
    cuda::rmsnorm_backward(ctx.get(), dxs[k], dws[k], g, x, w, r);
    ++k;
  });
  m.guards_ok(what);
  const double rt = rtol_of(dt);
  close(what + " dx", dxs[0], dxc, rt, rt);
  // dw sums N products in another grouping (bf16: in fp32, row blocks).
  close(what + " dw", dws[0], dwc, dt == DType::F64 ? 1e-12 : 1e-5, dt == DType::F64 ? 1e-12 : 1e-5);
  if (!same_bits(dxs[0], dxs[1]) || !same_bits(dws[0], dws[1]))
    fail(what + ": the two warp orders differ");
}

}  // namespace

int main() {
  struct Shape {
    int64_t N, C;
    int mis;
  };
  for (DType dt : {DType::F32, DType::F64}) {
    // 300 rows: the two-pass weight gradient (row blocks of 128).
    for (Shape s : {Shape{5, 300, 0}, Shape{3, 37, 0}, Shape{2, 64, 0}, Shape{300, 37, 0}}) {
      forward(dt, s.N, s.C, 0, false);
      backward(dt, s.N, s.C, 0);
    }
  }
  // bf16: vectorised (C % 8 == 0, aligned), scalar (odd C, or misaligned),
  // a row longer than 256 threads x 8, and > 128 rows (two-pass dw).
  for (Shape s : {Shape{7, 64, 0}, Shape{4, 36, 0}, Shape{3, 64, 1}, Shape{2, 2056, 0},
                  Shape{300, 16, 0}, Shape{260, 24, 1}}) {
    forward(DType::BF16, s.N, s.C, s.mis, false);
    forward(DType::BF16, s.N, s.C, s.mis, true);
    backward(DType::BF16, s.N, s.C, s.mis);
  }
  return finish("rmsnorm");
}
