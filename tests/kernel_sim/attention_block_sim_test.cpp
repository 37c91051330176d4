// The blockwise attention ops of the CUDA backend (kernels/cuda/
// attention_block_kernels.cuh: attention_block_forward, attention_merge,
// attention_block_backward, on the exact kernels of attention_kernels.cuh) in
// the CUDA emulation against the CPU backend's ops on the same inputs, in
// f32, f64 and bf16 (the fp32 kernels on fp32 copies):
//  - forward: out and lse of full blocks with Tq != Tk (fewer and more keys
//    than queries, across the dK/dV kernel's 64-row chunk and a warp's 8
//    keys per step) and causal diagonal blocks; GQA groups 1, 2, 4; B = 2
//    (a wrong key stride per sequence shows when Tq != Tk); misaligned views;
//  - backward: from a FINAL out and lse that are not the block's own (random
//    out, lse raised above the block's, as after merging other blocks), so D
//    must be rowsum(dout * out) and P must use the given lse; dq overwritten
//    and accumulated onto a nonzero dq;
//  - merge: random partials with -inf in the running lse (its out NaN: never
//    read), in the block's, and in both, and rows that differ by more than
//    the range of exp (one weight underflows to 0);
//  - packed documents (AttentionBlock::q_doc_start, k_pos): a full block of
//    an earlier key chunk whose query rows see all, some or none of its keys
//    (out 0, lse -inf), and a causal diagonal block with documents starting
//    inside it, against the CPU's masked ops;
//  - each op in both warp orders, bitwise equal; outputs start as NaN, so an
//    element left unwritten fails; the preconditions refuse before launching.
// See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"
#include "tests/tools/cuda_sim/sim_attention.hpp"
// (the emulation first: the kernel header builds on it)
#include "kernels/cuda/attention_block_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

struct Case {
  int64_t B, Tq, Tk, H, KV, hd;
  BlockMask mask;
  int mis;  // elements off 16-byte alignment, every tensor
};

DType stat_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

std::string name(DType dt, const Case& c) {
  return dtname(dt) + " B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) +
         " Tk=" + std::to_string(c.Tk) + " H=" + std::to_string(c.H) +
         " KV=" + std::to_string(c.KV) + " hd=" + std::to_string(c.hd) +
         (c.mask == BlockMask::causal ? " causal" : " full") + (c.mis ? " misaligned" : "");
}

void set(const Tensor& t, int64_t i, double v) {
  if (t.dtype == DType::F64)
    t.ptr<double>()[i] = v;
  else if (t.dtype == DType::F32)
    t.ptr<float>()[i] = float(v);
  else
    t.ptr<bf16_bits>()[i] = float_to_bf16(float(v));
}

// close(), except that -inf must meet -inf (and is not compared further).
bool close_lse(const std::string& what, const Tensor& got, const Tensor& want, double rtol) {
  for (int64_t i = 0; i < want.numel(); ++i) {
    const bool wi = std::isinf(at(want, i)), gi = std::isinf(at(got, i));
    if (wi != gi || (wi && at(got, i) != at(want, i))) {
      ++checks;
      fail(what + ": element " + std::to_string(i) + ": got " + std::to_string(at(got, i)) +
           ", want " + std::to_string(at(want, i)));
      return false;
    }
  }
  Mem m;
  Tensor g = m.make(got.dtype, {got.numel()}), w = m.make(want.dtype, {want.numel()});
  for (int64_t i = 0; i < want.numel(); ++i) {
    const bool inf = std::isinf(at(want, i));
    set(g, i, inf ? 0 : at(got, i));
    set(w, i, inf ? 0 : at(want, i));
  }
  return close(what, g, w, rtol, rtol);
}

// f32/f64: the kernels sum in another order than the CPU's GEMMs; atol as
// rtol for elements that cancel to near zero. bf16: both round the same fp32
// math once (a neighbouring bf16 value at most); atol the fp32 sum order's.
double rt(DType dt) { return rtol_of(dt); }
double at_(DType dt) { return dt == DType::BF16 ? rtol_of(DType::F32) : rtol_of(dt); }

