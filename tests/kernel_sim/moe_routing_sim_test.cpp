// Mixture-of-experts routing kernels (kernels/cuda/moe_routing_kernels.cuh)
// in the CUDA emulation against the CPU backend (kernels/cpu/moe_routing.cpp):
//  - moe_route in f32, f64 and bf16 logits, with and without the selection
//    bias, rows with exact ties (equal logits: the lower id must win, in
//    order), k = 1 .. E; the choices must equal the CPU's exactly;
//  - moe_dispatch_plan dropless and with capacity (one group and several
//    segments; runs of a larger group with prior counts), identity and
//    shuffled slots, more assignments than a block
//    (the scan's carry); pos, the send tokens and every count exactly, the
//    probability sums to rounding; a bad choice and a bad slot set the error
//    words (kind 2);
//  - moe_router_backward, with and without the aux term.
// Both warp orders must give the same bits. See sim_check.hpp.
#include "tests/kernel_sim/sim_check.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cuda/moe_routing_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

struct Case {
  int64_t N, E, k;
};

std::string name(const char* op, DType dt, const Case& s, const std::string& form) {
  return std::string(op) + " " + dtname(dt) + " N=" + std::to_string(s.N) + " E=" +
         std::to_string(s.E) + " k=" + std::to_string(s.k) + form;
}

DType rdt(DType act) { return act == DType::F64 ? DType::F64 : DType::F32; }

Backend::MoeRouting make_routing(Mem& m, DType act, const Case& s) {
  const DType R = rdt(act);
  return {m.make(R, {s.N, s.E}), m.make(DType::I32, {s.N, s.k}), m.make(R, {s.N, s.k}),
          m.make(R, {s.N}), m.make(act, {s.N, s.k})};
}

// Logits with exact ties: rows 1 mod 3 have every logit equal, rows 2 mod 3
// two equal maxima (experts 1 and E-1).
Tensor logits_with_ties(Mem& m, std::mt19937& rng, DType dt, const Case& s) {
  Tensor l = m.make(dt, {s.N, s.E});
  fill(l, rng, -3, 3);
  for (int64_t t = 0; t < s.N; ++t) {
    for (int64_t e = 0; e < s.E; ++e) {
      const bool all = t % 3 == 1, two = t % 3 == 2 && s.E > 2 && (e == 1 || e == s.E - 1);
      if (!all && !two) continue;
      const double v = all ? 0.5 : 4.0;
      switch (dt) {
        case DType::F32: l.ptr<float>()[t * s.E + e] = float(v); break;
        case DType::F64: l.ptr<double>()[t * s.E + e] = v; break;
        default: l.ptr<bf16_bits>()[t * s.E + e] = float_to_bf16(float(v));
      }
    }
  }
  return l;
}

void route(DType dt, const Case& s, bool biased) {
  const std::string what = name("moe_route", dt, s, biased ? " bias" : "");
  std::mt19937 rng(unsigned(s.N * 7 + s.E * 3 + s.k + biased));
  Mem m;
  Ctx ctx;
  Tensor logits = logits_with_ties(m, rng, dt, s);
  Tensor bias = biased ? m.make(DType::F64, {s.E}) : Tensor(nullptr, DType::F64, {0});
  if (biased) fill(bias, rng, -0.05, 0.05);
  const Backend::MoeRouting want = make_routing(m, dt, s);
  cpu().moe_route(want, logits, bias);
  Backend::MoeRouting got[2];
  int o = 0;
  run_both([&] {
    got[o] = make_routing(m, dt, s);
    cuda::moe_route(ctx.get(), got[o], logits, bias);
    ++o;
  });
  m.guards_ok(what);
  const double rt = rtol_of(rdt(dt));
  close(what + " probs", got[0].probs, want.probs, rt, 1e-7);
  if (!same_bits(got[0].choice, want.choice)) fail(what + ": choices differ from the CPU's");
  close(what + " weight", got[0].weight, want.weight, rt, 1e-7);
  close(what + " norm", got[0].norm, want.norm, rt, 1e-7);
  close(what + " w", got[0].w, want.w, rtol_of(dt), 1e-7);
  for (auto t : {&Backend::MoeRouting::probs, &Backend::MoeRouting::choice,
                 &Backend::MoeRouting::weight, &Backend::MoeRouting::norm, &Backend::MoeRouting::w})
    if (!same_bits(got[0].*t, got[1].*t)) fail(what + ": the two warp orders differ");
  // the all-equal rows choose 0, 1, ..., k-1 (ties to the lower id, in order)
  if (!biased && s.N > 1)
    for (int64_t j = 0; j < s.k; ++j)
      if (got[0].choice.ptr<int32_t>()[1 * s.k + j] != j)
        fail(what + ": an all-tied row did not choose experts 0..k-1 in order");
}

