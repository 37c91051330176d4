// The mixture-of-experts block (semantics in moe.hpp). Routing runs on the
// backend (moe_route, moe_dispatch_plan, moe_router_backward): softmax,
// top-k, capacity, the send order and the counts are made where the logits
// are. The host reads the device once per layer forward: the plan's counts
// and sums (after the ep group's all-reduce and counts all-to-all), which
// size the exchange and the per-expert GEMMs; the backward reads nothing.
// Token rows move on the backend: the dispatch gathers rows with
// embedding_forward (row indices as tokens), the combine and its backward
// are combine_rows / combine_rows_backward.
//
// Row orders. Send buffer (this rank's kept assignments): by destination rank,
// then the destination's local expert, then token (then choice) order; pos[t,j]
// is the send row of token t's j-th choice (-1: dropped). Receive buffer: by
// source rank, local expert, token. Expert-major buffer (what the experts run
// on): by local expert, source rank, token: xe = recv[perm], recv = xe[inv].
// With one rank the send buffer already is expert-major and no copy is made.
#include "core/model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/check.hpp"
#include "kernels/common/bf16.hpp"

namespace adgt {

struct MoeLayer::Slot {
  int64_t N = 0;
  int64_t reserve = 0;  // recv_reserve(N): the expert rows its buffers are sized for
  bool has_forward = false;
  // Host: the plan's sizes.
  std::vector<int64_t> send_rows, recv_rows;  // (ep) rows exchanged with each rank
  std::vector<int64_t> expert_rows;           // (El) rows each local expert ran on
  // Device.
  Buffer x_b, pos_b, xe_b, gate_b, up_b, h_b, ysend_b, perm_b, inv_b;
  Buffer probs_b, choice_b, weight_b, norm_b, w_b, aux_dp_b;
  Tensor x;                  // (N, C) input copy (router backward)
  Backend::MoeRouting route;  // probs, choice, weight, norm, w (the combine's weights)
  Tensor aux_dp;             // (E) F64: d aux / d probs[t, e] (any t)
  Tensor pos;                // (N, k) int32 send rows
  Tensor xe;           // (Mr, C) expert inputs, expert-major
  Tensor gate, up, h;  // (Mr, F) w1 x, w3 x, silu(gate) * up; fused: gate (Mr, 2F), up unused
  bool fused = false;  // the forward ran the fused gate/up (MoeParams::w13)
  Tensor ysend;        // (Ms, C) expert outputs back in send order
  Tensor perm, inv;    // (Mr) int32
  // Replicas: send row i is the plan's row sperm[i]; sinv the inverse (Ms) int32.
  Buffer sperm_b, sinv_b;
  Tensor sperm, sinv;
  MoeStats stats;
};

// Buffers only one call uses at a time (shared by the slots).
struct MoeLayer::Scratch {
  Buffer logits, send_tok, send, recv, ye, tmp, dh, dgate, dup, dw, plan;
  Buffer rows2, sync;  // replicas: send rows in the plan's order; packed weights or gradients
  Buffer runs, runs_all, prior;  // capacity groups spanning ranks: counts, gathered, priors
};

MoeLayer::MoeLayer(Backend& be, DType dt, int64_t max_tokens, int64_t C, int64_t F, MoeOptions o,
                   std::vector<int> placement, Comm* ep, Comm* aux_group)
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
      aux_(aux_group && aux_group->size() > 1 ? aux_group : nullptr),
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
  // Each expert's place in the send order: its owner, then its local index.
  std::vector<int32_t>& slot = slot_host_;
  slot.resize(static_cast<size_t>(E_));
  for (int64_t e = 0; e < E_; ++e)
    slot[size_t(e)] = int32_t(place_.owner(e) * place_.per_rank() + place_.local_index(e));
  slot_ = Buffer(be_, size_t(E_) * 4);
  be_.to_device(slot_.data(), slot.data(), slot.size() * 4);
  set_replicas(ExpertReplicas());
  bias_dev_ = Buffer(be_, size_t(E_) * 8);
  bias_dirty_ = true;
}

MoeLayer::~MoeLayer() = default;

int MoeLayer::add_slot() {
  slots_.push_back(std::make_unique<Slot>());
  return int(slots_.size()) - 1;
}

int MoeLayer::num_slots() const { return int(slots_.size()); }

const std::vector<int64_t>& MoeLayer::local_experts() const {
  return place_.local_experts(ep_->rank());
}
int MoeLayer::ep_rank() const { return ep_->rank(); }

const MoeStats& MoeLayer::stats(int slot) const {
  ADGT_CHECK(slot >= 0 && slot < num_slots(),
             "moe: slot " << slot << " does not exist (" << num_slots() << " slots)");
  return slots_[size_t(slot)]->stats;
}

const MoeStats& MoeLayer::last_stats() const {
  static const MoeStats none;
  return last_slot_ < 0 ? none : slots_[size_t(last_slot_)]->stats;
}

