// The exact attention kernels (kernels/cuda/attention_kernels.cuh) in the CUDA
// emulation against the CPU backend: forward (out, and `saved`, the row
// log-sum-exp, against a long double reference: the CPU saves probabilities
// instead) and backward (dq, dk, dv, from the emulated forward's `saved`), in
// f32, f64 and bf16 (the flash path's fallback: the fp32 kernels on fp32
// copies). Causal, grouped-query (H/KV = 1, 2, 4), T not a multiple of a warp
// or of the dK/dV kernel's 64-row chunk, and above each (above a block of 256
// in the `long` run), head_dim 8..160 (256 / head_dim groups of threads in the
// P.V and dS.K sums: 32 down to 1), misaligned views, the preconditions.
// Document masking (AttentionShape::doc_start) against the CPU backend's:
// one document, boundaries inside and on the edge of a warp's keys, one-token
// documents, many short ones, two sequences with different layouts. See
// sim_check.hpp.
//
// Not reached: the dynamic shared-memory opt-in past 48 KB (T above ~2800 in
// f64, ~5900 in f32, for the dq kernel) and the conversion kernels'
// grid-stride loop (past 65536 x 256 elements): too large to emulate.
#include "tests/kernel_sim/sim_check.hpp"
#include "tests/unit/doc_starts.hpp"
#include "tests/tools/cuda_sim/sim_attention.hpp"

#include "kernels/cuda/attention_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

struct Case {
  int64_t B, T, H, KV, hd;
  int mis;  // elements off 16-byte alignment, every tensor
};

DType stat_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

std::string name(DType dt, const Case& c) {
  return dtname(dt) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" +
         std::to_string(c.H) + " KV=" + std::to_string(c.KV) + " hd=" + std::to_string(c.hd) +
         (c.mis ? " misaligned" : "");
}

// Each sequence's document starts (the first is 0), one list per sequence:
// the (B*T) doc_start of AttentionShape (each token's document start).
using Docs = std::vector<std::vector<int32_t>>;
std::vector<int32_t> doc_start_of(const Docs& docs, int64_t T) { return test::doc_starts_of(docs, T); }

std::string docs_str(const Docs& docs) {
  if (docs.empty()) return "";
  std::string r = " docs";
  for (const auto& starts : docs) {
    r += " {";
    for (size_t i = 0; i < starts.size(); ++i) r += (i ? "," : "") + std::to_string(starts[i]);
    r += "}";
  }
  return r;
}

// lse[(b*H + h)*T + i] = log sum_{j0<=j<=i} exp(scale q_i.k_j), long double;
// j0 = the row's document start (0 without doc_start).
void reference_lse(const Tensor& lse, const Tensor& q, const Tensor& k, const AttentionShape& s) {
  const int64_t T = s.T, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, group = H / KV;
  const long double scale = 1.0L / std::sqrt((long double)hd);
  std::vector<long double> sc(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = s.doc_start ? s.doc_start[b * T + i] : 0;
        long double mx = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          long double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += (long double)at(q, ((b * T + i) * H + h) * hd + d) *
                   at(k, ((b * T + j) * KV + h / group) * hd + d);
          sc[size_t(j)] = scale * dot;
          mx = std::max(mx, sc[size_t(j)]);
        }
        long double sum = 0;
        for (int64_t j = j0; j <= i; ++j) sum += std::exp(sc[size_t(j)] - mx);
        const double l = double(mx + std::log(sum));
        const int64_t r = (b * H + h) * T + i;
        if (lse.dtype == DType::F64)
          lse.ptr<double>()[r] = l;
        else
          lse.ptr<float>()[r] = float(l);
      }
}