// docs: packed documents. The keys sit at positions 40.. of the sequence,
// the query rows right after them (full) or on them (causal); documents
// begin at 0 and at a few positions that differ per sequence: before the
// keys, inside them, between them and the rows' own (rows seeing none).
void forward_and_backward(DType dt, const Case& c, bool acc, bool docs = false) {
  const std::string what = name(dt, c) + (acc ? " dq+=" : "") + (docs ? " documents" : "");
  AttentionBlock b{c.B, c.Tq, c.Tk, c.H, c.KV, c.hd, c.mask};
  const DType sdt = stat_dtype(dt);
  std::mt19937 rng(unsigned(c.Tq * 1009 + c.Tk * 313 + c.H * 101 + c.KV * 11 + c.hd + docs));
  Mem m;
  Ctx ctx;
  if (docs) {
    const int64_t k_pos = 40, q_pos = c.mask == BlockMask::causal ? k_pos : k_pos + c.Tk + 3;
    Tensor starts = m.make(DType::I32, {c.B, c.Tq});
    for (int64_t bi = 0; bi < c.B; ++bi) {
      const int64_t cuts[] = {0, 17 + bi, k_pos + c.Tk / 3 + bi, k_pos + (2 * c.Tk) / 3,
                              q_pos + c.Tq / 2 - bi};
      for (int64_t i = 0; i < c.Tq; ++i) {
        int64_t s = 0;
        for (int64_t x : cuts)
          if (x <= q_pos + i) s = std::max(s, x);
        starts.ptr<int32_t>()[bi * c.Tq + i] = int32_t(s);
      }
    }
    b.q_doc_start = starts.ptr<int32_t>();
    b.k_pos = k_pos;
  }
  auto qs = [&](int mis) { return m.make(dt, {c.B, c.Tq, c.H, c.hd}, mis); };
  auto ks = [&](int mis) { return m.make(dt, {c.B, c.Tk, c.KV, c.hd}, mis); };
  auto ls = [&] { return m.make(sdt, {c.B, c.H, c.Tq}); };
  Tensor q = qs(c.mis), k = ks(c.mis), v = ks(c.mis), dout = qs(c.mis);
  // Scores of a few units: softmax rows neither flat nor one-hot.
  fill(q, rng, -2, 2), fill(k, rng, -2, 2), fill(v, rng), fill(dout, rng);

  Tensor outc = qs(0), lsec = ls();
  cpu().attention_block_forward(outc, lsec, q, k, v, b);
  Tensor outs[2], lses[2];
  int r = 0;
  run_both([&] {
    outs[r] = qs(c.mis), lses[r] = ls();
    cuda::attention_block_forward_exact(ctx.get(), outs[r], lses[r], q, k, v, b);
    ++r;
  });
  close("attention_block_forward " + what + " out", outs[0], outc, rt(dt), at_(dt));
  close_lse("attention_block_forward " + what + " lse", lses[0], lsec, rtol_of(sdt));
  if (docs) {  // the case has rows that see no key, and rows that see some
    int64_t none = 0;
    for (int64_t i = 0; i < lsec.numel(); ++i) none += std::isinf(at(lsec, i));
    if (c.mask == BlockMask::full && (none == 0 || none == lsec.numel()))
      fail("attention_block_forward " + what + ": " + std::to_string(none) + " of " +
           std::to_string(lsec.numel()) + " rows see no key (the case should have some)");
  }
  if (!same_bits(outs[0], outs[1]) || !same_bits(lses[0], lses[1]))
    fail("attention_block_forward " + what + ": the two warp orders differ");

  // The final out and lse of a whole attention this block is part of: the
  // block's lse raised by up to 1 (other blocks' mass), out from elsewhere.
  Tensor fout = qs(c.mis), flse = ls(), dq0 = qs(c.mis);
  fill(fout, rng), fill(dq0, rng);
  std::uniform_real_distribution<double> up(0, 1);
  // (A row that saw no key of this block saw its own elsewhere: finite.)
  for (int64_t i = 0; i < flse.numel(); ++i)
    set(flse, i, std::isinf(at(lsec, i)) ? up(rng) : at(lsec, i) + up(rng));
  Tensor dqc = qs(0), dkc = ks(0), dvc = ks(0);
  if (acc) copy(dqc, dq0);
  cpu().attention_block_backward(dqc, dkc, dvc, dout, q, k, v, fout, flse, b, acc);
  Tensor dqs[2], dks[2], dvs[2];
  r = 0;
  run_both([&] {
    dqs[r] = qs(c.mis), dks[r] = ks(c.mis), dvs[r] = ks(c.mis);
    if (acc) copy(dqs[r], dq0);
    cuda::attention_block_backward_exact(ctx.get(), dqs[r], dks[r], dvs[r], dout, q, k, v, fout,
                                         flse, b, acc);
    ++r;
  });
  m.guards_ok(what);
  close("attention_block_backward " + what + " dq", dqs[0], dqc, rt(dt), at_(dt));
  close("attention_block_backward " + what + " dk", dks[0], dkc, rt(dt), at_(dt));
  close("attention_block_backward " + what + " dv", dvs[0], dvc, rt(dt), at_(dt));
  if (!same_bits(dqs[0], dqs[1]) || !same_bits(dks[0], dks[1]) || !same_bits(dvs[0], dvs[1]))
    fail("attention_block_backward " + what + ": the two warp orders differ");
}