// choice (N,k): each row k distinct experts, skewed towards the low ids.
Tensor random_choice(Mem& m, std::mt19937& rng, const Case& s) {
  Tensor c = m.make(DType::I32, {s.N, s.k});
  std::vector<int32_t> ids(size_t(s.E));
  for (int64_t t = 0; t < s.N; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t j = 0; j < s.k; ++j) {
      std::uniform_int_distribution<int64_t> u(j, std::max<int64_t>(j, std::min(s.E - 1, j + s.E / 2)));
      std::swap(ids[size_t(j)], ids[size_t(u(rng))]);
      c.ptr<int32_t>()[t * s.k + j] = ids[size_t(j)];
    }
  }
  return c;
}

// group_rows > 0: each run of `segment` rows is part of a larger group with
// random prior counts (context parallelism's groups spanning chunks), some
// at or past the cap.
void plan(DType rt, const Case& s, double cf, int64_t segment, bool shuffled,
          int64_t group_rows = 0) {
  const std::string what =
      name("moe_dispatch_plan", rt, s,
           " cf=" + std::to_string(cf) + " segment=" + std::to_string(segment) +
               (shuffled ? " shuffled slots" : "") +
               (group_rows ? " group_rows=" + std::to_string(group_rows) + " with priors" : ""));
  std::mt19937 rng(unsigned(s.N * 5 + s.E + s.k * 11 + segment + shuffled + group_rows));
  Mem m;
  Ctx ctx;
  Tensor choice = random_choice(m, rng, s);
  Tensor probs = m.make(rt, {s.N, s.E});
  fill(probs, rng, 0, 1);
  Tensor slot = m.make(DType::I32, {s.E});
  std::iota(slot.ptr<int32_t>(), slot.ptr<int32_t>() + s.E, 0);
  if (shuffled) std::shuffle(slot.ptr<int32_t>(), slot.ptr<int32_t>() + s.E, rng);
  Tensor posc = m.make(DType::I32, {s.N, s.k}), tokc = m.make(DType::I32, {s.N * s.k}),
         stc = m.make(DType::F64, {3 * s.E + 2});
  std::fill(tokc.ptr<int32_t>(), tokc.ptr<int32_t>() + s.N * s.k, -7);
  Backend::MoeCapacity cap{.factor = cf, .segment = segment, .group_rows = group_rows};
  if (group_rows > 0) {
    const int64_t limit = int64_t(std::ceil(cf * double(group_rows * s.k) / double(s.E)));
    cap.prior = m.make(DType::I32, {s.N / segment, s.E});
    std::uniform_int_distribution<int32_t> u(0, int32_t(std::max<int64_t>(limit, 1) + 2));
    for (int64_t i = 0; i < cap.prior.numel(); ++i) cap.prior.ptr<int32_t>()[i] = u(rng);
  }
  cpu().moe_dispatch_plan(posc, tokc, stc, choice, probs, slot, cap);
  Tensor pos[2], tok[2], st[2];
  int o = 0;
  run_both([&] {
    pos[o] = m.make(DType::I32, {s.N, s.k});
    tok[o] = m.make(DType::I32, {s.N * s.k});
    st[o] = m.make(DType::F64, {3 * s.E + 2});
    std::fill(tok[o].ptr<int32_t>(), tok[o].ptr<int32_t>() + s.N * s.k, -7);
    cuda::moe_dispatch_plan(ctx.get(), pos[o], tok[o], st[o], choice, probs, slot, cap);
    ++o;
  });
  m.guards_ok(what);
  if (ctx.err()[0] != 0) fail(what + ": error words set on good input");
  if (!same_bits(pos[0], posc)) fail(what + ": pos differs from the CPU's");
  if (!same_bits(tok[0], tokc)) fail(what + ": send tokens differ from the CPU's");
  const double* g = st[0].ptr<double>();
  const double* w = stc.ptr<double>();
  for (int64_t i = 0; i < 3 * s.E + 2; ++i) {
    const bool sum = i >= s.E && i < 2 * s.E;  // probability sums: another order
    if (sum ? std::fabs(g[i] - w[i]) > 1e-12 * std::max(1.0, std::fabs(w[i])) : g[i] != w[i]) {
      fail(what + ": stats[" + std::to_string(i) + "] = " + std::to_string(g[i]) + ", CPU " +
           std::to_string(w[i]));
      break;
    }
  }
  if (!same_bits(pos[0], pos[1]) || !same_bits(tok[0], tok[1]) || !same_bits(st[0], st[1]))
    fail(what + ": the two warp orders differ");
  // Something was dropped where a capacity was asked for and binds.
  if (cf > 0 && cf < 1 && s.N * s.k >= 4 * s.E && w[2 * s.E + 1] == 0) fail(what + ": the case drops nothing");
}

