// The mixture-of-experts block (semantics in moe.hpp). Routing decisions are
// small (N x E) and decide the all-to-all counts, so they are made on the host
// from the router logits; token rows move on the backend: the dispatch gathers
// rows with embedding_forward (row indices as tokens), the combine and its
// backward are combine_rows / combine_rows_backward.
//
// Row orders. Send buffer (this rank's kept assignments): by destination rank,
// then the destination's local expert, then token (then choice) order; pos[t,j]
// is the send row of token t's j-th choice (-1: dropped). Receive buffer: by
// source rank, local expert, token. Expert-major buffer (what the experts run
// on): by local expert, source rank, token: xe = recv[perm], recv = xe[inv].
// With one rank the send buffer already is expert-major and no copy is made.
#include "core/model/moe.hpp"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"

namespace adgt {

struct MoeLayer::Slot {
  int64_t N = 0;
  bool has_forward = false;
  // Host routing: values of the tensor dtype, held as double.
  std::vector<double> probs;                  // (N, E) softmax
  std::vector<int32_t> choice;                // (N, k) chosen experts, descending score
  std::vector<double> weight;                 // (N, k) renormalised routing weights
  std::vector<double> norm;                   // (N) sum of the chosen probs
  std::vector<int64_t> send_rows, recv_rows;  // (ep) rows exchanged with each rank
  std::vector<int64_t> expert_rows;           // (El) rows each local expert ran on
  std::vector<double> aux_dp;                 // (E) d aux / d probs[t, e] (any t)
  // Device.
  Buffer x_b, pos_b, w_b, xe_b, gate_b, up_b, h_b, ysend_b, perm_b, inv_b;
  Tensor x;            // (N, C) input copy (router backward)
  Tensor pos, w;       // (N, k) int32 send rows, dtype weights
  Tensor xe;           // (Mr, C) expert inputs, expert-major
  Tensor gate, up, h;  // (Mr, F) w1 x, w3 x, silu(gate) * up; fused: gate (Mr, 2F), up unused
  bool fused = false;  // the forward ran the fused gate/up (MoeParams::w13)
  Tensor ysend;        // (Ms, C) expert outputs back in send order
  Tensor perm, inv;    // (Mr) int32
  MoeStats stats;
};

// Buffers only one call uses at a time (shared by the slots).
struct MoeLayer::Scratch {
  Buffer logits, send_tok, send, recv, ye, tmp, dh, dgate, dup, dw, counts_out, counts_in, red;
};

MoeLayer::MoeLayer(Backend& be, DType dt, int64_t max_tokens, int64_t C, int64_t F, MoeOptions o,
                   std::vector<int> placement, Comm* ep)
    : be_(be),
      dt_(dt),
      max_tokens_(max_tokens),
      C_(C),
      F_(F),
      E_(o.n_experts),
      k_(o.top_k),
      opt_(o),
      self_("ep"),
      ep_(ep ? ep : &self_),
      place_(o.n_experts, ep ? ep->size() : 1, std::move(placement)),
      scratch_(std::make_unique<Scratch>()) {
  ADGT_CHECK(dt == DType::F32 || dt == DType::F64 || dt == DType::BF16,
             "moe: dtype " << dtype_name(dt) << " not supported (f32, f64 or bf16)");
  ADGT_CHECK(C >= 1 && F >= 1,
             "moe: d_model=" << C << " and expert hidden size=" << F << " must be positive");
  ADGT_CHECK(max_tokens >= 0, "moe: max_tokens=" << max_tokens << " must be >= 0");
  ADGT_CHECK(k_ >= 1 && k_ <= E_, "moe: top_k=" << k_ << " must be in [1, n_experts=" << E_ << "]");
  ADGT_CHECK(std::isfinite(o.capacity_factor),
             "moe: capacity_factor=" << o.capacity_factor << " must be finite (<= 0: dropless)");
  ADGT_CHECK(o.capacity_segment >= 0,
             "moe: capacity_segment=" << o.capacity_segment << " must be >= 0 (0: all rows)");
  ADGT_CHECK(o.bias_rate >= 0 && std::isfinite(o.aux_loss_coef),
             "moe: bias_rate=" << o.bias_rate << " must be >= 0 and aux_loss_coef="
                               << o.aux_loss_coef << " finite");
  ADGT_CHECK(int64_t(place_.ep()) * max_tokens * k_ < int64_t(std::numeric_limits<int32_t>::max()),
             "moe: ep x max_tokens x top_k = " << int64_t(place_.ep()) * max_tokens * k_
                                               << " rows exceed int32 row indices");
  bias_.assign(size_t(E_), 0.0);
}

MoeLayer::~MoeLayer() = default;

double MoeLayer::expert_clock() const {
  // The calling thread's CPU time: the experts' own compute on a host
  // backend with one thread (what a rank sharing cores with others did
  // itself); -1 elsewhere (asynchronous devices, several threads).
  if (!be_.is_host() || omp_get_max_threads() != 1) return -1;
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int MoeLayer::add_slot() {
  slots_.push_back(std::make_unique<Slot>());
  return int(slots_.size()) - 1;
}

int MoeLayer::num_slots() const { return int(slots_.size()); }

const std::vector<int64_t>& MoeLayer::local_experts() const {
  return place_.local_experts(ep_->rank());
}
int MoeLayer::ep_rank() const { return ep_->rank(); }
int MoeLayer::ep_size() const { return ep_->size(); }

const MoeStats& MoeLayer::stats(int slot) const {
  ADGT_CHECK(slot >= 0 && slot < num_slots(),
             "moe: slot " << slot << " does not exist (" << num_slots() << " slots)");
  return slots_[size_t(slot)]->stats;
}

const MoeStats& MoeLayer::last_stats() const {
  static const MoeStats none;
  return last_slot_ < 0 ? none : slots_[size_t(last_slot_)]->stats;
}

void MoeLayer::set_bias(std::vector<double> b) {
  ADGT_CHECK(int64_t(b.size()) == E_,
             "moe: set_bias got " << b.size() << " values for " << E_ << " experts");
  bias_ = std::move(b);
}

void MoeLayer::update_bias(const std::vector<int64_t>& load) {
  ADGT_CHECK(int64_t(load.size()) == E_,
             "moe: update_bias got a load of " << load.size() << " experts, expected " << E_);
  double total = 0;
  for (int64_t l : load) total += double(l);
  const double mean = total / double(E_);
  for (int64_t e = 0; e < E_; ++e) {
    const double d = mean - double(load[size_t(e)]);
    bias_[size_t(e)] += opt_.bias_rate * double((d > 0) - (d < 0));
  }
}

void MoeLayer::check_params(const MoeParams& p, const char* what) const {
  const size_t El = size_t(place_.per_rank());
  // Weights in the layer's dtype; gradients in fp32 under bf16 (the master dtype).
  const DType dt = std::string(what) == "grads" ? grad_dtype() : dt_;
  ADGT_CHECK(p.gate.ndim == 2 && p.gate.dim(0) == E_ && p.gate.dim(1) == C_ && p.gate.dtype == dt,
             "moe: " << what << " gate" << p.gate.shape_str() << " " << dtype_name(p.gate.dtype)
                     << ", expected (" << E_ << "," << C_ << ") " << dtype_name(dt));
  ADGT_CHECK(p.w1.size() == El && p.w2.size() == El && p.w3.size() == El,
             "moe: " << what << " holds " << p.w1.size() << "/" << p.w2.size() << "/" << p.w3.size()
                     << " w1/w2/w3 tensors; this ep rank holds " << El << " experts");
  auto shape = [&](const Tensor& t, int64_t r, int64_t c, const char* name, size_t i) {
    ADGT_CHECK(t.ndim == 2 && t.dim(0) == r && t.dim(1) == c && t.dtype == dt && t.data,
               "moe: " << what << " " << name << "[" << i << "]" << t.shape_str() << " "
                       << dtype_name(t.dtype) << ", expected (" << r << "," << c << ") "
                       << dtype_name(dt));
  };
  for (size_t i = 0; i < El; ++i) {
    shape(p.w1[i], F_, C_, "w1", i);
    shape(p.w3[i], F_, C_, "w3", i);
    shape(p.w2[i], C_, F_, "w2", i);
  }
  ADGT_CHECK(p.w13.empty() || p.w13.size() == El,
             "moe: " << what << " holds " << p.w13.size() << " fused w1/w3 tensors; this ep rank "
                     << "holds " << El << " experts");
  for (size_t i = 0; i < p.w13.size(); ++i) {
    shape(p.w13[i], 2 * F_, C_, "w13", i);
    ADGT_CHECK(p.w13[i].data == p.w1[i].data &&
                   static_cast<const char*>(p.w3[i].data) ==
                       static_cast<const char*>(p.w1[i].data) + p.w1[i].bytes(),
               "moe: " << what << " w13[" << i << "] is not w1[" << i << "] followed by w3[" << i
                       << "]");
  }
}

Tensor MoeLayer::grow(Buffer& b, int64_t rows, int64_t cols, DType dt) {
  // At least one row, so a buffer is never null (all_to_allv needs in != out).
  const size_t need =
      size_t(std::max<int64_t>(rows, 1) * std::max<int64_t>(cols, 1)) * dtype_size(dt);
  if (b.bytes() < need) b = Buffer(be_, need + need / 4);
  return Tensor(b.data(), dt, {rows, cols});
}

void MoeLayer::upload(Tensor dst, const std::vector<double>& src) {
  if (src.empty()) return;
  if (dst.dtype == DType::F64) {
    be_.to_device(dst.data, src.data(), src.size() * 8);
  } else if (dst.dtype == DType::BF16) {  // via fp32 (bf16 routing weights are fp32 values)
    std::vector<bf16_bits> h(src.size());
    for (size_t i = 0; i < src.size(); ++i) h[i] = float_to_bf16(float(src[i]));
    be_.to_device(dst.data, h.data(), h.size() * 2);
  } else {
    std::vector<float> f(src.begin(), src.end());
    be_.to_device(dst.data, f.data(), f.size() * 4);
  }
}

void MoeLayer::upload_i32(Tensor dst, const std::vector<int32_t>& src) {
  if (!src.empty()) be_.to_device(dst.data, src.data(), src.size() * 4);
}

void MoeLayer::a2av(Tensor out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                    const std::vector<int64_t>& send_rows, MoeStats& st, bool bwd) {
  const size_t P = recv_rows.size();
  std::vector<int64_t> rc(P), rd(P), sc(P), sd(P);
  int64_t r = 0, s = 0;
  for (size_t i = 0; i < P; ++i) {
    rc[i] = recv_rows[i] * C_, rd[i] = r, r += rc[i];
    sc[i] = send_rows[i] * C_, sd[i] = s, s += sc[i];
  }
  const int64_t b0 = ep_->stats().bytes;
  const double t0 = ep_->stats().seconds;
  ep_->all_to_allv(out, rc, rd, in, sc, sd);
  (bwd ? st.a2a_bytes_bwd : st.a2a_bytes) += ep_->stats().bytes - b0;
  (bwd ? st.a2a_seconds_bwd : st.a2a_seconds) += ep_->stats().seconds - t0;
}

// Softmax in the tensor dtype T, top-k by score (strictly greater wins, so
// ties go to the lower expert id), weights renormalised over the k.
template <class T>
void MoeLayer::route(Slot& s, const std::vector<T>& logits) {
  const int64_t N = s.N, E = E_, k = k_;
  s.probs.assign(size_t(N * E), 0.0);
  s.choice.assign(size_t(N * k), 0);
  s.weight.assign(size_t(N * k), 0.0);
  s.norm.assign(size_t(N), 0.0);
  std::vector<T> p(static_cast<size_t>(E));
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const T* l = logits.data() + t * E;
    T m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    T z = 0;
    for (int64_t e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(l[e] - m));
    for (int64_t e = 0; e < E; ++e) s.probs[size_t(t * E + e)] = double(p[size_t(e)] /= z);
    std::fill(taken.begin(), taken.end(), 0);
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      double best_score = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[size_t(e)]) continue;
        const double score = double(p[size_t(e)]) + (opt_.aux_free ? bias_[size_t(e)] : 0.0);
        if (best < 0 || score > best_score) best = e, best_score = score;
      }
      taken[size_t(best)] = 1;
      s.choice[size_t(t * k + j)] = int32_t(best);
      sum += p[size_t(best)];
    }
    for (int64_t j = 0; j < k; ++j)
      s.weight[size_t(t * k + j)] = double(p[size_t(s.choice[size_t(t * k + j)])] / sum);
    s.norm[size_t(t)] = double(sum);
  }
}