// attention_merge of random partials: per row, kind = i % 5: both finite
// (close), running -inf (its out NaN), block -inf, both -inf, both finite
// 800 apart (exp of the difference underflows to 0 in f32 and f64 alike).
void merge_case(DType dt, int64_t B, int64_t H, int64_t Tq, int64_t hd, int mis) {
  const std::string what = "attention_merge " + dtname(dt) + " B=" + std::to_string(B) +
                           " H=" + std::to_string(H) + " Tq=" + std::to_string(Tq) +
                           " hd=" + std::to_string(hd) + (mis ? " misaligned" : "");
  const DType sdt = stat_dtype(dt);
  std::mt19937 rng(unsigned(B * 7 + H * 31 + Tq * 101 + hd));
  Mem m;
  Ctx ctx;
  auto os = [&](int mi) { return m.make(dt, {B, Tq, H, hd}, mi); };
  auto ls = [&] { return m.make(sdt, {B, H, Tq}); };
  Tensor out0 = os(mis), lse0 = ls(), outb = os(mis), lseb = ls();
  fill(out0, rng), fill(lse0, rng, -3, 3), fill(outb, rng), fill(lseb, rng, -3, 3);
  const double ninf = -INFINITY;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t row = (bi * H + h) * Tq + i, o = ((bi * Tq + i) * H + h) * hd;
        const int kind = int(i % 5);
        if (kind == 1 || kind == 3) {
          set(lse0, row, ninf);
          for (int64_t d = 0; d < hd; ++d) set(out0, o + d, NAN);  // never read
        }
        if (kind == 2 || kind == 3) set(lseb, row, ninf);
        if (kind == 4) set(lseb, row, at(lse0, row) + ((bi + h) % 2 ? 800 : -800));
      }
  Tensor outc = os(0), lsec = ls();
  copy(outc, out0), copy(lsec, lse0);
  cpu().attention_merge(outc, lsec, outb, lseb);
  Tensor outs[2], lses[2];
  int r = 0;
  run_both([&] {
    outs[r] = os(mis), lses[r] = ls();
    copy(outs[r], out0), copy(lses[r], lse0);
    cuda::attention_merge_exact(ctx.get(), outs[r], lses[r], outb, lseb);
    ++r;
  });
  m.guards_ok(what);
  // Rows of both -inf keep NaN out in both: compare out where the CPU's is a number.
  Tensor go = os(0), wo = os(0);
  for (int64_t i = 0; i < outc.numel(); ++i) {
    const bool nan = std::isnan(at(outc, i));
    set(go, i, nan ? (std::isnan(at(outs[0], i)) ? 0 : 1) : at(outs[0], i));
    set(wo, i, nan ? 0 : at(outc, i));
  }
  close(what + " out", go, wo, rt(dt), at_(dt));
  close_lse(what + " lse", lses[0], lsec, rtol_of(sdt));
  if (!same_bits(outs[0], outs[1]) || !same_bits(lses[0], lses[1]))
    fail(what + ": the two warp orders differ");
}