void bad_plan() {
  const Case s{6, 4, 2};
  Mem m;
  Ctx ctx;
  std::mt19937 rng(3);
  Tensor choice = random_choice(m, rng, s), probs = m.make(DType::F32, {s.N, s.E});
  fill(probs, rng, 0, 1);
  Tensor slot = m.make(DType::I32, {s.E}), pos = m.make(DType::I32, {s.N, s.k}),
         tok = m.make(DType::I32, {s.N * s.k}), st = m.make(DType::F64, {3 * s.E + 2});
  std::iota(slot.ptr<int32_t>(), slot.ptr<int32_t>() + s.E, 0);
  choice.ptr<int32_t>()[5] = 4;  // expert 4 of 4
  cuda::moe_dispatch_plan(ctx.get(), pos, tok, st, choice, probs, slot, {});
  int64_t* e = ctx.err();
  if (e[0] != 2 || e[1] != 5 || e[2] != 4 || e[3] != 4)
    fail("moe_dispatch_plan choice 4 of 4 experts: error words [" + std::to_string(e[0]) + ", " +
         std::to_string(e[1]) + ", " + std::to_string(e[2]) + ", " + std::to_string(e[3]) + "]");
  std::fill(e, e + 4, int64_t(0));
  choice.ptr<int32_t>()[5] = 3;
  slot.ptr<int32_t>()[2] = 1;  // slot 1 twice
  cuda::moe_dispatch_plan(ctx.get(), pos, tok, st, choice, probs, slot, {});
  if (e[0] != 2 || (e[1] >> 32) != 1 || e[2] != 1)
    fail("moe_dispatch_plan slot 1 twice: error words not set");
  std::fill(e, e + 4, int64_t(0));
  expect_throw("moe_dispatch_plan stats of the wrong size", [&] {
    cuda::moe_dispatch_plan(ctx.get(), pos, tok, m.make(DType::F64, {3 * s.E}), choice, probs,
                            slot, {});
  });
  m.guards_ok("moe_dispatch_plan refusals");
}

void router_backward(DType dt, const Case& s, double a) {
  const std::string what = name("moe_router_backward", dt, s, " a=" + std::to_string(a));
  std::mt19937 rng(unsigned(s.N * 3 + s.E * 13 + s.k));
  Mem m;
  Ctx ctx;
  Tensor logits = logits_with_ties(m, rng, dt, s);
  const Backend::MoeRouting r = make_routing(m, dt, s);
  cpu().moe_route(r, logits, Tensor(nullptr, DType::F64, {0}));
  const DType st = dt == DType::BF16 ? DType::F32 : dt;
  Tensor dw = m.make(st, {s.N, s.k}), aux = m.make(DType::F64, {s.E});
  fill(dw, rng), fill(aux, rng, 0, 2);
  Tensor want = m.make(dt, {s.N, s.E});
  cpu().moe_router_backward(want, r, dw, aux, a);
  Tensor got[2];
  int o = 0;
  run_both([&] {
    got[o] = m.make(dt, {s.N, s.E});
    cuda::moe_router_backward(ctx.get(), got[o], r, dw, aux, a);
    ++o;
  });
  m.guards_ok(what);
  close(what + " dlogits", got[0], want, dt == DType::F64 ? 1e-12 : rtol_of(dt), 1e-9);
  if (!same_bits(got[0], got[1])) fail(what + ": the two warp orders differ");
}

}  // namespace

int main() {
  // E = 8 k = 2 (Mixtral), E = 5 k = 5 (every expert), E = 64 k = 6, k = 1.
  const Case route_cases[] = {{7, 8, 2}, {5, 5, 5}, {40, 64, 6}, {9, 3, 1}, {1, 4, 2}, {0, 4, 2}};
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const Case& s : route_cases)
      for (bool b : {false, true}) route(dt, s, b);
  // N * k past the 256-thread block (the scan's carry across chunks).
  const Case plan_cases[] = {{7, 8, 2}, {300, 8, 2}, {33, 5, 5}, {1, 4, 1}, {0, 4, 2}};
  for (const Case& s : plan_cases)
    for (double cf : {0.0, 1.0, 0.5})
      for (int64_t seg : {int64_t(0), int64_t(13)})
        for (bool sh : {false, true}) plan(s.E == 5 ? DType::F64 : DType::F32, s, cf, seg, sh);
  // Runs of a larger group with prior counts (dropless: the priors change nothing).
  for (double cf : {0.0, 1.0, 0.5}) {
    plan(DType::F32, {300, 8, 2}, cf, 30, true, 120);  // runs of 30 in groups of 120
    plan(DType::F32, {300, 8, 2}, cf, 300, false, 1200);  // one run past a block
    plan(DType::F64, {33, 5, 5}, cf, 11, true, 44);
  }
  bad_plan();
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const Case& s : {Case{7, 8, 2}, Case{12, 5, 5}, Case{3, 6, 1}})
      for (double a : {0.0, 0.37}) router_backward(dt, s, a);
  return finish("moe_routing");
}