std::vector<double> zipf_selection_bias(int64_t n_experts, int64_t d_model, double init_std, double s) {
  const double pi = 3.14159265358979323846;
  const double beta = init_std * std::sqrt(double(d_model)) * std::sqrt(6.0) / (pi * double(n_experts));
  std::vector<double> b(size_t(std::max<int64_t>(n_experts, 0)));
  for (size_t e = 0; e < b.size(); ++e) b[e] = -s * beta * std::log(double(e) + 1);
  return b;
}

void MoeLayer::set_bias(std::vector<double> b) {
  ADGT_CHECK(int64_t(b.size()) == E_,
             "moe: set_bias got " << b.size() << " values for " << E_ << " experts");
  bias_ = std::move(b);
  bias_dirty_ = true;
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
  bias_dirty_ = true;
}

void MoeLayer::set_replicas(const ExpertReplicas& r) {
  const int P = place_.ep();
  ADGT_CHECK(r.n_experts() == 0 || (r.n_experts() == E_ && int(r.holders(0).size()) >= 1),
             "moe: replicas for " << r.n_experts() << " experts; the layer has " << E_);
  for (int64_t e = 0; e < r.n_experts(); ++e) {
    ADGT_CHECK(r.holders(e)[0] == place_.owner(e),
               "moe: replicas name ep rank " << r.holders(e)[0] << " as expert " << e
                                             << "'s owner; the layer's placement says "
                                             << place_.owner(e));
    for (int q : r.holders(e))
      ADGT_CHECK(q < P, "moe: replicas put expert " << e << " on ep rank " << q
                                                     << "; the layer's ep group has " << P);
  }
  rep_ = r;
  held_.assign(size_t(P), {});
  hidx_.assign(size_t(P), {});
  for (int q = 0; q < P; ++q) {
    held_[size_t(q)] = place_.local_experts(q);
    if (rep_.any())
      for (int64_t e : rep_.shadows(q)) held_[size_t(q)].push_back(e);
    for (int64_t e : held_[size_t(q)]) {
      size_t j = 0;
      if (rep_.any()) {
        const auto& h = rep_.holders(e);
        j = size_t(std::find(h.begin(), h.end(), q) - h.begin());
      }
      hidx_[size_t(q)].push_back(j);
    }
  }
  const size_t n_sh = rep_.any() ? rep_.shadows(ep_->rank()).size() : 0;
  const size_t block = size_t(3 * F_ * C_);
  shadow_w_ = n_sh ? Buffer(be_, n_sh * block * dtype_size(dt_)) : Buffer();
  shadow_g_ = n_sh ? Buffer(be_, n_sh * block * dtype_size(grad_dtype())) : Buffer();
  if (n_sh) be_.zero(Tensor(shadow_g_.data(), grad_dtype(), {int64_t(n_sh * block)}));
  synced_ = !rep_.any();
}

void MoeLayer::shadow_views(MoeParams& p, const Buffer& b, DType dt, bool fused) const {
  const size_t n_sh = rep_.any() ? rep_.shadows(ep_->rank()).size() : 0;
  const int64_t FC = F_ * C_;
  for (size_t i = 0; i < n_sh; ++i) {
    char* base = static_cast<char*>(b.data()) + i * size_t(3 * FC) * dtype_size(dt);
    p.w1.push_back(Tensor(base, dt, {F_, C_}));
    p.w3.push_back(Tensor(base + size_t(FC) * dtype_size(dt), dt, {F_, C_}));
    p.w2.push_back(Tensor(base + size_t(2 * FC) * dtype_size(dt), dt, {C_, F_}));
    if (fused) p.w13.push_back(Tensor(base, dt, {2 * F_, C_}));
  }
}

MoeParams MoeLayer::with_shadows(const MoeParams& p, bool grads) const {
  MoeParams q = p;
  if (rep_.any())
    shadow_views(q, grads ? shadow_g_ : shadow_w_, grads ? grad_dtype() : dt_, !p.w13.empty());
  return q;
}

MoeLayer::ShadowTraffic MoeLayer::shadow_traffic() const {
  // Shadows are ordered by (owner, expert), so each side's blocks for one
  // peer are adjacent: what an owner sends a holder is, in order, the
  // holder's shadows of that owner's experts.
  const int P = ep_->size(), me = ep_->rank();
  const int64_t block = 3 * F_ * C_;
  ShadowTraffic t;
  for (auto* v : {&t.owned_c, &t.owned_d, &t.shadow_c, &t.shadow_d}) v->assign(size_t(P), 0);
  for (int q = 0; q < P; ++q) {
    t.owned_d[size_t(q)] = t.owned;
    for (int64_t e : rep_.shadows(q))
      if (place_.owner(e) == me) t.owned_c[size_t(q)] += block, t.owned_idx.push_back(place_.local_index(e));
    t.owned += t.owned_c[size_t(q)];
  }
  for (int64_t e : rep_.shadows(me)) {
    const size_t o = size_t(place_.owner(e));
    if (!t.shadow_c[o]) t.shadow_d[o] = t.shadows;
    t.shadow_c[o] += block;
    t.shadows += block;
  }
  return t;
}