// docs: document masking with these layouts (one per sequence); none: causal.
void run_case(DType dt, const Case& c, const Docs& docs = {}) {
  const std::string what = name(dt, c) + docs_str(docs);
  // The emulated device reads doc_start as plain host memory, as the CPU does.
  const std::vector<int32_t> ds = doc_start_of(docs, c.T);
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd};
  if (!docs.empty()) {
    if (int64_t(docs.size()) != c.B) fail(what + ": one layout per sequence");
    s.doc_start = ds.data();
  }
  const DType sdt = stat_dtype(dt);
  std::mt19937 rng(unsigned(c.T * 1009 + c.H * 101 + c.KV * 11 + c.hd));
  Mem m;
  Ctx ctx;
  Tensor q = m.make(dt, {c.B, c.T, c.H, c.hd}, c.mis), k = m.make(dt, {c.B, c.T, c.KV, c.hd}, c.mis),
         v = m.make(dt, {c.B, c.T, c.KV, c.hd}, c.mis),
         dout = m.make(dt, {c.B, c.T, c.H, c.hd}, c.mis);
  // Scores of a few units: softmax rows neither flat nor one-hot.
  fill(q, rng, -2, 2), fill(k, rng, -2, 2), fill(v, rng), fill(dout, rng);

  // The CPU backend: out, the probabilities P (B,H,T,T), dq, dk, dv.
  Tensor outc = m.make(dt, {c.B, c.T, c.H, c.hd}), Pc = m.make(sdt, {c.B, c.H, c.T, c.T});
  Tensor dqc = m.make(dt, {c.B, c.T, c.H, c.hd}), dkc = m.make(dt, {c.B, c.T, c.KV, c.hd}),
         dvc = m.make(dt, {c.B, c.T, c.KV, c.hd});
  cpu().attention_forward(outc, Pc, q, k, v, s);
  cpu().attention_backward(dqc, dkc, dvc, dout, q, k, v, outc, Pc, s);
  Tensor lsec = m.make(sdt, {c.B, c.H, c.T});
  reference_lse(lsec, q, k, s);

  // The emulated kernels in both warp orders; outputs start as NaN (Mem), so
  // an element left unwritten fails.
  Tensor outs[2], lses[2], dqs[2], dks[2], dvs[2];
  int r = 0;
  run_both([&] {
    outs[r] = m.make(dt, {c.B, c.T, c.H, c.hd}, c.mis), lses[r] = m.make(sdt, {c.B, c.H, c.T});
    cuda::attention_forward_exact(ctx.get(), outs[r], lses[r], q, k, v, s);
    ++r;
  });
  r = 0;
  run_both([&] {
    dqs[r] = m.make(dt, {c.B, c.T, c.H, c.hd}, c.mis);
    dks[r] = m.make(dt, {c.B, c.T, c.KV, c.hd}, c.mis);
    dvs[r] = m.make(dt, {c.B, c.T, c.KV, c.hd}, c.mis);
    cuda::attention_backward_exact(ctx.get(), dqs[r], dks[r], dvs[r], dout, q, k, v, outs[0],
                                   lses[0], s);
    ++r;
  });
  m.guards_ok(what);

  // f32/f64: the kernels sum in another order than the CPU's GEMMs; atol as
  // rtol for the dq/dk/dv elements that cancel to near zero. bf16: both round
  // the same fp32 math once, so a neighbouring bf16 value at most; atol the
  // fp32 sum order's. Measured: f32 at most 2e-6 off, f64 4e-16, bf16 one ulp.
  const double rt = rtol_of(dt), at_ = dt == DType::BF16 ? rtol_of(DType::F32) : rt;
  close("attention_forward " + what + " out", outs[0], outc, rt, at_);
  close("attention_forward " + what + " saved (lse)", lses[0], lsec, rtol_of(sdt), rtol_of(sdt));
  close("attention_backward " + what + " dq", dqs[0], dqc, rt, at_);
  close("attention_backward " + what + " dk", dks[0], dkc, rt, at_);
  close("attention_backward " + what + " dv", dvs[0], dvc, rt, at_);
  if (!same_bits(outs[0], outs[1]) || !same_bits(lses[0], lses[1]))
    fail("attention_forward " + what + ": the two warp orders differ");
  if (!same_bits(dqs[0], dqs[1]) || !same_bits(dks[0], dks[1]) || !same_bits(dvs[0], dvs[1]))
    fail("attention_backward " + what + ": the two warp orders differ");
}