// The ops' preconditions: a refused shape throws before any launch.
void refusals() {
  Mem m;
  Ctx ctx;
  const DType f = DType::F32;
  Tensor q = m.make(f, {1, 4, 1, 257}), k = m.make(f, {1, 4, 1, 257});
  Tensor o = m.make(f, {1, 4, 1, 257}), l = m.make(f, {1, 1, 4});
  expect_throw("attention_block_forward head_dim=257", [&] {
    cuda::attention_block_forward_exact(ctx.get(), o, l, q, k, k, {1, 4, 4, 1, 1, 257});
  });
  Tensor q2 = m.make(f, {1, 4, 2, 8}), k2 = m.make(f, {1, 5, 1, 8});
  Tensor o2 = m.make(f, {1, 4, 2, 8}), l2 = m.make(f, {1, 2, 4});
  expect_throw("attention_block_forward causal Tq=4 Tk=5", [&] {
    cuda::attention_block_forward_exact(ctx.get(), o2, l2, q2, k2, k2,
                                        {1, 4, 5, 2, 1, 8, BlockMask::causal});
  });
  Tensor l64 = m.make(DType::F64, {1, 2, 4});
  expect_throw("attention_merge lse f64 with f32 out",
               [&] { cuda::attention_merge_exact(ctx.get(), o2, l64, o2, l2); });
  Tensor dk2 = m.make(f, {1, 4, 1, 8});
  expect_throw("attention_block_backward dk of the wrong size", [&] {
    cuda::attention_block_backward_exact(ctx.get(), o2, dk2, k2, o2, q2, k2, k2, o2, l2,
                                         {1, 4, 5, 2, 1, 8}, false);
  });
}

}  // namespace

int main() {
  // Full blocks with fewer and more keys than queries (Tq 67 past the dK/dV
  // kernel's 64-row chunk; Tk 70 past a warp's 8-key steps; Tk 300 past a
  // block of 256 threads in the softmax loops), causal diagonal
  // blocks (Tq 66 past the chunk); group 1, 2, 4; head_dim 8 (32 groups of
  // threads in the P.V and dS.K sums) to 160 (1 group).
  const Case f32_cases[] = {
      {1, 13, 21, 2, 1, 40, BlockMask::full, 0},    {2, 19, 7, 4, 2, 32, BlockMask::full, 1},
      {1, 67, 5, 2, 2, 8, BlockMask::full, 0},      {1, 9, 70, 1, 1, 96, BlockMask::full, 3},
      {1, 17, 17, 4, 1, 64, BlockMask::causal, 0},  {2, 66, 66, 1, 1, 8, BlockMask::causal, 0},
      {1, 11, 11, 2, 1, 160, BlockMask::causal, 1}, {1, 3, 300, 2, 1, 8, BlockMask::full, 0},
  };
  for (const Case& c : f32_cases) forward_and_backward(DType::F32, c, c.Tq % 2 == 1);
  const Case f64_cases[] = {
      {2, 13, 21, 4, 1, 24, BlockMask::full, 0},
      {1, 23, 9, 4, 2, 48, BlockMask::full, 1},
      {1, 19, 19, 2, 1, 128, BlockMask::causal, 0},
  };
  for (const Case& c : f64_cases) {
    forward_and_backward(DType::F64, c, false);
    forward_and_backward(DType::F64, c, true);
  }
  // bf16 (fp32 kernels on fp32 copies; dq accumulated in fp32 from the bf16 dq).
  const Case bf16_cases[] = {
      {2, 11, 17, 2, 1, 64, BlockMask::full, 0},
      {1, 17, 17, 8, 2, 128, BlockMask::causal, 1},
      {1, 21, 6, 4, 4, 72, BlockMask::full, 5},
  };
  for (const Case& c : bf16_cases) {
    forward_and_backward(DType::BF16, c, false);
    forward_and_backward(DType::BF16, c, true);
  }
  // Packed documents: full blocks (rows seeing all, some or none of the keys;
  // Tq past the dK/dV kernel's chunk) and causal diagonal blocks.
  const Case doc_cases[] = {
      {2, 13, 21, 2, 1, 40, BlockMask::full, 0},   {1, 67, 30, 2, 2, 8, BlockMask::full, 1},
      {2, 17, 17, 4, 2, 64, BlockMask::causal, 0}, {1, 66, 66, 1, 1, 8, BlockMask::causal, 0},
  };
  for (const Case& c : doc_cases) {
    forward_and_backward(DType::F32, c, false, true);
    forward_and_backward(DType::F64, c, true, true);
    forward_and_backward(DType::BF16, c, false, true);
  }
  merge_case(DType::F32, 2, 3, 10, 40, 0);
  merge_case(DType::F32, 1, 2, 7, 130, 1);  // hd past 4 lanes' strides
  merge_case(DType::F64, 2, 2, 10, 24, 0);
  merge_case(DType::BF16, 1, 4, 10, 64, 3);
  refusals();
  return finish("attention_block");
}