void MoeLayer::sync_replicas(const MoeParams& p) {
  if (!rep_.any()) return;
  check_params(p, "params");
  const ShadowTraffic t = shadow_traffic();
  // Owners pack their shadowed experts' w1, w3, w2; holders receive
  // straight into their shadows.
  Tensor send = grow(scratch_->sync, t.owned, 1, dt_);
  int64_t at = 0;
  for (int64_t i : t.owned_idx)
    for (const Tensor* w : {&p.w1[size_t(i)], &p.w3[size_t(i)], &p.w2[size_t(i)]}) {
      be_.copy(Tensor(static_cast<char*>(send.data) + size_t(at) * dtype_size(dt_), dt_, {w->numel()}),
               Tensor(w->data, dt_, {w->numel()}));
      at += w->numel();
    }
  Tensor recv = t.shadows ? Tensor(shadow_w_.data(), dt_, {t.shadows}) : grow(scratch_->rows2, 1, 1, dt_);
  ep_->all_to_allv(recv, t.shadow_c, t.shadow_d, send, t.owned_c, t.owned_d);
  synced_ = true;
}

void MoeLayer::return_shadow_grads(const MoeParams& grads) {
  const DType g = grad_dtype();
  const ShadowTraffic t = shadow_traffic();
  // The sync's traffic reversed: holders send their shadows' gradients,
  // owners add them in the order they packed the weights.
  Tensor send = t.shadows ? Tensor(shadow_g_.data(), g, {t.shadows}) : grow(scratch_->rows2, 1, 1, g);
  Tensor recv = grow(scratch_->sync, t.owned, 1, g);
  ep_->all_to_allv(recv, t.owned_c, t.owned_d, send, t.shadow_c, t.shadow_d);
  int64_t at = 0;
  for (int64_t i : t.owned_idx)
    for (const Tensor* w : {&grads.w1[size_t(i)], &grads.w3[size_t(i)], &grads.w2[size_t(i)]}) {
      be_.add_inplace(Tensor(w->data, g, {w->numel()}),
                      Tensor(static_cast<char*>(recv.data) + size_t(at) * dtype_size(g), g, {w->numel()}));
      at += w->numel();
    }
  if (t.shadows) be_.zero(Tensor(shadow_g_.data(), g, {t.shadows}));  // they accumulate again from here
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

Tensor MoeLayer::grow(Buffer& b, int64_t rows, int64_t cols, DType dt, int64_t reserve_rows) {
  // At least one row, so a buffer is never null (all_to_allv needs in != out).
  const size_t need = size_t(std::max<int64_t>({rows, reserve_rows, 1}) * std::max<int64_t>(cols, 1)) *
                      dtype_size(dt);
  if (b.bytes() < need) {
    const bool beyond = b.bytes() > 0 && rows > reserve_rows;  // a routing past the reserve, again
    b = Buffer();  // the old one first: never both at once
    b = Buffer(be_, beyond ? need + need / 4 : need);
  }
  return Tensor(b.data(), dt, {rows, cols});
}

// The expert rows this rank's buffers are sized for (moe_recv_reserve; the
// memory estimate counts the same); with replicas, or capacity groups that
// span context-parallel ranks, the uniform routing's N k.
int64_t MoeLayer::recv_reserve(int64_t N) const {
  if (rep_.any() || (split_.group && split_.group->size() > 1)) return N * k_;
  return moe_recv_reserve(opt_.capacity_factor, opt_.capacity_segment, N, k_, E_, ep_->size(),
                          int64_t(held_[size_t(ep_->rank())].size()));
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

void MoeLayer::set_sequence_split(MoeSequenceSplit s) {
  if (s.group && s.group->size() > 1) {
    ADGT_CHECK(!s.positions.empty() && s.seq_len >= int64_t(s.positions.size()),
               "moe: sequence split of " << s.positions.size() << " local tokens of " << s.seq_len);
    moe_capacity_runs(s, opt_.capacity_segment, int64_t(s.positions.size()));  // checks positions
  }
  split_ = std::move(s);
  split_runs_n_ = -1;
}

Backend::MoeCapacity MoeLayer::capacity(const Tensor& choice, int64_t N) {
  Backend::MoeCapacity cap{.factor = opt_.capacity_factor, .segment = opt_.capacity_segment};
  if (opt_.capacity_factor <= 0 || !split_.group || split_.group->size() <= 1) return cap;
  if (split_runs_n_ != N) {  // the positions' checks once, not every forward
    split_runs_ = moe_capacity_runs(split_, opt_.capacity_segment, N);
    split_runs_n_ = N;
  }
  const MoeCapacityRuns& runs = split_runs_;
  if (!runs.spans) return cap;
  // Every rank's runs: [start in the micro-batch, count per expert], gathered.
  Scratch& sc = *scratch_;
  const int64_t E = E_, R = N / runs.run, P = split_.group->size();
  std::vector<int32_t> ch(size_t(N * k_));
  if (N) be_.to_host(ch.data(), choice.data, ch.size() * 4);
  const std::vector<int64_t> counts = moe_run_counts(ch.data(), N, k_, E, runs.run);
  const std::vector<int64_t> starts = moe_run_starts(split_, runs.run, N);
  std::vector<double> mine(size_t(R * (E + 1)));
  for (int64_t i = 0; i < R; ++i) {
    mine[size_t(i * (E + 1))] = double(starts[size_t(i)]);
    for (int64_t e = 0; e < E; ++e) mine[size_t(i * (E + 1) + 1 + e)] = double(counts[size_t(i * E + e)]);
  }
  Tensor t = grow(sc.runs, R * (E + 1), 1, DType::F64);
  Tensor all = grow(sc.runs_all, P * R * (E + 1), 1, DType::F64);
  if (!mine.empty()) be_.to_device(t.data, mine.data(), mine.size() * 8);
  split_.group->all_gather(all, t);
  std::vector<double> host(size_t(P * R * (E + 1)));
  if (!host.empty()) be_.to_host(host.data(), all.data, host.size() * 8);
  const std::vector<int32_t> prior =
      moe_run_priors(host, split_.group->rank(), int(P), R, E, runs.group_rows);
  cap.segment = runs.run;
  cap.group_rows = runs.group_rows;
  cap.prior = grow(sc.prior, R, E, DType::I32);
  upload_i32(cap.prior, prior);
  return cap;
}

MoeLayer::RoutePlan MoeLayer::route_forward(Slot& s, const Tensor& x, const MoeParams& p) {
  Scratch& sc = *scratch_;
  const int64_t N = s.N, C = C_, E = E_, k = k_;
  const int P = ep_->size();
  const bool rep = rep_.any();
  MoeStats& st = s.stats;
  RoutePlan rp;
  s.x = grow(s.x_b, N, C, dt_);
  Tensor logits = grow(sc.logits, N, E, dt_);
  const DType rt = dt_ == DType::F64 ? DType::F64 : DType::F32;
  s.route = {grow(s.probs_b, N, E, rt), grow(s.choice_b, N, k, DType::I32),
             grow(s.weight_b, N, k, rt), grow(s.norm_b, N, 1, rt), grow(s.w_b, N, k, dt_)};
  s.pos = grow(s.pos_b, N, k, DType::I32);
  rp.tok = grow(sc.send_tok, N * k, 1, DType::I32);
  // The plan buffer: this rank's stats (3E + 2: routed, prob sums, N,
  // dropped, kept per send slot), the ep group's sums of the first 2E + 2,
  // the counts received for this rank's experts (E; replicas: every rank's
  // kept counts, P x E) and, with an aux group, its sums of the first 2E + 2
  // (the aux loss's token set); read at once.
  const int64_t L = 3 * E + 2, G = 2 * E + 2, R = rep ? P * E : E, A = aux_ ? G : 0;
  Tensor plan = grow(sc.plan, L + G + R + A, 1, DType::F64);
  auto part = [&](int64_t off, int64_t n) {
    return Tensor(static_cast<double*>(plan.data) + off, DType::F64, {n});
  };
  const Tensor local = part(0, L), group = part(L, G), rcv = part(L + G, R),
               aux = part(L + G + R, A);
  if (opt_.aux_free && bias_dirty_) {
    be_.to_device(bias_dev_.data(), bias_.data(), bias_.size() * 8);
    bias_dirty_ = false;
  }
  if (N) {
    be_.copy(s.x, x);
    be_.linear_forward(logits, s.x, p.gate);
    be_.moe_route(s.route, logits,
                  opt_.aux_free ? Tensor(bias_dev_.data(), DType::F64, {E}) : Tensor());
  }
  be_.moe_dispatch_plan(s.pos, rp.tok, local, s.route.choice, s.route.probs,
                        Tensor(slot_.data(), DType::I32, {E}), capacity(s.route.choice, N));
  rp.host.resize(size_t(P > 1 || aux_ ? L + G + R + A : L));
  if (aux_) {
    be_.copy(aux, part(0, G));
    aux_->all_reduce(aux);
  }
  if (P > 1) {
    be_.copy(group, part(0, G));
    ep_->all_reduce(group);
    const int64_t b0 = ep_->stats().bytes;
    const double t0 = ep_->stats().seconds;
    if (rep)
      ep_->all_gather(rcv, part(2 * E + 2, E));  // every rank's kept counts per slot
    else
      ep_->all_to_all(rcv, part(2 * E + 2, E));  // chunk d: rank d's experts' counts
    st.a2a_bytes += ep_->stats().bytes - b0;
    st.a2a_seconds += ep_->stats().seconds - t0;
  }
  be_.to_host(rp.host.data(), plan.data, rp.host.size() * 8);  // the layer's one host read
  rp.lr = rp.host.data();
  rp.red = P > 1 ? rp.host.data() + L : rp.lr;
  rp.rc = P > 1 ? rp.host.data() + L + G : rp.lr + 2 * E + 2;
  rp.ar = aux_ ? rp.host.data() + L + G + R : rp.lr;
  return rp;
}

void MoeLayer::load_and_aux_loss(Slot& s, const RoutePlan& rp) {
  const int64_t E = E_, k = k_;
  MoeStats& st = s.stats;
  const double *lr = rp.lr, *red = rp.red;
  st.dropped_local = int64_t(std::llround(lr[2 * E + 1]));
  st.tokens = int64_t(std::llround(red[2 * E]));
  st.dropped = int64_t(std::llround(red[2 * E + 1]));
  st.load.assign(size_t(E), 0);
  std::vector<double> aux_dp(size_t(E), 0.0);
  int64_t max_load = 0, sum_load = 0;
  // The aux loss over the ep group's tokens, or over this rank's and its aux
  // group's (aux_over_ep_group false).
  const double* ar = opt_.aux_over_ep_group ? red : rp.ar;
  const double n_aux = ar[2 * E];
  for (int64_t e = 0; e < E; ++e) {
    st.load[size_t(e)] = int64_t(std::llround(red[e]));
    max_load = std::max(max_load, st.load[size_t(e)]);
    sum_load += st.load[size_t(e)];
    if (n_aux > 0) {
      const double f = ar[e] / (n_aux * double(k)), pe = ar[E + e] / n_aux;
      st.aux_loss += double(E) * f * pe;
      aux_dp[size_t(e)] = double(E) * f / n_aux;
    }
  }
  st.imbalance = sum_load ? double(max_load) * double(E) / double(sum_load) : 0.0;
  s.aux_dp = grow(s.aux_dp_b, E, 1, DType::F64);
  be_.to_device(s.aux_dp.data, aux_dp.data(), aux_dp.size() * 8);
}

void MoeLayer::replica_rows(Slot& s, const RoutePlan& rp, std::vector<int64_t>& rcounts) {
  const int64_t E = E_;
  const int P = ep_->size(), me = ep_->rank();
  const int64_t El = int64_t(held_[size_t(me)].size());
  // kept(src, e): source src's kept rows of expert e; the plan's row of
  // this rank's first row of e; then the send order by (destination, its
  // held experts), each holder taking its split of e's rows.
  auto kept = [&](int src, int64_t e) {
    return int64_t(std::llround(rp.rc[src * E + slot_host_[size_t(e)]]));
  };
  std::vector<int64_t> first(static_cast<size_t>(E)), at_slot(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) at_slot[size_t(slot_host_[size_t(e)])] = e;
  for (int64_t q = 0, row = 0; q < E; ++q) {
    first[size_t(at_slot[size_t(q)])] = row;
    row += kept(me, at_slot[size_t(q)]);
  }
  std::vector<int32_t> sperm;
  for (int d = 0; d < P; ++d)
    for (size_t i = 0; i < held_[size_t(d)].size(); ++i) {
      const int64_t e = held_[size_t(d)][i];
      int64_t b = 0, en = 0;
      rep_.split(e, hidx_[size_t(d)][i], kept(me, e), b, en);
      for (int64_t q = b; q < en; ++q) sperm.push_back(int32_t(first[size_t(e)] + q));
      s.send_rows[size_t(d)] += en - b;
    }
  for (int src = 0; src < P; ++src)
    for (int64_t le = 0; le < El; ++le) {
      const int64_t e = held_[size_t(me)][size_t(le)];
      int64_t b = 0, en = 0;
      rep_.split(e, hidx_[size_t(me)][size_t(le)], kept(src, e), b, en);
      rcounts[size_t(src * El + le)] = en - b;
    }
  std::vector<int32_t> sinv(sperm.size());
  for (size_t i = 0; i < sperm.size(); ++i) sinv[size_t(sperm[i])] = int32_t(i);
  s.sperm = grow(s.sperm_b, int64_t(sperm.size()), 1, DType::I32);
  s.sinv = grow(s.sinv_b, int64_t(sperm.size()), 1, DType::I32);
  upload_i32(s.sperm, sperm);
  upload_i32(s.sinv, sinv);
}

void MoeLayer::plan_rows(Slot& s, const RoutePlan& rp, int64_t& Ms, int64_t& Mr) {
  const int64_t E = E_;
  const int P = ep_->size(), me = ep_->rank();
  const int64_t El = int64_t(held_[size_t(me)].size());
  s.send_rows.assign(size_t(P), 0);
  std::vector<int64_t> rcounts(size_t(P * El));
  if (!rep_.any()) {
    for (int d = 0; d < P; ++d)
      for (int64_t le = 0; le < El; ++le)
        s.send_rows[size_t(d)] += int64_t(std::llround(rp.lr[2 * E + 2 + d * El + le]));
    for (size_t i = 0; i < rcounts.size(); ++i) rcounts[i] = int64_t(std::llround(rp.rc[i]));
  } else {
    replica_rows(s, rp, rcounts);
  }
  Ms = 0;
  for (int d = 0; d < P; ++d) Ms += s.send_rows[size_t(d)];
  s.recv_rows.assign(size_t(P), 0);
  s.expert_rows.assign(size_t(El), 0);
  std::vector<int64_t> roff(size_t(P * El));
  Mr = 0;
  for (int src = 0; src < P; ++src)
    for (int64_t le = 0; le < El; ++le) {
      const int64_t c = rcounts[size_t(src * El + le)];
      roff[size_t(src * El + le)] = Mr;
      Mr += c;
      s.recv_rows[size_t(src)] += c;
      s.expert_rows[size_t(le)] += c;
    }
  s.reserve = recv_reserve(s.N);
  const int64_t res = s.reserve;
  s.perm = grow(s.perm_b, Mr, 1, DType::I32, res);
  s.inv = grow(s.inv_b, Mr, 1, DType::I32, res);
  if (P > 1) {
    std::vector<int32_t> perm(static_cast<size_t>(Mr)), inv(static_cast<size_t>(Mr));
    int64_t i = 0;
    for (int64_t le = 0; le < El; ++le)
      for (int src = 0; src < P; ++src)
        for (int64_t q = 0; q < rcounts[size_t(src * El + le)]; ++q, ++i) {
          perm[size_t(i)] = int32_t(roff[size_t(src * El + le)] + q);
          inv[size_t(perm[size_t(i)])] = int32_t(i);
        }
    upload_i32(s.perm, perm);
    upload_i32(s.inv, inv);
  }
}

void MoeLayer::dispatch_rows(Slot& s, const Tensor& tok, int64_t Ms, int64_t Mr, bool fused) {
  Scratch& sc = *scratch_;
  const int64_t C = C_;
  const int P = ep_->size();
  const int64_t res = s.reserve, sent = s.N * k_;
  s.xe = grow(s.xe_b, Mr, C, dt_, res);
  s.fused = fused;
  s.gate = grow(s.gate_b, Mr, s.fused ? 2 * F_ : F_, dt_, res);
  if (!s.fused) s.up = grow(s.up_b, Mr, F_, dt_, res);
  s.h = grow(s.h_b, Mr, F_, dt_, res);
  s.ysend = grow(s.ysend_b, Ms, C, dt_, sent);
  if (P == 1) {
    if (Ms) be_.embedding_forward(s.xe, s.x, tok, 0);
    return;
  }
  Tensor send = grow(sc.send, Ms, C, dt_, sent), recv = grow(sc.recv, Mr, C, dt_, res);
  if (Ms && rep_.any()) {
    Tensor planned = grow(sc.rows2, Ms, C, dt_, sent);
    be_.embedding_forward(planned, s.x, tok, 0);
    be_.embedding_forward(send, planned, s.sperm, 0);
  } else if (Ms) {
    be_.embedding_forward(send, s.x, tok, 0);
  }
  a2av(recv, s.recv_rows, send, s.send_rows, s.stats, false);
  if (Mr) be_.embedding_forward(s.xe, recv, s.perm, 0);
}

void MoeLayer::set_fp8(Fp8Linears* f, std::vector<int> sites) {
  ADGT_CHECK(!f || int64_t(sites.size()) == 3 * E_,
             "moe: set_fp8 takes 3 sites per expert (" << 3 * E_ << "), got " << sites.size());
  fp8_ = f;
  fp8_sites_ = f ? std::move(sites) : std::vector<int>{};
}

int MoeLayer::fp8_site(int64_t le, int proj) const {
  if (!fp8_) return -1;
  const int64_t e = held_[size_t(ep_->rank())][size_t(le)];
  return fp8_sites_[size_t(e * 3 + proj)];
}

void MoeLayer::expert_forward(int64_t le, int proj, Tensor y, const Tensor& x, const Tensor& w) {
  const int site = fp8_site(le, proj);
  if (site >= 0)
    fp8_->forward(site, y, x, w);
  else
    be_.linear_forward(y, x, w);
}

void MoeLayer::expert_backward(int64_t le, int proj, Tensor dx, Tensor dw, const Tensor& dy,
                               const Tensor& x, const Tensor& w, bool accumulate_dx) {
  const int site = fp8_site(le, proj);
  if (site >= 0)
    fp8_->backward(site, dx, dw, dy, x, w, accumulate_dx);
  else
    be_.linear_backward(dx, dw, dy, x, w, accumulate_dx);
}

Tensor MoeLayer::run_experts(Slot& s, const MoeParams& full, int64_t Mr) {
  MoeStats& st = s.stats;
  const int64_t El = int64_t(s.expert_rows.size());
  Tensor ye = ep_->size() == 1 ? s.ysend : grow(scratch_->ye, Mr, C_, dt_, s.reserve);
  const int span = be_.span_begin();
  for (int64_t le = 0, off = 0; le < El; off += s.expert_rows[size_t(le)], ++le) {
    const int64_t m = s.expert_rows[size_t(le)];
    if (!m) continue;
    Tensor xb = s.xe.rows(off, m), gb = s.gate.rows(off, m), hb = s.h.rows(off, m);
    if (s.fused) {
      expert_forward(le, 0, gb, xb, full.w13[size_t(le)]);
      be_.swiglu_packed_forward(hb, gb);
    } else {
      Tensor ub = s.up.rows(off, m);
      expert_forward(le, 0, gb, xb, full.w1[size_t(le)]);
      expert_forward(le, 1, ub, xb, full.w3[size_t(le)]);
      be_.swiglu_forward(hb, gb, ub);
    }
    expert_forward(le, 2, ye.rows(off, m), hb, full.w2[size_t(le)]);
  }
  st.expert_rows = Mr;
  for (int64_t le = place_.per_rank(); le < El; ++le) st.shadow_rows += s.expert_rows[size_t(le)];
  be_.span_end(span);
  st.expert_span = span;
  return ye;
}

void MoeLayer::return_rows(Slot& s, const Tensor& ye, int64_t Ms, int64_t Mr) {
  if (ep_->size() == 1) return;
  Scratch& sc = *scratch_;
  Tensor tmp = grow(sc.tmp, Mr, C_, dt_, s.reserve);
  if (Mr) be_.embedding_forward(tmp, ye, s.inv, 0);
  if (rep_.any()) {
    Tensor back = grow(sc.rows2, Ms, C_, dt_, s.N * k_);
    a2av(back, s.send_rows, tmp, s.recv_rows, s.stats, false);
    if (Ms) be_.embedding_forward(s.ysend, back, s.sinv, 0);
  } else {
    a2av(s.ysend, s.send_rows, tmp, s.recv_rows, s.stats, false);
  }
}

double MoeLayer::forward(int slot, Tensor out, const Tensor& x, const MoeParams& p) {
  ADGT_CHECK(slot >= 0 && slot < num_slots(), "moe: forward into slot "
                                                  << slot << ", but the layer has " << num_slots()
                                                  << " slots (add_slot)");
  const int64_t N = x.ndim == 2 ? x.dim(0) : -1, C = C_;
  ADGT_CHECK(x.ndim == 2 && x.dim(1) == C && x.dtype == dt_,
             "moe: input x" << x.shape_str() << " " << dtype_name(x.dtype) << ", expected (N," << C
                            << ") " << dtype_name(dt_));
  ADGT_CHECK(N <= max_tokens_, "moe: " << N << " token rows exceed max_tokens=" << max_tokens_);
  ADGT_CHECK(out.numel() == N * C && out.dtype == dt_,
             "moe: output" << out.shape_str() << ", expected " << x.shape_str());
  check_params(p, "params");
  ADGT_CHECK(synced_, "moe: the layer's expert replicas were set but never synced "
                      "(call sync_replicas after setting them and after every weight update)");
  Slot& s = *slots_[size_t(slot)];
  const bool rep = rep_.any();
  MoeParams with_rep;  // p plus the shadows (replicas only: no copy on the plain path)
  if (rep) with_rep = with_shadows(p, false);
  const MoeParams& full = rep ? with_rep : p;
  s.N = N;
  s.has_forward = false;
  s.stats = MoeStats{};
  last_slot_ = slot;

  // Router: softmax, top-k, capacity and the send order, on the backend;
  // then the load and the aux loss.
  RoutePlan rp = route_forward(s, x, p);
  load_and_aux_loss(s, rp);
  // Rows to and from each rank; receive and expert-major orders.
  int64_t Ms = 0, Mr = 0;
  plan_rows(s, rp, Ms, Mr);
  const Tensor tok(rp.tok.data, DType::I32, {Ms});
  dispatch_rows(s, tok, Ms, Mr, !p.w13.empty());
  const Tensor ye = run_experts(s, full, Mr);
  // Results back, combined into each token's row.
  return_rows(s, ye, Ms, Mr);
  if (N) be_.combine_rows(out, s.ysend, s.pos, s.route.w, false);
  s.has_forward = true;
  return s.stats.aux_loss;
}

void MoeLayer::backward(int slot, Tensor dx, const MoeParams& p, const MoeParams& grads,
                        const Tensor& dout, double aux_grad_scale, bool return_shadows) {
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
  const int P = ep_->size(), me = ep_->rank();
  const bool rep = rep_.any();
  MoeParams p_rep, g_rep;  // with the shadows (replicas only)
  if (rep) p_rep = with_shadows(p, false), g_rep = with_shadows(grads, true);
  const MoeParams& fp = rep ? p_rep : p;
  const MoeParams& fg = rep ? g_rep : grads;
  const int64_t El = int64_t(held_[size_t(me)].size());
  MoeStats& st = s.stats;
  st.a2a_bytes_bwd = 0;
  st.a2a_seconds_bwd = 0;
  int64_t Ms = 0, Mr = 0;
  for (int i = 0; i < P; ++i) Ms += s.send_rows[size_t(i)], Mr += s.recv_rows[size_t(i)];

  // Combine: dy rows (send order) and d(weights).
  const int64_t res = s.reserve, sent = N * k;
  Tensor dys = grow(sc.send, Ms, C, dt_, sent), dwt = grow(sc.dw, N, k, grad_dtype());
  if (N) be_.combine_rows_backward(dys, dwt, dout, s.ysend, s.pos, s.route.w);

  // Output gradients to the experts.
  Tensor dye = dys;
  if (P > 1) {
    Tensor recv = grow(sc.recv, Mr, C, dt_, res);
    if (rep) {
      Tensor planned = grow(sc.rows2, Ms, C, dt_, sent);
      if (Ms) be_.embedding_forward(planned, dys, s.sperm, 0);
      a2av(recv, s.recv_rows, planned, s.send_rows, st, true);
    } else {
      a2av(recv, s.recv_rows, dys, s.send_rows, st, true);
    }
    dye = grow(sc.ye, Mr, C, dt_, res);
    if (Mr) be_.embedding_forward(dye, recv, s.perm, 0);
  }
  Tensor dxe = grow(sc.recv, Mr, C, dt_, res);  // free again: dye holds the gathered rows
  ADGT_CHECK(s.fused == !p.w13.empty(),
             "moe: the backward was " << (s.fused ? "not " : "") << "given the fused w1/w3 its "
                                      << "forward ran with");
  Tensor dh = grow(sc.dh, Mr, F_, dt_, res), dg = grow(sc.dgate, Mr, s.fused ? 2 * F_ : F_, dt_, res),
         du = s.fused ? Tensor() : grow(sc.dup, Mr, F_, dt_, res);
  const int span = be_.span_begin();
  for (int64_t le = 0, off = 0; le < El; off += s.expert_rows[size_t(le)], ++le) {
    const int64_t m = s.expert_rows[size_t(le)];
    if (!m) continue;
    const size_t i = size_t(le);
    Tensor xb = s.xe.rows(off, m), dxb = dxe.rows(off, m);
    expert_backward(le, 2, dh.rows(off, m), fg.w2[i], dye.rows(off, m), s.h.rows(off, m),
                    fp.w2[i], false);
    if (s.fused) {
      be_.swiglu_packed_backward(dg.rows(off, m), dh.rows(off, m), s.gate.rows(off, m));
      expert_backward(le, 0, dxb, fg.w13[i], dg.rows(off, m), xb, fp.w13[i], false);
      continue;
    }
    be_.swiglu_backward(dg.rows(off, m), du.rows(off, m), dh.rows(off, m), s.gate.rows(off, m),
                        s.up.rows(off, m));
    expert_backward(le, 0, dxb, fg.w1[i], dg.rows(off, m), xb, fp.w1[i], false);
    expert_backward(le, 1, dxb, fg.w3[i], du.rows(off, m), xb, fp.w3[i], true);
  }
  if (rep && return_shadows) return_shadow_grads(grads);
  st.expert_rows_bwd = Mr;
  be_.span_end(span);
  st.expert_span_bwd = span;

  // Input gradients back to the tokens' ranks, summed over each token's experts.
  Tensor dxs = dxe;
  if (P > 1) {
    Tensor tmp = grow(sc.tmp, Mr, C, dt_, res);
    if (Mr) be_.embedding_forward(tmp, dxe, s.inv, 0);
    dxs = grow(sc.send, Ms, C, dt_, sent);  // free again: dys went out above
    if (rep) {
      Tensor back = grow(sc.rows2, Ms, C, dt_, sent);
      a2av(back, s.send_rows, tmp, s.recv_rows, st, true);
      if (Ms) be_.embedding_forward(dxs, back, s.sinv, 0);
    } else {
      a2av(dxs, s.send_rows, tmp, s.recv_rows, st, true);
    }
  }
  if (N) be_.combine_rows(dx, dxs, s.pos, Tensor(), true);

  // Router: dL/dlogits through the renormalised top-k weights (w_j = p_j /
  // S) and the aux loss (f constant), then the softmax; on the backend.
  if (N) {
    Tensor dlogits = grow(sc.logits, N, opt_.n_experts, dt_);
    be_.moe_router_backward(dlogits, s.route, dwt, s.aux_dp,
                            opt_.aux_loss_coef * aux_grad_scale);
    be_.linear_backward(dx, grads.gate, dlogits, s.x, p.gate, true);
  }
}

}  // namespace adgt