double MoeLayer::forward(int slot, Tensor out, const Tensor& x, const MoeParams& p) {
  ADGT_CHECK(slot >= 0 && slot < num_slots(), "moe: forward into slot "
                                                  << slot << ", but the layer has " << num_slots()
                                                  << " slots (add_slot)");
  const int64_t N = x.ndim == 2 ? x.dim(0) : -1, C = C_, E = E_, k = k_;
  ADGT_CHECK(x.ndim == 2 && x.dim(1) == C && x.dtype == dt_,
             "moe: input x" << x.shape_str() << " " << dtype_name(x.dtype) << ", expected (N," << C
                            << ") " << dtype_name(dt_));
  ADGT_CHECK(N <= max_tokens_, "moe: " << N << " token rows exceed max_tokens=" << max_tokens_);
  ADGT_CHECK(out.numel() == N * C && out.dtype == dt_,
             "moe: output" << out.shape_str() << ", expected " << x.shape_str());
  check_params(p, "params");
  Slot& s = *slots_[size_t(slot)];
  Scratch& sc = *scratch_;
  const int P = ep_->size();
  const int64_t El = place_.per_rank();
  s.N = N;
  s.has_forward = false;
  s.stats = MoeStats{};
  MoeStats& st = s.stats;
  last_slot_ = slot;

  // ---- router ----
  s.x = grow(s.x_b, N, C, dt_);
  Tensor logits = grow(sc.logits, N, E, dt_);
  if (N) {
    be_.copy(s.x, x);
    be_.linear_forward(logits, s.x, p.gate);
  }
  if (dt_ == DType::F64) {
    std::vector<double> l(size_t(N * E));
    if (N) be_.to_host(l.data(), logits.data, l.size() * 8);
    route(s, l);
  } else if (dt_ == DType::BF16) {  // bf16 logits, routed in fp32
    std::vector<bf16_bits> h(size_t(N * E));
    if (N) be_.to_host(h.data(), logits.data, h.size() * 2);
    std::vector<float> l(h.size());
    for (size_t i = 0; i < h.size(); ++i) l[i] = bf16_to_float(h[i]);
    route(s, l);
  } else {
    std::vector<float> l(size_t(N * E));
    if (N) be_.to_host(l.data(), logits.data, l.size() * 4);
    route(s, l);
  }

  // ---- capacity: per group of rows, per expert, in token order ----
  std::vector<char> keep(size_t(N * k), 1);
  if (opt_.capacity_factor > 0) {
    const int64_t seg = opt_.capacity_segment > 0 ? opt_.capacity_segment : std::max<int64_t>(N, 1);
    std::vector<int64_t> used(static_cast<size_t>(E));
    for (int64_t g0 = 0; g0 < N; g0 += seg) {
      const int64_t rows = std::min(seg, N - g0);
      const auto cap = int64_t(std::ceil(opt_.capacity_factor * double(rows * k) / double(E)));
      std::fill(used.begin(), used.end(), 0);
      for (int64_t a = g0 * k; a < (g0 + rows) * k; ++a) {
        int64_t& u = used[size_t(s.choice[size_t(a)])];
        if (u < cap)
          ++u;
        else
          keep[size_t(a)] = 0, ++st.dropped_local;
      }
    }
  }

  // ---- send order: destination rank, its local expert, token ----
  std::vector<std::vector<int64_t>> bucket(
      static_cast<size_t>(E));                      // kept assignments t*k+j per expert
  std::vector<double> red(size_t(2 * E + 2), 0.0);  // routed counts, prob sums, N, dropped
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = s.choice[size_t(a)];
    red[size_t(e)] += 1;
    if (keep[size_t(a)]) bucket[size_t(e)].push_back(a);
  }
  std::vector<int32_t> pos(size_t(N * k), -1), send_tok, counts(size_t(P * El));
  s.send_rows.assign(size_t(P), 0);
  for (int d = 0; d < P; ++d)
    for (int64_t le = 0; le < El; ++le) {
      const auto& b = bucket[size_t(place_.local_experts(d)[size_t(le)])];
      for (int64_t a : b) {
        pos[size_t(a)] = int32_t(send_tok.size());
        send_tok.push_back(int32_t(a / k));
      }
      counts[size_t(d * El + le)] = int32_t(b.size());
      s.send_rows[size_t(d)] += int64_t(b.size());
    }
  const int64_t Ms = int64_t(send_tok.size());

  // ---- load, aux loss: sums over the ep group ----
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) red[size_t(E + e)] += s.probs[size_t(t * E + e)];
  red[size_t(2 * E)] = double(N);
  red[size_t(2 * E + 1)] = double(st.dropped_local);
  const std::vector<double> local_red = red;  // this rank's tokens only
  {
    Tensor r = grow(sc.red, 2 * E + 2, 1, DType::F64);
    be_.to_device(r.data, red.data(), red.size() * 8);
    ep_->all_reduce(r);
    be_.to_host(red.data(), r.data, red.size() * 8);
  }
  const double n_total = red[size_t(2 * E)];
  st.tokens = int64_t(std::llround(n_total));
  st.dropped = int64_t(std::llround(red[size_t(2 * E + 1)]));
  st.load.assign(size_t(E), 0);
  s.aux_dp.assign(size_t(E), 0.0);
  int64_t max_load = 0, sum_load = 0;
  // The aux loss over the ep group's tokens, or over this rank's (aux_over_ep_group false).
  const std::vector<double>& ar = opt_.aux_over_ep_group ? red : local_red;
  const double n_aux = ar[size_t(2 * E)];
  for (int64_t e = 0; e < E; ++e) {
    st.load[size_t(e)] = int64_t(std::llround(red[size_t(e)]));
    max_load = std::max(max_load, st.load[size_t(e)]);
    sum_load += st.load[size_t(e)];
    if (n_aux > 0) {
      const double f = ar[size_t(e)] / (n_aux * double(k)), pe = ar[size_t(E + e)] / n_aux;
      st.aux_loss += double(E) * f * pe;
      s.aux_dp[size_t(e)] = double(E) * f / n_aux;
    }
  }
  st.imbalance = sum_load ? double(max_load) * double(E) / double(sum_load) : 0.0;

  // ---- counts to the experts' ranks; receive and expert-major orders ----
  std::vector<int32_t> rcounts(counts.size());
  {
    Tensor co = grow(sc.counts_out, P * El, 1, DType::I32),
           ci = grow(sc.counts_in, P * El, 1, DType::I32);
    upload_i32(co, counts);
    const int64_t b0 = ep_->stats().bytes;
    const double t0 = ep_->stats().seconds;
    ep_->all_to_all(ci, co);
    st.a2a_bytes += ep_->stats().bytes - b0;
    st.a2a_seconds += ep_->stats().seconds - t0;
    be_.to_host(rcounts.data(), ci.data, rcounts.size() * 4);
  }
  s.recv_rows.assign(size_t(P), 0);
  s.expert_rows.assign(size_t(El), 0);
  std::vector<int64_t> roff(size_t(P * El));
  int64_t Mr = 0;
  for (int src = 0; src < P; ++src)
    for (int64_t le = 0; le < El; ++le) {
      const int64_t c = rcounts[size_t(src * El + le)];
      roff[size_t(src * El + le)] = Mr;
      Mr += c;
      s.recv_rows[size_t(src)] += c;
      s.expert_rows[size_t(le)] += c;
    }
  std::vector<int32_t> perm(static_cast<size_t>(Mr)), inv(static_cast<size_t>(Mr));
  {
    int64_t i = 0;
    for (int64_t le = 0; le < El; ++le)
      for (int src = 0; src < P; ++src)
        for (int64_t q = 0; q < rcounts[size_t(src * El + le)]; ++q, ++i) {
          perm[size_t(i)] = int32_t(roff[size_t(src * El + le)] + q);
          inv[size_t(perm[size_t(i)])] = int32_t(i);
        }
  }

  // ---- device index tensors ----
  s.pos = grow(s.pos_b, N, k, DType::I32);
  s.w = grow(s.w_b, N, k, dt_);
  upload_i32(s.pos, pos);
  upload(s.w, s.weight);
  s.perm = grow(s.perm_b, Mr, 1, DType::I32);
  s.inv = grow(s.inv_b, Mr, 1, DType::I32);
  upload_i32(s.perm, perm);
  upload_i32(s.inv, inv);
  Tensor tok = grow(sc.send_tok, Ms, 1, DType::I32);
  upload_i32(tok, send_tok);

  // ---- dispatch ----
  s.xe = grow(s.xe_b, Mr, C, dt_);
  s.fused = !p.w13.empty();
  s.gate = grow(s.gate_b, Mr, s.fused ? 2 * F_ : F_, dt_);
  if (!s.fused) s.up = grow(s.up_b, Mr, F_, dt_);
  s.h = grow(s.h_b, Mr, F_, dt_);
  s.ysend = grow(s.ysend_b, Ms, C, dt_);
  if (P == 1) {
    if (Ms) be_.embedding_forward(s.xe, s.x, tok, 0);
  } else {
    Tensor send = grow(sc.send, Ms, C, dt_), recv = grow(sc.recv, Mr, C, dt_);
    if (Ms) be_.embedding_forward(send, s.x, tok, 0);
    a2av(recv, s.recv_rows, send, s.send_rows, st, false);
    if (Mr) be_.embedding_forward(s.xe, recv, s.perm, 0);
  }

  // ---- experts ----
  Tensor ye = P == 1 ? s.ysend : grow(sc.ye, Mr, C, dt_);
  const double c0 = expert_clock();
  for (int64_t le = 0, off = 0; le < El; off += s.expert_rows[size_t(le)], ++le) {
    const int64_t m = s.expert_rows[size_t(le)];
    if (!m) continue;
    Tensor xb = s.xe.rows(off, m), gb = s.gate.rows(off, m), hb = s.h.rows(off, m);
    if (s.fused) {
      be_.linear_forward(gb, xb, p.w13[size_t(le)]);
      be_.swiglu_packed_forward(hb, gb);
    } else {
      Tensor ub = s.up.rows(off, m);
      be_.linear_forward(gb, xb, p.w1[size_t(le)]);
      be_.linear_forward(ub, xb, p.w3[size_t(le)]);
      be_.swiglu_forward(hb, gb, ub);
    }
    be_.linear_forward(ye.rows(off, m), hb, p.w2[size_t(le)]);
  }
  st.expert_rows = Mr;
  st.expert_cpu_s = c0 >= 0 ? expert_clock() - c0 : -1;

  // ---- results back, combine ----
  if (P > 1) {
    Tensor tmp = grow(sc.tmp, Mr, C, dt_);
    if (Mr) be_.embedding_forward(tmp, ye, s.inv, 0);
    a2av(s.ysend, s.send_rows, tmp, s.recv_rows, st, false);
  }
  if (N) be_.combine_rows(out, s.ysend, s.pos, s.w, false);
  s.has_forward = true;
  return st.aux_loss;
}

