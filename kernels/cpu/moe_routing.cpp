// CPU mixture-of-experts routing (Backend::moe_route, moe_dispatch_plan,
// moe_router_backward; semantics in kernels/backend.hpp and
// core/model/moe.hpp). The reference the CUDA kernels
// (kernels/cuda/moe_routing_kernels.cuh) are checked against; sequential and
// in a fixed order, so every result is deterministic.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {

namespace {

// Softmax in R, top-k by score = prob + bias (strictly greater wins, so ties
// go to the lower expert id), weights renormalised over the k.
template <class R, class L>
void route_rows(const Backend::MoeRouting& r, const L* logits, const double* bias, int64_t N,
                int64_t E, int64_t k, DType act) {
  R* probs = r.probs.ptr<R>();
  int32_t* choice = r.choice.ptr<int32_t>();
  R* weight = r.weight.ptr<R>();
  R* norm = r.norm.ptr<R>();
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    R* p = probs + t * E;
    const L* l = logits + t * E;
    auto lv = [&](int64_t e) {
      if constexpr (std::is_same_v<L, bf16_bits>)
        return R(bf16_to_float(l[e]));
      else
        return R(l[e]);
    };
    R m = lv(0);
    for (int64_t e = 1; e < E; ++e) m = std::max(m, lv(e));
    R z = 0;
    for (int64_t e = 0; e < E; ++e) z += (p[e] = std::exp(lv(e) - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= z;
    std::fill(taken.begin(), taken.end(), 0);
    R sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      double best_score = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[size_t(e)]) continue;
        const double score = double(p[e]) + (bias ? bias[e] : 0.0);
        if (best < 0 || score > best_score) best = e, best_score = score;
      }
      taken[size_t(best)] = 1;
      choice[t * k + j] = int32_t(best);
      sum += p[best];
    }
    for (int64_t j = 0; j < k; ++j) {
      const R wt = p[choice[t * k + j]] / sum;
      weight[t * k + j] = wt;
      if (act == DType::BF16)
        r.w.ptr<bf16_bits>()[t * k + j] = float_to_bf16(float(wt));
      else
        r.w.ptr<R>()[t * k + j] = wt;
    }
    norm[t] = sum;
  }
}

template <class R>
double read_r(const Tensor& t, int64_t i) {
  return double(t.ptr<R>()[i]);
}

}  // namespace

void CpuBackend::moe_route(const MoeRouting& r, const Tensor& logits, const Tensor& bias) {
  const MoeDims d = check_moe_route(r, logits, bias, "moe_route");
  const double* b = bias.data ? bias.ptr<double>() : nullptr;
  switch (logits.dtype) {
    case DType::F64:
      route_rows<double>(r, logits.ptr<double>(), b, d.N, d.E, d.k, logits.dtype);
      break;
    case DType::F32:
      route_rows<float>(r, logits.ptr<float>(), b, d.N, d.E, d.k, logits.dtype);
      break;
    case DType::BF16:
      route_rows<float>(r, logits.ptr<bf16_bits>(), b, d.N, d.E, d.k, logits.dtype);
      break;
    default:
      ADGT_CHECK(false, "moe_route: logits dtype " << dtype_name(logits.dtype)
                                                   << " (f32, f64 or bf16 expected)");
  }
}