// The ops' preconditions: a refused shape throws before any launch.
void refusals() {
  Mem m;
  Ctx ctx;
  Tensor q = m.make(DType::F32, {1, 4, 3, 257}), kv = m.make(DType::F32, {1, 4, 2, 257});
  Tensor out = m.make(DType::F32, {1, 4, 3, 257}), lse = m.make(DType::F32, {1, 3, 4});
  expect_throw("attention_forward H=3 KV=2", [&] {
    cuda::attention_forward_exact(ctx.get(), out, lse, q, kv, kv, AttentionShape{1, 4, 3, 2, 257});
  });
  Tensor q1 = m.make(DType::F32, {1, 4, 1, 257}), k1 = m.make(DType::F32, {1, 4, 1, 257});
  Tensor o1 = m.make(DType::F32, {1, 4, 1, 257}), l1 = m.make(DType::F32, {1, 1, 4});
  expect_throw("attention_forward head_dim=257", [&] {
    cuda::attention_forward_exact(ctx.get(), o1, l1, q1, k1, k1, AttentionShape{1, 4, 1, 1, 257});
  });
  Tensor t2 = m.make(DType::F32, {1, 4, 1, 64}), l64 = m.make(DType::F64, {1, 1, 4});
  expect_throw("attention_backward saved f64 with f32 q", [&] {
    cuda::attention_backward_exact(ctx.get(), t2, t2, t2, t2, t2, t2, t2, t2, l64,
                                   AttentionShape{1, 4, 1, 1, 64});
  });
}

}  // namespace

// The default run (ctest kernel_sim_attention, and every mutant): the
// emulation's cost grows with B H T^2 (~0.8 us per fiber switch, 32 per warp
// dot product), so T stays small. `long` (ctest kernel_sim_attention_long):
// T = 257, past a block of 256 threads, where the softmax and D loops take a
// second stride.
int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "long") {
    run_case(DType::F32, {1, 257, 1, 1, 8, 0});
    return finish("attention (long)");
  }
  // group = H/KV 1, 2, 4 (KV 1 and 2: KV 1 alone hides a wrong head mapping);
  // T below and above a warp's 8 keys per step, a warp's 32 rows of the D
  // sum, the dK/dV kernel's chunk (64); head_dim 8 (32 groups of threads in the P.V
  // and dS.K sums), 40 (6, 16 threads idle), 64, 96 (2, 64 idle), 128 (2),
  // 160 (1, 96 idle).
  const Case f32_cases[] = {
      {1, 66, 2, 1, 40, 0}, {1, 19, 4, 1, 128, 1}, {1, 15, 4, 2, 32, 0},
      {2, 13, 1, 1, 8, 0},  {1, 9, 2, 1, 160, 0},  {1, 21, 2, 2, 96, 3},
  };
  for (const Case& c : f32_cases) run_case(DType::F32, c);
  const Case f64_cases[] = {
      {1, 34, 4, 2, 48, 0}, {1, 19, 4, 1, 128, 1}, {2, 13, 1, 1, 8, 0},
      {1, 9, 2, 1, 160, 0}, {1, 21, 2, 2, 96, 3},
  };
  for (const Case& c : f64_cases) run_case(DType::F64, c);
  // bf16 (the fallback through fp32 copies): head_dim 64 and 128 (the shapes
  // the flash kernels take unless forced exact or misaligned) and others.
  const Case bf16_cases[] = {
      {1, 35, 2, 1, 64, 0}, {1, 17, 8, 2, 128, 1}, {2, 11, 2, 2, 24, 0}, {1, 17, 4, 4, 72, 5},
  };
  for (const Case& c : bf16_cases) run_case(DType::BF16, c);
  // Document masking: a single document (the causal answer), boundaries
  // inside a warp's 8 keys and on their edge, one-token documents (13; the
  // last row), many short documents, two sequences laid out differently;
  // group 1, 2, 4; fewer and shorter cases than above (the emulation's cost
  // grows with T^2).
  run_case(DType::F32, {1, 40, 2, 1, 40, 0}, {{0, 13, 14, 33}});
  run_case(DType::F32, {1, 19, 4, 1, 128, 1}, {{0}});
  run_case(DType::F32, {2, 21, 4, 2, 32, 0}, {{0, 7, 8, 15}, {0, 1, 2, 3, 10, 20}});
  run_case(DType::F64, {2, 13, 1, 1, 8, 0}, {{0, 2, 4, 6, 8, 10, 12}, {0, 5}});
  run_case(DType::BF16, {1, 25, 2, 1, 64, 0}, {{0, 8, 24}});
  run_case(DType::BF16, {2, 17, 4, 4, 72, 5}, {{0, 16}, {0, 3, 9}});
  refusals();
  return finish("attention");
}