// dL/dlogits on the host: through the renormalised top-k weights
// (w_j = p_j / S) and the aux loss (f constant), then the softmax.
void MoeLayer::router_backward(Slot& s, const std::vector<double>& dw, double aux_grad_scale) {
  const int64_t N = s.N, E = E_, k = k_;
  const double a = opt_.aux_loss_coef * aux_grad_scale;
  std::vector<double> dl(size_t(N * E)), g(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const double* p = s.probs.data() + t * E;
    for (int64_t e = 0; e < E; ++e) g[size_t(e)] = a * s.aux_dp[size_t(e)];
    double sdw = 0;
    for (int64_t j = 0; j < k; ++j) sdw += dw[size_t(t * k + j)] * s.weight[size_t(t * k + j)];
    for (int64_t j = 0; j < k; ++j)
      g[size_t(s.choice[size_t(t * k + j)])] += (dw[size_t(t * k + j)] - sdw) / s.norm[size_t(t)];
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * g[size_t(e)];
    for (int64_t e = 0; e < E; ++e) dl[size_t(t * E + e)] = p[e] * (g[size_t(e)] - dot);
  }
  Tensor dlogits = grow(scratch_->logits, N, E, dt_);
  upload(dlogits, dl);
}

void MoeLayer::backward(int slot, Tensor dx, const MoeParams& p, const MoeParams& grads,
                        const Tensor& dout, double aux_grad_scale) {
  ADGT_CHECK(slot >= 0 && slot < num_slots() && slots_[size_t(slot)]->has_forward,
             "moe: backward of slot " << slot << ", which holds no forward");
  Slot& s = *slots_[size_t(slot)];
  Scratch& sc = *scratch_;
  const int64_t N = s.N, C = C_, k = k_;
  ADGT_CHECK(dout.numel() == N * C && dout.dtype == dt_ && dx.numel() == N * C && dx.dtype == dt_,
             "moe: backward dout" << dout.shape_str() << " dx" << dx.shape_str() << ", expected ("
                                  << N << "," << C << ") " << dtype_name(dt_));
  check_params(p, "params");
  check_params(grads, "grads");
  const int P = ep_->size();
  const int64_t El = place_.per_rank();
  MoeStats& st = s.stats;
  st.a2a_bytes_bwd = 0;
  st.a2a_seconds_bwd = 0;
  int64_t Ms = 0, Mr = 0;
  for (int i = 0; i < P; ++i) Ms += s.send_rows[size_t(i)], Mr += s.recv_rows[size_t(i)];

  // Combine: dy rows (send order) and d(weights).
  Tensor dys = grow(sc.send, Ms, C, dt_), dwt = grow(sc.dw, N, k, grad_dtype());
  if (N) be_.combine_rows_backward(dys, dwt, dout, s.ysend, s.pos, s.w);
  std::vector<double> dw(size_t(N * k));
  if (dt_ == DType::F64) {
    if (N) be_.to_host(dw.data(), dwt.data, dw.size() * 8);
  } else {
    std::vector<float> f(dw.size());
    if (N) be_.to_host(f.data(), dwt.data, f.size() * 4);
    std::copy(f.begin(), f.end(), dw.begin());
  }

  // Output gradients to the experts.
  Tensor dye = dys;
  if (P > 1) {
    Tensor recv = grow(sc.recv, Mr, C, dt_);
    a2av(recv, s.recv_rows, dys, s.send_rows, st, true);
    dye = grow(sc.ye, Mr, C, dt_);
    if (Mr) be_.embedding_forward(dye, recv, s.perm, 0);
  }
  Tensor dxe = grow(sc.recv, Mr, C, dt_);  // free again: dye holds the gathered rows
  ADGT_CHECK(s.fused == !p.w13.empty(),
             "moe: the backward was " << (s.fused ? "not " : "") << "given the fused w1/w3 its "
                                      << "forward ran with");
  Tensor dh = grow(sc.dh, Mr, F_, dt_), dg = grow(sc.dgate, Mr, s.fused ? 2 * F_ : F_, dt_),
         du = s.fused ? Tensor() : grow(sc.dup, Mr, F_, dt_);
  const double c0 = expert_clock();
  for (int64_t le = 0, off = 0; le < El; off += s.expert_rows[size_t(le)], ++le) {
    const int64_t m = s.expert_rows[size_t(le)];
    if (!m) continue;
    const size_t i = size_t(le);
    Tensor xb = s.xe.rows(off, m), dxb = dxe.rows(off, m);
    be_.linear_backward(dh.rows(off, m), grads.w2[i], dye.rows(off, m), s.h.rows(off, m), p.w2[i],
                        false);
    if (s.fused) {
      be_.swiglu_packed_backward(dg.rows(off, m), dh.rows(off, m), s.gate.rows(off, m));
      be_.linear_backward(dxb, grads.w13[i], dg.rows(off, m), xb, p.w13[i], false);
      continue;
    }
    be_.swiglu_backward(dg.rows(off, m), du.rows(off, m), dh.rows(off, m), s.gate.rows(off, m),
                        s.up.rows(off, m));
    be_.linear_backward(dxb, grads.w1[i], dg.rows(off, m), xb, p.w1[i], false);
    be_.linear_backward(dxb, grads.w3[i], du.rows(off, m), xb, p.w3[i], true);
  }
  st.expert_rows_bwd = Mr;
  st.expert_cpu_s_bwd = c0 >= 0 ? expert_clock() - c0 : -1;

  // Input gradients back to the tokens' ranks, summed over each token's experts.
  Tensor dxs = dxe;
  if (P > 1) {
    Tensor tmp = grow(sc.tmp, Mr, C, dt_);
    if (Mr) be_.embedding_forward(tmp, dxe, s.inv, 0);
    dxs = grow(sc.send, Ms, C, dt_);  // free again: dys went out above
    a2av(dxs, s.send_rows, tmp, s.recv_rows, st, true);
  }
  if (N) be_.combine_rows(dx, dxs, s.pos, Tensor(), true);

  // Router.
  router_backward(s, dw, aux_grad_scale);
  if (N)
    be_.linear_backward(dx, grads.gate, grow(sc.logits, N, opt_.n_experts, dt_), s.x, p.gate, true);
}

}  // namespace adgt
