// CUDA mixture-of-experts routing: the kernels and the ops that launch them
// (Backend::moe_route, moe_dispatch_plan, moe_router_backward; semantics in
// kernels/backend.hpp, the CPU reference in kernels/cpu/moe_routing.cpp).
// Nothing here reads device memory on the host: the MoE layer's one host
// read per layer is the plan's stats (the all-to-all's counts), after the
// ep collectives.
//
//  - moe_route: one thread per token row (E and k are small): softmax in R
//    (f32, or f64 for f64 logits), then k passes of "the best expert not yet
//    chosen" with the CPU's comparison (score = prob + bias in f64, strictly
//    greater wins: ties go to the lower id), renormalised weights.
//  - moe_dispatch_plan: one block per expert ranks that expert's assignments
//    in assignment order with block-wide prefix sums, per capacity group
//    (keep the first `cap`); one block per expert then sums its probs column
//    (a fixed-order block reduction: deterministic, not the CPU's order) and
//    finds its send offset (the kept rows of the experts in earlier slots);
//    a grid-stride pass adds the offsets and scatters the send tokens. A
//    choice or slot out of range is written to the backend's mapped error
//    words (kind 2), thrown at the next host synchronisation.
//  - moe_router_backward: one thread per row, in f64 like the CPU's; g[e] is
//    recomputed per expert instead of held in an array (no local memory).
//
// moe_routing.cu (the CUDA backend's methods) and the host emulation's test
// (tests/kernel_sim/moe_routing_sim_test.cpp) include this header.
#pragma once
#include <climits>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_checks.hpp"

namespace adgt::cuda {
namespace {

constexpr int kRouteThreads = 128;
constexpr int kPlanThreads = 256;

// Logits to R (bf16 read as fp32); R to the weights' storage type.
__device__ __forceinline__ float moe_ld(bf16_bits v) { return bf(v); }
__device__ __forceinline__ float moe_ld(float v) { return v; }
__device__ __forceinline__ double moe_ld(double v) { return v; }
template <class S, class R>
__device__ __forceinline__ void moe_st(S* p, R v) {
  if constexpr (std::is_same_v<S, bf16_bits>)
    *p = to_bf(float(v));
  else
    *p = S(v);
}

// Row t: softmax, top-k, renormalised weights (kernels/cpu/moe_routing.cpp).
template <class L, class R>
__global__ void moe_route_kernel(R* __restrict__ probs, int32_t* __restrict__ choice,
                                 R* __restrict__ weight, R* __restrict__ norm, L* __restrict__ w,
                                 const L* __restrict__ logits, const double* __restrict__ bias,
                                 int64_t N, int64_t E, int64_t k) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const L* l = logits + t * E;
  R* p = probs + t * E;
  int32_t* ch = choice + t * k;
  R m = moe_ld(l[0]);
  for (int64_t e = 1; e < E; ++e) {
    const R v = moe_ld(l[e]);
    m = m < v ? v : m;
  }
  R z = 0;
  for (int64_t e = 0; e < E; ++e) {
    const R v = dexp(moe_ld(l[e]) - m);
    p[e] = v;
    z += v;
  }
  for (int64_t e = 0; e < E; ++e) p[e] = p[e] / z;
  R sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    double best_score = 0;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ch[i] == e;
      if (taken) continue;
      const double score = double(p[e]) + (bias ? bias[e] : 0.0);
      if (best < 0 || score > best_score) best = e, best_score = score;
    }
    ch[j] = int32_t(best);
    sum += p[best];
  }
  for (int64_t j = 0; j < k; ++j) {
    const R wt = p[ch[j]] / sum;
    weight[t * k + j] = wt;
    moe_st(w + t * k + j, wt);
  }
  norm[t] = sum;
}

// A choice (which 0) or slot (which 1) out of range, kind 2: [which << 32 |
// index, value, bound] (with several, whichever block stores last).
__device__ void report_bad_route(int64_t* err, int64_t which, int64_t i, int64_t v, int64_t n) {
  err[1] = (which << 32) | i;
  err[2] = v;
  err[3] = n;
  __threadfence_system();
  err[0] = 2;
}

// Exclusive prefix sum of f over the block, in thread order; *total = the
// block's sum. sh: 32 ints of shared memory. Every thread must call it.
__device__ int block_excl_scan(int f, int* sh, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int v = f;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int s = lane < nw ? sh[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += u;
    }
    if (lane < nw) sh[lane] = s;
  }
  __syncthreads();
  const int before = warp ? sh[warp - 1] : 0;
  *total = sh[nw - 1];
  __syncthreads();
  return before + v - f;
}