void CpuBackend::moe_dispatch_plan(Tensor pos, Tensor send_tok, Tensor stats, const Tensor& choice,
                                   const Tensor& probs, const Tensor& slot,
                                   const MoeCapacity& cap) {
  const char* op = "moe_dispatch_plan";
  const MoeDims d = check_moe_plan(pos, send_tok, stats, choice, probs, slot, op);
  check_moe_capacity(cap, d, op);
  const int64_t N = d.N, E = d.E, k = d.k;
  const int32_t* ch = choice.ptr<int32_t>();
  const int32_t* sl = slot.ptr<int32_t>();
  check_moe_slots(sl, E, op);
  for (int64_t a = 0; a < N * k; ++a)
    ADGT_CHECK(ch[a] >= 0 && ch[a] < E,
               op << ": choice[" << a << "] = " << ch[a] << " outside 0.." << E - 1);
  double* st = stats.ptr<double>();
  std::fill(st, st + 3 * E + 2, 0.0);

  // Capacity: per group of rows, per expert, in assignment order.
  std::vector<char> keep(size_t(N * k), 1);
  int64_t dropped = 0;
  if (cap.factor > 0) {
    const int64_t seg = cap.segment > 0 ? cap.segment : std::max<int64_t>(N, 1);
    const int32_t* prior = cap.prior.data ? cap.prior.ptr<int32_t>() : nullptr;
    std::vector<int64_t> used(static_cast<size_t>(E));
    for (int64_t g0 = 0; g0 < N; g0 += seg) {
      const int64_t rows = std::min(seg, N - g0);
      const int64_t limit = moe_capacity_limit(cap, rows, k, E);
      // The group's assignments before this run, as far as they were kept.
      for (int64_t e = 0; e < E; ++e)
        used[size_t(e)] = prior ? std::min<int64_t>(prior[(g0 / seg) * E + e], limit) : 0;
      for (int64_t a = g0 * k; a < (g0 + rows) * k; ++a) {
        int64_t& u = used[size_t(ch[a])];
        if (u < limit)
          ++u;
        else
          keep[size_t(a)] = 0, ++dropped;
      }
    }
  }

  // Send order: slot, then assignment order.
  std::vector<std::vector<int64_t>> bucket(static_cast<size_t>(E));
  for (int64_t a = 0; a < N * k; ++a) {
    st[ch[a]] += 1;
    if (keep[size_t(a)]) bucket[size_t(ch[a])].push_back(a);
  }
  std::vector<int64_t> at_slot(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) at_slot[size_t(sl[e])] = e;
  int32_t* pp = pos.ptr<int32_t>();
  int32_t* tok = send_tok.ptr<int32_t>();
  std::fill(pp, pp + N * k, -1);
  int32_t row = 0;
  for (int64_t s = 0; s < E; ++s) {
    const auto& b = bucket[size_t(at_slot[size_t(s)])];
    for (int64_t a : b) {
      pp[a] = row;
      tok[row++] = int32_t(a / k);
    }
    st[2 * E + 2 + s] = double(b.size());
  }
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e)
      st[E + e] += probs.dtype == DType::F64 ? read_r<double>(probs, t * E + e)
                                             : read_r<float>(probs, t * E + e);
  st[2 * E] = double(N);
  st[2 * E + 1] = double(dropped);
}

void CpuBackend::moe_router_backward(Tensor dlogits, const MoeRouting& r, const Tensor& dw,
                                     const Tensor& aux_dp, double a) {
  const MoeDims d = check_moe_router_backward(dlogits, r, dw, aux_dp, "moe_router_backward");
  const int64_t N = d.N, E = d.E, k = d.k;
  const bool r64 = r.probs.dtype == DType::F64;
  auto rv = [&](const Tensor& t, int64_t i) { return r64 ? read_r<double>(t, i) : read_r<float>(t, i); };
  auto dwv = [&](int64_t i) {
    return dw.dtype == DType::F64 ? dw.ptr<double>()[i] : double(dw.ptr<float>()[i]);
  };
  const int32_t* ch = r.choice.ptr<int32_t>();
  const double* adp = aux_dp.ptr<double>();
  std::vector<double> g(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t e = 0; e < E; ++e) g[size_t(e)] = a * adp[e];
    double sdw = 0;
    for (int64_t j = 0; j < k; ++j) sdw += dwv(t * k + j) * rv(r.weight, t * k + j);
    const double nt = rv(r.norm, t);
    for (int64_t j = 0; j < k; ++j) g[size_t(ch[t * k + j])] += (dwv(t * k + j) - sdw) / nt;
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += rv(r.probs, t * E + e) * g[size_t(e)];
    for (int64_t e = 0; e < E; ++e) {
      const double v = rv(r.probs, t * E + e) * (g[size_t(e)] - dot);
      switch (dlogits.dtype) {
        case DType::F64:
          dlogits.ptr<double>()[t * E + e] = v;
          break;
        case DType::BF16:
          dlogits.ptr<bf16_bits>()[t * E + e] = float_to_bf16(float(v));
          break;
        default:
          dlogits.ptr<float>()[t * E + e] = float(v);
      }
    }
  }
}

}  // namespace adgt