// Block e: pos[a] = the rank of assignment a among expert e's kept ones (in
// assignment order), -1 if capacity drops it; per_e = [kept (E), routed
// (E), dropped (E)]. A run's count starts at its prior (the group's
// assignments to e before the run; Backend::MoeCapacity), so it keeps those
// below the group's cap.
__global__ void moe_rank_kernel(int32_t* __restrict__ pos, int64_t* __restrict__ per_e,
                                const int32_t* __restrict__ choice, int64_t N, int64_t k,
                                int64_t E, int64_t segment, int64_t group_rows, double cf,
                                const int32_t* __restrict__ prior, int64_t* err) {
  __shared__ int sh[32];
  const int64_t e = blockIdx.x;
  const int64_t seg = segment > 0 ? segment : (N > 1 ? N : 1);
  int64_t kept = 0, routed = 0, dropped = 0;
  for (int64_t g0 = 0; g0 < N; g0 += seg) {
    const int64_t rows = seg < N - g0 ? seg : N - g0;
    const int64_t g = group_rows > 0 ? group_rows : rows;
    const int64_t cap = cf > 0 ? int64_t(::ceil(cf * double(g * k) / double(E))) : LLONG_MAX;
    const int64_t a1 = (g0 + rows) * k;
    const int64_t p0 = prior ? int64_t(prior[(g0 / seg) * E + e]) : 0;
    const int64_t kept0 = p0 < cap ? p0 : cap;  // the group's kept before this run
    int64_t carry = p0;
    for (int64_t base = g0 * k; base < a1; base += blockDim.x) {
      const int64_t a = base + threadIdx.x;
      const int32_t c = a < a1 ? choice[a] : -1;
      if (e == 0 && a < a1 && (c < 0 || c >= E)) report_bad_route(err, 0, a, c, E);
      const int f = c == e;
      int tot = 0;
      const int ex = block_excl_scan(f, sh, &tot);
      if (f) {
        const int64_t r = carry + ex;
        pos[a] = r < cap ? int32_t(kept + r - kept0) : -1;
      }
      carry += tot;
    }
    const int64_t kk = (carry < cap ? carry : cap) - kept0;
    routed += carry - p0;
    kept += kk;
    dropped += carry - p0 - kk;
  }
  if (threadIdx.x == 0) {
    per_e[e] = kept;
    per_e[E + e] = routed;
    per_e[2 * E + e] = dropped;
  }
}

// Block e: stats[E + e] = sum over t of probs[t, e] (block reduction);
// thread 0: its send offset off[e] (kept rows of the experts in earlier
// slots), stats[e] = routed, stats[2E + 2 + slot[e]] = kept; block 0 also N
// and the dropped total.
template <class R>
__global__ void moe_plan_stats_kernel(double* __restrict__ stats, int64_t* __restrict__ off,
                                      const int64_t* __restrict__ per_e,
                                      const R* __restrict__ probs, const int32_t* __restrict__ slot,
                                      int64_t N, int64_t E, int64_t* err) {
  __shared__ double red[32];
  const int64_t e = blockIdx.x;
  double s = 0;
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x) s += double(probs[t * E + e]);
  s = block_sum(s, red);
  if (threadIdx.x != 0) return;
  stats[E + e] = s;
  const int32_t se = slot[e];
  if (se < 0 || se >= E) {
    report_bad_route(err, 1, e, se, E);
    return;
  }
  int64_t o = 0;
  for (int64_t i = 0; i < E; ++i) {
    if (i != e && slot[i] == se) report_bad_route(err, 1, i, se, E);
    if (slot[i] < se) o += per_e[i];
  }
  off[e] = o;
  stats[e] = double(per_e[E + e]);
  stats[2 * E + 2 + se] = double(per_e[e]);
  if (e == 0) {
    int64_t d = 0;
    for (int64_t i = 0; i < E; ++i) d += per_e[2 * E + i];
    stats[2 * E] = double(N);
    stats[2 * E + 1] = double(d);
  }
}

// pos[a] += its expert's send offset; send_tok[pos] = the token.
__global__ void moe_pos_kernel(int32_t* __restrict__ pos, int32_t* __restrict__ send_tok,
                               const int64_t* __restrict__ off, const int32_t* __restrict__ choice,
                               int64_t n, int64_t k, int64_t E) {
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < n;
       a += int64_t(gridDim.x) * blockDim.x) {
    const int32_t r = pos[a], c = choice[a];
    if (r < 0 || c < 0 || c >= E) continue;
    const int32_t p = int32_t(off[c] + r);
    pos[a] = p;
    send_tok[p] = int32_t(a / k);
  }
}

// Row t: dlogits = softmax backward of g (kernels/cpu/moe_routing.cpp), in f64.
template <class R, class D, class S>
__global__ void moe_router_bwd_kernel(S* __restrict__ dlogits, const R* __restrict__ probs,
                                      const int32_t* __restrict__ choice,
                                      const R* __restrict__ weight, const R* __restrict__ norm,
                                      const D* __restrict__ dw, const double* __restrict__ aux_dp,
                                      double a, int64_t N, int64_t E, int64_t k) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const R* p = probs + t * E;
  const int32_t* ch = choice + t * k;
  const D* d = dw + t * k;
  double sdw = 0;
  for (int64_t j = 0; j < k; ++j) sdw += double(d[j]) * double(weight[t * k + j]);
  const double nt = double(norm[t]);
  auto g = [&](int64_t e) {
    double v = a * aux_dp[e];
    for (int64_t j = 0; j < k; ++j)
      if (ch[j] == e) v += (double(d[j]) - sdw) / nt;
    return v;
  };
  double dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * g(e);
  for (int64_t e = 0; e < E; ++e) moe_st(dlogits + t * E + e, double(p[e]) * (g(e) - dot));
}

// ---- the ops ----

template <class F>
void dispatch_route(DType act, const char* op, F&& f) {
  switch (act) {
    case DType::BF16:
      f(bf16_bits{}, float{});
      break;
    case DType::F32:
      f(float{}, float{});
      break;
    case DType::F64:
      f(double{}, double{});
      break;
    default:
      ADGT_CHECK(false, op << ": logits dtype " << dtype_name(act) << " (f32, f64 or bf16 expected)");
  }
}

void moe_route(const OpCtx& c, const Backend::MoeRouting& r, const Tensor& logits,
               const Tensor& bias) {
  const char* op = "moe_route";
  const MoeDims d = check_moe_route(r, logits, bias, op);
  if (!d.N) return;
  ADGT_CHECK(d.N <= int64_t(65536) * kRouteThreads, op << ": " << d.N << " rows exceed one grid");
  dispatch_route(logits.dtype, op, [&](auto l, auto rr) {
    using L = decltype(l);
    using R = decltype(rr);
    launch(op, moe_route_kernel<L, R>, grid_for(d.N, kRouteThreads), kRouteThreads, 0, c.stream,
           r.probs.ptr<R>(), r.choice.ptr<int32_t>(), r.weight.ptr<R>(), r.norm.ptr<R>(),
           r.w.ptr<L>(), logits.ptr<L>(), bias.data ? bias.ptr<double>() : nullptr, d.N, d.E, d.k);
  });
}

void moe_dispatch_plan(const OpCtx& c, Tensor pos, Tensor send_tok, Tensor stats,
                       const Tensor& choice, const Tensor& probs, const Tensor& slot,
                       const Backend::MoeCapacity& cap) {
  const char* op = "moe_dispatch_plan";
  const MoeDims d = check_moe_plan(pos, send_tok, stats, choice, probs, slot, op);
  check_moe_capacity(cap, d, op, /*host_prior=*/false);  // prior is device memory
  ADGT_CHECK(d.E <= INT_MAX && d.N * d.k <= INT_MAX,
             op << ": " << d.N * d.k << " assignments over " << d.E << " experts exceed int32 rows");
  auto* ws = static_cast<int64_t*>(c.scratch(CudaBackend::kScratchIndex,
                                             size_t(4 * d.E) * sizeof(int64_t)));
  int64_t* per_e = ws;         // (3E)
  int64_t* off = ws + 3 * d.E;  // (E)
  if (!d.N) {
    // No rows: zero stats (kept and routed 0); the offsets are not needed.
    ADGT_CUDA_OP(cudaMemsetAsync(per_e, 0, size_t(3 * d.E) * sizeof(int64_t), c.stream), op);
  } else {
    launch(op, moe_rank_kernel, unsigned(d.E), kPlanThreads, 0, c.stream, pos.ptr<int32_t>(),
           per_e, choice.ptr<int32_t>(), d.N, d.k, d.E, cap.segment, cap.group_rows, cap.factor,
           cap.prior.data ? cap.prior.ptr<int32_t>() : nullptr, c.err_dev);
  }
  dispatch(probs.dtype, op, [&](auto z) {
    using R = decltype(z);
    launch(op, moe_plan_stats_kernel<R>, unsigned(d.E), kPlanThreads, 0, c.stream,
           stats.ptr<double>(), off, per_e, probs.ptr<R>(), slot.ptr<int32_t>(), d.N, d.E,
           c.err_dev);
  });
  if (d.N)
    launch(op, moe_pos_kernel, grid_for(d.N * d.k, kPlanThreads), kPlanThreads, 0, c.stream,
           pos.ptr<int32_t>(), send_tok.ptr<int32_t>(), off, choice.ptr<int32_t>(), d.N * d.k,
           d.k, d.E);
}

void moe_router_backward(const OpCtx& c, Tensor dlogits, const Backend::MoeRouting& r,
                         const Tensor& dw, const Tensor& aux_dp, double a) {
  const char* op = "moe_router_backward";
  const MoeDims d = check_moe_router_backward(dlogits, r, dw, aux_dp, op);
  if (!d.N) return;
  ADGT_CHECK(d.N <= int64_t(65536) * kRouteThreads, op << ": " << d.N << " rows exceed one grid");
  dispatch_route(dlogits.dtype, op, [&](auto s, auto rr) {
    using S = decltype(s);
    using R = decltype(rr);
    using D = std::conditional_t<std::is_same_v<S, double>, double, float>;
    launch(op, moe_router_bwd_kernel<R, D, S>, grid_for(d.N, kRouteThreads), kRouteThreads, 0,
           c.stream, dlogits.ptr<S>(), r.probs.ptr<R>(), r.choice.ptr<int32_t>(),
           r.weight.ptr<R>(), r.norm.ptr<R>(), dw.ptr<D>(), aux_dp.ptr<double>(), a, d.N, d.E, d.k);
  });
}

}  // namespace
}  // namespace adgt::cuda
