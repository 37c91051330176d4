// The op lists of one rank's micro-batch (work.hpp), mirroring
// core/model/model_forward_backward.cpp.
#include "parallel/sim/work.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "core/model/moe_capacity.hpp"
#include "core/model/stage_map.hpp"
#include "parallel/cp/chunks.hpp"
#include "parallel/cost/stages.hpp"

namespace adgt::sim {
namespace {

using cluster::Collective;

struct Dims {
  int64_t B, T, N, Ns, C, Hl, KVl, hd, Fl, Vl, E, El, Fel, k;
  int b;
  int64_t tp, ep;
  // Context parallelism: T is the rank's seq_len / cp tokens of a sequence;
  // ring (cp_mode ring) or all-to-all around the attention.
  int64_t cp = 1;
  bool ring = false;
  bool sp;
  bool unfused = false, dropout = false;
  bool fused = true;  // train.fused_projections: one q/k/v and one gate/up GEMM
  // train.dtype fp8: the layers' and experts' linears on FP8 operands (not
  // the head, router): 1; 2 with the weights cast at each use
  // (train.fp8_weight_cache off, or auto at ZeRO-3 with resharding).
  int fp8 = 0;
  bool fp8_gather = false;  // parallel.fp8_allgather: ln1 and a dense ln2 gathered as FP8 codes
  // Capacity groups spanning cp's chunks (core/model/moe_capacity.hpp): the
  // rank's runs, whose counts each MoE forward all-gathers over cp; 0: none.
  int64_t cap_runs = 0;
  std::vector<int64_t> expert_t;  // tokens of each expert of the busiest ep rank
  double a2a_tokens = 0;          // rows an ep rank sends or receives at most (dispatch)
};

// Context parallelism's ring (parallel/cp/ring_attention.hpp), block by
// block as it runs: step 0 the rank's own two chunks (c = T / 2 tokens
// each): two causal diagonal blocks and one full block, the second block of
// the later query chunk merged in; every other of the cp - 1 steps two full
// c x c blocks merged into the running output; each step's K/V hop (both
// chunks) travels beside that step's blocks. The backward's transfers each
// travel while the receiver computes: the first K/V hop behind the own full
// block, in step s the next K/V (s < cp - 1) and the accumulator of step
// s - 1 (s >= 2) behind the step's blocks, and the last accumulator's way
// home behind the own two causal blocks.
std::vector<Op> ring_step(const Dims& d, bool backward) {
  const int64_t c = d.T / 2;
  const OpKind k = backward ? OpKind::AttentionBlockBackward : OpKind::AttentionBlockForward;
  const Op block{k, d.B, c, d.Hl, d.KVl, d.hd};
  // Forward: each block merged into the running output; backward: each
  // block's dK, dV added to the travelling accumulator.
  const Op add{OpKind::Add, d.B * c * (backward ? 2 * d.KVl : d.Hl) * d.hd};
  return {block, add, block, add};
}
void ring_core(Piece& p, const Dims& d, bool backward) {
  const int64_t c = d.T / 2;
  const OpKind bk = backward ? OpKind::AttentionBlockBackward : OpKind::AttentionBlockForward;
  const Op full{bk, d.B, c, d.Hl, d.KVl, d.hd};
  Op causal = full;
  causal.causal = true;
  // Forward step 0: q0 x k0 and q1 x k1 causal, q1 x k0 full, one merge;
  // backward: the full block first (its dK/dV kept), the causal two last,
  // each block's dK, dV added to the own accumulator.
  const Op merge{OpKind::Add, d.B * c * d.Hl * d.hd};
  const Op acc{OpKind::Add, d.B * c * 2 * d.KVl * d.hd};
  const std::vector<Op> own = backward ? std::vector<Op>{full, acc}
                                       : std::vector<Op>{causal, full, causal, merge};
  const std::vector<Op> own_last = {causal, acc, causal, acc};
  p.ops.insert(p.ops.end(), own.begin(), own.end());
  const std::vector<Op> step = ring_step(d, backward);
  for (int64_t s = 1; s < d.cp; ++s) p.ops.insert(p.ops.end(), step.begin(), step.end());
  const double kv = 2.0 * double(d.B * d.T * d.KVl * d.hd) * d.b;  // K and V, both chunks
  auto hop = [&](double bytes, int64_t repeat, std::vector<Op> hide) {
    CommOp h{Collective::RingShift, Group::cp, bytes};
    h.repeat = repeat;
    h.hide = std::move(hide);
    if (repeat > 0) p.comms.push_back(std::move(h));
  };
  if (!backward) {
    hop(kv, 1, own);           // step 0's hop beside the own blocks
    hop(kv, d.cp - 2, step);  // steps 1 .. cp - 2
    return;
  }
  p.ops.insert(p.ops.end(), own_last.begin(), own_last.end());
  hop(kv, 1, own);  // step 0
  if (d.cp >= 3) {
    hop(kv, 2, step);               // steps 1 and cp - 1: one transfer each
    hop(2 * kv, d.cp - 3, step);    // steps 2 .. cp - 2: a K/V block and an accumulator
  }
  hop(kv, 1, own_last);  // dK, dV home
}
// All-to-all (parallel/cp/ulysses_context.cpp): q, k, v to (the whole
// sequence, heads / cp), the backend's attention, the output back; the
// backward moves q, k, v, out and dout again and sends dq, dk, dv back.
void all_to_all_core(Piece& p, const Dims& d, bool backward) {
  const double row = double(d.N) * d.hd * d.b;  // one head's rows of the rank's tokens
  const double qkv = row * double(d.Hl + 2 * d.KVl), o = row * double(d.Hl);
  p.comms.push_back({Collective::AllToAll, Group::cp, backward ? qkv + 2 * o : qkv});
  p.ops.push_back({backward ? OpKind::AttentionBackward : OpKind::AttentionForward, d.B,
                   d.T * d.cp, d.Hl / d.cp, d.KVl / d.cp, d.hd});
  p.comms.push_back({Collective::AllToAll, Group::cp, backward ? qkv : o});
}

// The attention core forward: the flash kernel, or (unfused) QK^T, the
// softmax, the attention dropout and PV over the whole (non-causal) T x T.
void core_forward(Piece& p, const Dims& d) {
  if (d.cp > 1) return d.ring ? ring_core(p, d, false) : all_to_all_core(p, d, false);
  if (!d.unfused) {
    p.ops.push_back({OpKind::AttentionForward, d.B, d.T, d.Hl, d.KVl, d.hd});
    return;
  }
  const int64_t bh = d.B * d.Hl;
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.T, d.hd});
  p.ops.push_back({OpKind::Softmax, bh * d.T, d.T});
  if (d.dropout) p.ops.push_back({OpKind::Dropout, bh * d.T * d.T});
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.hd, d.T});
}
void core_backward(Piece& p, const Dims& d) {
  if (d.cp > 1) return d.ring ? ring_core(p, d, true) : all_to_all_core(p, d, true);
  if (!d.unfused) {
    p.ops.push_back({OpKind::AttentionBackward, d.B, d.T, d.Hl, d.KVl, d.hd});
    return;
  }
  const int64_t bh = d.B * d.Hl;
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.hd, d.T});  // dV = P^T dO
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.T, d.hd});  // dP = dO V^T
  if (d.dropout) p.ops.push_back({OpKind::Dropout, bh * d.T * d.T});
  p.ops.push_back({OpKind::SoftmaxBackward, bh * d.T, d.T});
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.hd, d.T});  // dQ = dS K
  p.ops.push_back({OpKind::BatchedGemm, bh, d.T, d.hd, d.T});  // dK = dS^T Q
}

Dims dims_of(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  Dims d{};
  d.B = cfg.train.micro_batch;
  d.cp = std::max<int64_t>(1, p.cp);
  d.ring = d.cp > 1 && p.cp_mode != "all-to-all";
  d.T = m.seq_len / d.cp;
  d.N = d.B * d.T;
  d.tp = p.tp;
  d.ep = p.ep;
  d.sp = p.sequence_parallel && p.tp > 1;
  d.Ns = d.sp ? d.N / p.tp : d.N;
  d.C = m.d_model;
  d.hd = m.head_dim();
  d.Hl = m.n_heads / p.tp;
  d.KVl = m.n_kv_heads / p.tp;
  d.Fl = m.ffn_hidden / p.tp;
  d.Vl = (m.vocab_size + p.tp - 1) / p.tp;
  d.E = m.n_experts;
  d.El = m.n_experts > 0 ? m.n_experts / p.ep : 0;
  d.Fel = m.expert_ffn() / p.tp;
  d.k = m.moe_top_k;
  d.b = compute_bytes(cfg);
  d.fused = cfg.train.fused_projections;
  d.fp8 = cfg.train.dtype != "fp8" ? 0 : fp8_weight_cache_on(cfg) ? 1 : 2;
  d.fp8_gather = d.fp8 && cfg.parallel.fp8_allgather;
  if (d.E > 0 && m.moe_capacity_factor > 0 && d.cp > 1 && d.T % 2 == 0 && d.N > 0) {
    const MoeSequenceSplit split{nullptr, cp::chunk_positions(0, int(d.cp), d.T), m.seq_len, d.T / 2};
    const MoeCapacityRuns runs = moe_capacity_runs(split, m.moe_capacity_segment, d.N);
    if (runs.spans) d.cap_runs = d.N / runs.run;
  }
  return d;
}

Op gemm(OpKind k, int64_t m, int64_t n, int64_t kk) { return Op{k, m, n, kk, 0, 0}; }

// A layer's linear GEMM: on FP8 operands when f8 (core/model/fp8_linear.hpp),
// after the cast of the operand it quantizes: the input (forward, and again
// for the weight gradient) or the output gradient (input gradient). The
// weights' cast, once per step, is not counted; at each use with f8 == 2
// (uncached weight codes: train.fp8_weight_cache) it is, before the
// forward and the input gradient.
void lin(Piece& p, int f8, OpKind k, int64_t m, int64_t n, int64_t kk) {
  Op g = gemm(k, m, n, kk);
  if (f8) {
    g.fp8 = true;
    const int64_t cast = k == OpKind::GemmWeightGrad ? kk * n : m * kk;
    p.ops.push_back({OpKind::Fp8Cast, cast});
    if (f8 == 2 && k != OpKind::GemmWeightGrad) p.ops.push_back({OpKind::Fp8Cast, n * kk});
  }
  p.ops.push_back(g);
}

// The projections into a column-parallel block of `parts` output widths
// (q, k, v; gate, up) from the (rows, C) input: one GEMM of their summed
// width when fused (train.fused_projections, core/model/model.hpp), else
// one per part. Forward, input gradient (summed over the parts) and weight
// gradient.
void proj_forward(Piece& p, const Dims& d, int64_t rows, std::initializer_list<int64_t> parts,
                  int f8 = 0) {
  if (d.fused)
    lin(p, f8, OpKind::GemmForward, rows,
        std::accumulate(parts.begin(), parts.end(), int64_t{0}), d.C);
  else
    for (int64_t w : parts) lin(p, f8, OpKind::GemmForward, rows, w, d.C);
}
void proj_input_grad(Piece& p, const Dims& d, int64_t rows, std::initializer_list<int64_t> parts,
                     int f8 = 0) {
  if (d.fused)
    lin(p, f8, OpKind::GemmInputGrad, rows, d.C,
        std::accumulate(parts.begin(), parts.end(), int64_t{0}));
  else
    for (int64_t w : parts) lin(p, f8, OpKind::GemmInputGrad, rows, d.C, w);
}
void proj_weight_grad(Piece& p, const Dims& d, int64_t rows, std::initializer_list<int64_t> parts,
                      int f8 = 0) {
  if (d.fused)
    lin(p, f8, OpKind::GemmWeightGrad, std::accumulate(parts.begin(), parts.end(), int64_t{0}),
        d.C, rows);
  else
    for (int64_t w : parts) lin(p, f8, OpKind::GemmWeightGrad, w, d.C, rows);
}
// The rotary of q and k (fused: qkv_rope_split / merge over all the heads,
// v's copied: the same bytes as rotating them).
void rope_ops(Piece& p, const Dims& d, OpKind k) {
  if (d.fused) {
    p.ops.push_back({k, d.N, d.Hl + 2 * d.KVl, d.hd});
    return;
  }
  p.ops.push_back({k, d.N, d.Hl, d.hd});
  p.ops.push_back({k, d.N, d.KVl, d.hd});
}

// Tensor-parallel exchange of the activation (N, C) after a row-parallel GEMM
// (forward) or before a column-parallel one's input gradient: an all-reduce,
// or with sequence parallelism a reduce-scatter (the all-gather is gather()).
void reduce_act(Piece& p, const Dims& d) {
  if (d.tp == 1) return;
  const double bytes = double(d.N) * d.C * d.b;
  p.comms.push_back({d.sp ? Collective::ReduceScatter : Collective::AllReduce, Group::tp, bytes});
}
void gather_act(Piece& p, const Dims& d) {
  if (d.tp == 1 || !d.sp) return;
  p.comms.push_back({Collective::AllGather, Group::tp, double(d.N) * d.C * d.b});
}
// The gather of an FP8 GEMM's input (ln1; a dense layer's ln2): with
// parallel.fp8_allgather one byte an element, after the cast of the local
// rows and before the gathered codes' dequantization into the bf16 input
// the GEMMs read as before (core/model/fp8_linear.hpp). The dequantization
// (a code read, a bf16 written: 3 bytes an element) is priced as the cast
// of half as many elements (6 bytes an element).
void gather_fp8_input(Piece& p, const Dims& d) {
  if (d.tp == 1 || !d.sp) return;
  if (!d.fp8_gather) return gather_act(p, d);
  p.ops.push_back({OpKind::Fp8Cast, d.Ns * d.C});
  p.comms.push_back({Collective::AllGather, Group::tp, double(d.N) * d.C});
  p.ops.push_back({OpKind::Fp8Cast, d.N * d.C / 2});
}

// Attention half of a layer, forward.
void attention_forward(Piece& p, const Dims& d) {
  p.ops.push_back({OpKind::RmsNormForward, d.Ns, d.C});
  gather_fp8_input(p, d);
  proj_forward(p, d, d.N, {d.Hl * d.hd, d.KVl * d.hd, d.KVl * d.hd}, d.fp8);
  rope_ops(p, d, OpKind::RopeForward);
  core_forward(p, d);
  lin(p, d.fp8, OpKind::GemmForward, d.N, d.C, d.Hl * d.hd);
}

void dense_ffn_forward(Piece& p, const Dims& d) {
  p.ops.push_back({OpKind::RmsNormForward, d.Ns, d.C});
  p.ops.push_back({OpKind::Add, d.Ns * d.C});
  gather_fp8_input(p, d);
  proj_forward(p, d, d.N, {d.Fl, d.Fl}, d.fp8);
  p.ops.push_back({OpKind::SwigluForward, d.N, d.Fl});
  lin(p, d.fp8, OpKind::GemmForward, d.N, d.C, d.Fl);
}

// Tokens one local expert runs with uniform routing: N k ep / E.
// The busiest ep rank's experts and token counts under the load model.
void plan_experts(Dims& d, const ModelConfig& m, const ParallelConfig& p, const WorkOptions& o) {
  if (m.n_experts <= 0) return;
  const int64_t E = m.n_experts, ep = p.ep;
  std::vector<double> load = o.expert_load.empty() ? zipf_load(E, 0) : o.expert_load;
  if (int64_t(load.size()) != E)
    throw std::invalid_argument("simulate: the expert load has " + std::to_string(load.size()) +
                                " entries but model.n_experts=" + std::to_string(E));
  double sum = 0;
  for (double x : load) sum += x;
  for (double& x : load) x /= sum;
  std::vector<double> rank_load(size_t(ep), 0);
  auto owner = [&](int64_t e) {
    return p.expert_placement.empty() ? e / (E / ep) : p.expert_placement[size_t(e)];
  };
  for (int64_t e = 0; e < E; ++e) rank_load[size_t(owner(e))] += load[size_t(e)];
  const int64_t busiest =
      std::max_element(rank_load.begin(), rank_load.end()) - rank_load.begin();
  const double routed = double(d.N) * double(d.k) * double(ep);  // the ep group's assignments
  for (int64_t e = 0; e < E; ++e)
    if (owner(e) == busiest)
      d.expert_t.push_back(std::max<int64_t>(1, std::llround(routed * load[size_t(e)])));
  d.a2a_tokens = std::max(double(d.N) * double(d.k), routed * rank_load[size_t(busiest)]);
}

void moe_ffn_forward(Piece& p, const Dims& d) {
  p.ops.push_back({OpKind::RmsNormForward, d.Ns, d.C});
  p.ops.push_back({OpKind::Add, d.Ns * d.C});
  gather_act(p, d);
  p.ops.push_back(gemm(OpKind::GemmForward, d.N, d.E, d.C));  // router
  // Under cp the aux loss's counts and sums over the cp group (MoeLayer's aux group).
  if (d.cp > 1) p.comms.push_back({Collective::AllReduce, Group::cp, double(2 * d.E + 2) * 8});
  // A capacity whose groups span the chunks: every rank's runs' [start,
  // counts] (f64), gathered over cp before the plan.
  if (d.cap_runs)
    p.comms.push_back({Collective::AllGather, Group::cp, double(d.cp * d.cap_runs * (d.E + 1)) * 8});
  const double a2a = d.a2a_tokens * d.C * d.b;
  if (d.ep > 1) p.comms.push_back({Collective::AllToAll, Group::ep, a2a});
  for (const int64_t t : d.expert_t) {
    proj_forward(p, d, t, {d.Fel, d.Fel}, d.fp8);
    p.ops.push_back({OpKind::SwigluForward, t, d.Fel});
    lin(p, d.fp8, OpKind::GemmForward, t, d.C, d.Fel);
  }
  if (d.ep > 1) p.comms.push_back({Collective::AllToAll, Group::ep, a2a});
  p.ops.push_back({OpKind::Add, d.N * d.k * d.C});  // the weighted combine
}

// A whole layer's forward as pieces (attention, FFN), each with its exchange.
void layer_forward(PassWork& w, const ModelConfig& m, int64_t l, const Dims& d) {
  Piece a;
  attention_forward(a, d);
  reduce_act(a, d);
  if (d.dropout) a.ops.push_back({OpKind::Dropout, d.Ns * d.C});
  w.pieces.push_back(std::move(a));
  Piece f;
  if (m.is_moe_layer(l))
    moe_ffn_forward(f, d);
  else
    dense_ffn_forward(f, d);
  reduce_act(f, d);
  if (d.dropout) f.ops.push_back({OpKind::Dropout, d.Ns * d.C});
  f.ops.push_back({OpKind::Add, d.Ns * d.C});
  w.pieces.push_back(std::move(f));
}

// Input gradient of a layer (reverse order), with the recompute it needs.
void layer_input_grad(PassWork& w, const ModelConfig& m, int64_t l, const Dims& d,
                      bool full_rc, bool selective_rc, bool fused_weight) {
  if (full_rc) layer_forward(w, m, l, d);
  Piece f;
  const bool moe = m.is_moe_layer(l);
  if (d.dropout) f.ops.push_back({OpKind::Dropout, d.Ns * d.C});
  gather_act(f, d);  // the gradient of the reduce-scatter
  if (moe) {
    const double a2a = d.a2a_tokens * d.C * d.b;
    if (d.ep > 1) f.comms.push_back({Collective::AllToAll, Group::ep, a2a});
    for (const int64_t t : d.expert_t) {
      if (selective_rc && !full_rc) f.ops.push_back({OpKind::SwigluForward, t, d.Fel});
      lin(f, d.fp8, OpKind::GemmInputGrad, t, d.Fel, d.C);
      f.ops.push_back({OpKind::SwigluBackward, t, d.Fel});
      proj_input_grad(f, d, t, {d.Fel, d.Fel}, d.fp8);
      if (fused_weight) {
        lin(f, d.fp8, OpKind::GemmWeightGrad, d.C, d.Fel, t);
        proj_weight_grad(f, d, t, {d.Fel, d.Fel}, d.fp8);
      }
    }
    if (d.ep > 1) f.comms.push_back({Collective::AllToAll, Group::ep, a2a});
    f.ops.push_back(gemm(OpKind::GemmInputGrad, d.N, d.C, d.E));
    if (fused_weight) f.ops.push_back(gemm(OpKind::GemmWeightGrad, d.E, d.C, d.N));
  } else {
    if (selective_rc && !full_rc) f.ops.push_back({OpKind::SwigluForward, d.N, d.Fl});
    lin(f, d.fp8, OpKind::GemmInputGrad, d.N, d.Fl, d.C);
    f.ops.push_back({OpKind::SwigluBackward, d.N, d.Fl});
    proj_input_grad(f, d, d.N, {d.Fl, d.Fl}, d.fp8);
    if (fused_weight) {
      lin(f, d.fp8, OpKind::GemmWeightGrad, d.C, d.Fl, d.N);
      proj_weight_grad(f, d, d.N, {d.Fl, d.Fl}, d.fp8);
    }
  }
  f.ops.push_back({OpKind::RmsNormBackward, d.Ns, d.C});
  reduce_act(f, d);
  w.pieces.push_back(std::move(f));

  Piece a;
  if (d.dropout) a.ops.push_back({OpKind::Dropout, d.Ns * d.C});
  gather_act(a, d);
  lin(a, d.fp8, OpKind::GemmInputGrad, d.N, d.Hl * d.hd, d.C);
  if (fused_weight) lin(a, d.fp8, OpKind::GemmWeightGrad, d.C, d.Hl * d.hd, d.N);
  if (selective_rc && !full_rc) core_forward(a, d);
  core_backward(a, d);
  rope_ops(a, d, OpKind::RopeBackward);
  proj_input_grad(a, d, d.N, {d.Hl * d.hd, d.KVl * d.hd, d.KVl * d.hd}, d.fp8);
  if (fused_weight)
    proj_weight_grad(a, d, d.N, {d.Hl * d.hd, d.KVl * d.hd, d.KVl * d.hd}, d.fp8);
  a.ops.push_back({OpKind::RmsNormBackward, d.Ns, d.C});
  reduce_act(a, d);
  a.ops.push_back({OpKind::Add, d.Ns * d.C});
  if (fused_weight) a.grads_done_layer = l;
  w.pieces.push_back(std::move(a));
}

void layer_weight_grad(PassWork& w, const ModelConfig& m, int64_t l, const Dims& d) {
  Piece p;
  if (m.is_moe_layer(l)) {
    for (const int64_t t : d.expert_t) {
      lin(p, d.fp8, OpKind::GemmWeightGrad, d.C, d.Fel, t);
      proj_weight_grad(p, d, t, {d.Fel, d.Fel}, d.fp8);
    }
    p.ops.push_back(gemm(OpKind::GemmWeightGrad, d.E, d.C, d.N));
  } else {
    lin(p, d.fp8, OpKind::GemmWeightGrad, d.C, d.Fl, d.N);
    proj_weight_grad(p, d, d.N, {d.Fl, d.Fl}, d.fp8);
  }
  lin(p, d.fp8, OpKind::GemmWeightGrad, d.C, d.Hl * d.hd, d.N);
  proj_weight_grad(p, d, d.N, {d.Hl * d.hd, d.KVl * d.hd, d.KVl * d.hd}, d.fp8);
  p.grads_done_layer = l;
  w.pieces.push_back(std::move(p));
}

// Local parameters of a layer: (non-expert, expert) elements.
std::pair<double, double> layer_params(const ModelConfig& m, int64_t l, const Dims& d) {
  double dense = double(d.C) * (d.Hl + 2 * d.KVl) * d.hd + double(d.Hl) * d.hd * d.C + 2.0 * d.C;
  double expert = 0;
  if (m.is_moe_layer(l)) {
    dense += double(d.E) * d.C;
    expert = double(d.expert_t.size()) * 3.0 * d.C * d.Fel;
  } else {
    dense += 3.0 * d.C * d.Fl;
  }
  return {dense, expert};
}

}  // namespace

std::vector<double> zipf_load(int64_t n, double s) {
  std::vector<double> l(size_t(std::max<int64_t>(n, 0)));
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += l[size_t(e)] = std::pow(double(e + 1), -s);
  for (double& x : l) x /= sum;
  return l;
}

double rank_step_compute(const RunConfig& cfg, int pp_rank, OpCosts& costs, const WorkOptions& opts) {
  const int bytes = compute_bytes(cfg);
  auto ops_time = [&](const std::vector<Op>& ops) {
    double t = 0;
    for (const Op& op : ops) t += costs.seconds(op, bytes);
    return t;
  };
  auto pass_time = [&](const PassWork& w) {
    double t = 0;
    for (const Piece& p : w.pieces) t += ops_time(p.ops);
    return t;
  };
  const RankWork rw = rank_work(cfg, pp_rank, opts);
  double per_mb = 0;
  for (const StageWork& st : rw.chunks)
    per_mb += pass_time(st.forward) +
              std::min(pass_time(st.backward), pass_time(st.input_grad) + pass_time(st.weight_grad));
  return double(cfg.accum_steps()) * per_mb + ops_time(rw.optimizer);
}

int compute_bytes(const RunConfig& cfg) {
  if (bf16_compute(cfg.train)) return 2;
  if (cfg.train.dtype == "f64") return 8;
  return 4;
}

namespace {

using GradUnit = std::pair<int64_t, std::pair<double, double>>;  // (layer, (params, expert params))

// The work of model stage s (its layers, with the embedding on the first and
// the head on the last of S stages): forward, the input-gradient half of the
// backward (split schedules), the fused backward (the others) and the
// weight-gradient half.
StageWork stage_work(const RunConfig& cfg, const Dims& d, const std::vector<int64_t>& counts, int s, int S) {
  const ModelConfig& m = cfg.model;
  const std::string rc = cfg.train.recompute;
  StageWork st;
  st.first_layer = std::accumulate(counts.begin(), counts.begin() + s, int64_t{0});
  st.end_layer = st.first_layer + counts[size_t(s)];
  st.embedding = s == 0;
  st.head = s == S - 1;
  st.activation_bytes = double(d.Ns) * d.C * d.b;
  // Forward.
  if (st.embedding) {
    Piece p;
    p.ops.push_back({OpKind::EmbeddingForward, d.N, d.C, d.Vl});
    if (d.tp > 1)
      p.comms.push_back({d.sp ? Collective::ReduceScatter : Collective::AllReduce, Group::tp,
                         double(d.N) * d.C * d.b});
    st.forward.pieces.push_back(std::move(p));
  }
  for (int64_t l = st.first_layer; l < st.end_layer; ++l) layer_forward(st.forward, m, l, d);
  if (st.head) {
    Piece p;
    p.ops.push_back({OpKind::RmsNormForward, d.Ns, d.C});
    gather_act(p, d);
    p.ops.push_back(gemm(OpKind::GemmForward, d.N, d.Vl, d.C));
    p.ops.push_back({OpKind::CrossEntropy, d.N, d.Vl});
    if (d.tp > 1) p.comms.push_back({Collective::AllGather, Group::tp, double(d.N) * 2 * 4 * d.tp});
    st.forward.pieces.push_back(std::move(p));
  }
  // The backward: B alone (split schedules), B and W fused (the others).
  auto backward = [&](bool fused) {
    PassWork w;
    if (st.head) {
      Piece p;
      p.ops.push_back(gemm(OpKind::GemmInputGrad, d.N, d.C, d.Vl));
      if (fused) p.ops.push_back(gemm(OpKind::GemmWeightGrad, d.Vl, d.C, d.N));
      p.ops.push_back({OpKind::RmsNormBackward, d.Ns, d.C});
      reduce_act(p, d);
      if (fused) p.grads_done_layer = m.n_layers;
      w.pieces.push_back(std::move(p));
    }
    for (int64_t l = st.end_layer - 1; l >= st.first_layer; --l) {
      const int64_t within = l - st.first_layer;
      const bool full_rc = rc == "full" && (cfg.train.recompute_layers == 0 ||
                                            within < cfg.train.recompute_layers);
      layer_input_grad(w, m, l, d, full_rc, rc == "selective", fused);
    }
    if (st.embedding && fused) {
      Piece p;
      gather_act(p, d);
      p.ops.push_back({OpKind::EmbeddingBackward, d.N, d.C, d.Vl});
      p.grads_done_layer = -2;
      w.pieces.push_back(std::move(p));
    }
    return w;
  };
  st.input_grad = backward(false);
  st.backward = backward(true);
  if (st.head) {
    Piece p;
    p.ops.push_back(gemm(OpKind::GemmWeightGrad, d.Vl, d.C, d.N));
    p.grads_done_layer = m.n_layers;
    st.weight_grad.pieces.push_back(std::move(p));
  }
  for (int64_t l = st.end_layer - 1; l >= st.first_layer; --l)
    layer_weight_grad(st.weight_grad, m, l, d);
  if (st.embedding) {
    Piece p;
    gather_act(p, d);
    p.ops.push_back({OpKind::EmbeddingBackward, d.N, d.C, d.Vl});
    p.grads_done_layer = -2;
    st.weight_grad.pieces.push_back(std::move(p));
  }
  return st;
}

// The gradient units of a stage, in completion order (head, layers from the
// last, embedding).
void add_grad_units(std::vector<GradUnit>& units, const StageWork& st, const ModelConfig& m, const Dims& d) {
  if (st.head)
    units.push_back({m.n_layers, {double(d.Vl) * d.C * (m.tie_embeddings && st.embedding ? 0 : 1) + d.C, 0}});
  for (int64_t l = st.end_layer - 1; l >= st.first_layer; --l) units.push_back({l, layer_params(m, l, d)});
  if (st.embedding) units.push_back({-2, {double(d.Vl) * d.C, 0}});
}

// Buckets: whole units of one chunk, closed at bucket_mb (grad_buckets.hpp);
// ZeRO-1 one reduce-scatter of every unit; expert weights over edp. Under
// context parallelism the same over dp x cp (dpcp) and edp x cp (edpcp).
void plan_buckets(RankWork& rw, const std::vector<GradUnit>& units, const ParallelConfig& par,
                  const ModelConfig& m) {
  constexpr double kGradBytes = 4;  // gradients and their reduction are fp32
  const int v = int(par.virtual_stages);
  const int64_t D = par.dp * par.cp, eD = par.dp / par.ep * par.cp;
  const Group dense = par.cp > 1 ? Group::dpcp : Group::dp;
  // ZeRO-2/3 without a pipeline: in the passes (add_zero_traffic); with
  // one, each chunk's gradients reduce-scatter at its ReduceGrads.
  if (par.zero >= 2 && D > 1 && par.pp == 1) return;
  const bool zero = par.zero == 1 && D > 1;
  const bool chunk_rs = par.zero >= 2 && D > 1;
  const double bucket_bytes = std::max(1024.0 * 4, par.bucket_mb * 1024 * 1024);
  if (zero) {
    BucketWork b;
    b.chunk = -1;
    b.reduce_scatter = true;
    b.group = dense;
    for (const auto& u : units) {
      b.layers.push_back(u.first);
      b.bytes += (u.second.first + (par.ep > 1 ? 0 : u.second.second)) * kGradBytes;
    }
    rw.buckets.push_back(b);
  }
  auto chunk_of_layer = [&](int64_t l) {
    for (int c = 0; c < v; ++c) {
      const StageWork& st = rw.chunks[size_t(c)];
      if ((l >= st.first_layer && l < st.end_layer) || (l == -2 && st.embedding) ||
          (l == m.n_layers && st.head))
        return c;
    }
    return 0;
  };
  if (!zero && D > 1) {
    BucketWork cur;
    cur.chunk = -100;
    cur.group = dense;
    for (const auto& u : units) {
      const int c = chunk_of_layer(u.first);
      if (cur.chunk != c && !cur.layers.empty()) rw.buckets.push_back(cur), cur = {}, cur.group = dense;
      cur.chunk = c;
      cur.reduce_scatter = chunk_rs;
      cur.layers.push_back(u.first);
      cur.bytes += (u.second.first + (par.ep > 1 ? 0 : u.second.second)) * kGradBytes;
      if (cur.bytes >= bucket_bytes && !chunk_rs)
        rw.buckets.push_back(cur), cur = {}, cur.chunk = -100, cur.group = dense;
    }
    if (!cur.layers.empty()) rw.buckets.push_back(cur);
  }
  // Expert weights reduce over edp (dp / ep ranks; times cp) when ep > 1.
  if (par.ep > 1 && eD > 1) {
    for (const auto& u : units)
      if (u.second.second > 0) {
        BucketWork b;
        b.chunk = chunk_of_layer(u.first);
        b.layers = {u.first};
        b.bytes = u.second.second * kGradBytes;
        b.group = par.cp > 1 ? Group::edpcp : Group::edp;
        rw.buckets.push_back(b);
      }
  }
}

// ZeRO-2/3 (parallel/dp/zero_store.hpp; one chunk: no pipeline) in the
// passes, unit by unit (the embedding, each layer, the head; `units` in the
// backward's order). Each micro-batch's backward reduce-scatters every
// unit's fp32 gradient while the next unit computes (the last one's
// exposed). At ZeRO-3 each unit's weights are gathered before its forward
// and again before its backward (the first `prefetch` units of the backward
// are kept from the forward), each gather travelling during the compute of
// the `prefetch` units before it in the pass (prefetch 0: not hidden) and
// sharing the link with the reduce-scatter of the unit two back.
// With a pipeline (`pipelined`) the gradients are the buckets' (one
// reduce-scatter per chunk at its ReduceGrads: plan_buckets), and the
// gathers are made for each chunk pass (forward, fused backward, the split
// backward's input half; the weight half's on-demand gathers are not
// modelled).
void add_zero_traffic(StageWork& st, const std::vector<GradUnit>& units, const ParallelConfig& par,
                      const ModelConfig& m, const Dims& d, bool pipelined = false) {
  const Group dp = par.cp > 1 ? Group::dpcp : Group::dp;
  const Group edp = par.cp > 1 ? Group::edpcp : Group::edp;
  const int64_t n = int64_t(units.size());
  const int64_t p = std::max<int64_t>(0, par.zero3_prefetch);
  const bool z3 = par.zero >= 3;
  // A unit's segments (ZeroStore): with expert parallelism its expert
  // weights are their own segment, gathered and reduce-scattered over edp
  // (the ranks holding the same experts), the rest over dp; else one.
  const bool split_experts = par.ep > 1;
  auto elems = [&](int64_t g, Group grp) {
    const auto& [dense, expert] = units[size_t(g)].second;
    if (!split_experts) return dense + expert;
    return grp == edp ? expert : dense;
  };
  const std::vector<Group> groups = split_experts ? std::vector<Group>{dp, edp} : std::vector<Group>{dp};
  // The pieces of each unit in a pass: the embedding and the head one each,
  // a layer two (the attention, the FFN).
  auto split = [&](PassWork& w, bool backward) {
    std::vector<std::vector<size_t>> by;  // by grad-unit index (the backward's order)
    by.resize(size_t(n));
    size_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = backward ? i : n - 1 - i;
      const int64_t layer = units[size_t(g)].first;
      const size_t pieces = layer >= 0 && layer < m.n_layers ? 2 : 1;  // a layer: attention and FFN
      for (size_t j = 0; j < pieces && k < w.pieces.size(); ++j) by[size_t(g)].push_back(k++);
    }
    return by;
  };
  auto ops_of = [](const PassWork& w, const std::vector<size_t>& pieces) {
    std::vector<Op> ops;
    for (size_t i : pieces) ops.insert(ops.end(), w.pieces[i].ops.begin(), w.pieces[i].ops.end());
    return ops;
  };
  if (z3) {
    const auto by = split(st.forward, false);
    for (int64_t g = n - 1; g >= 0; --g)  // the forward's order
      for (Group grp : groups) {
        if (elems(g, grp) <= 0) continue;
        CommOp c{cluster::Collective::AllGather, grp, elems(g, grp) * d.b};
        for (int64_t k = 1; k <= p && g + k < n; ++k) {
          const auto o = ops_of(st.forward, by[size_t(g + k)]);
          c.hide.insert(c.hide.end(), o.begin(), o.end());
        }
        st.forward.pieces[by[size_t(g)].front()].comms.push_back(c);
      }
  }
  if (pipelined) {
    if (!z3) return;
    for (PassWork* w : {&st.backward, &st.input_grad}) {
      const auto by = split(*w, true);
      for (int64_t g = 0; g < n; ++g)
        for (Group grp : groups) {
          if (elems(g, grp) <= 0) continue;
          CommOp c{cluster::Collective::AllGather, grp, elems(g, grp) * d.b};
          for (int64_t k = 1; k <= p && g - k >= 0; ++k) {
            const auto o = ops_of(*w, by[size_t(g - k)]);
            c.hide.insert(c.hide.end(), o.begin(), o.end());
          }
          if (!by[size_t(g)].empty()) w->pieces[by[size_t(g)].front()].comms.push_back(c);
        }
    }
    return;
  }
  const auto by = split(st.backward, true);
  for (int64_t g = 0; g < n; ++g)  // the backward's order
    for (Group grp : groups) {
      CommOp c{cluster::Collective::ReduceScatter, grp, 0};
      const bool gather = z3 && g > p && elems(g, grp) > 0;
      if (gather) c = {cluster::Collective::AllGather, grp, elems(g, grp) * d.b};
      if (g >= 2 || (!z3 && g >= 1)) {  // an earlier unit's reduce-scatter in this window
        const int64_t r = z3 ? g - 2 : g - 1;
        if (gather) {
          if (elems(r, grp) > 0) c.with.push_back({cluster::Collective::ReduceScatter, elems(r, grp) * 4});
        } else {
          c.bytes = elems(r, grp) * 4;
        }
      }
      if (c.bytes <= 0) continue;
      for (int64_t k = 1; k <= std::max<int64_t>(1, p) && g - k >= 0; ++k) {
        const auto o = ops_of(st.backward, by[size_t(g - k)]);
        c.hide.insert(c.hide.end(), o.begin(), o.end());
      }
      if (gather && p == 0) c.hide.clear();
      st.backward.pieces[by[size_t(g)].front()].comms.push_back(c);
    }
  // The last units' reduce-scatters: after the pass, exposed.
  for (int64_t g = std::max<int64_t>(0, n - (z3 ? 2 : 1)); g < n; ++g)
    for (Group grp : groups)
      if (elems(g, grp) > 0)
        st.backward.pieces.back().comms.push_back({cluster::Collective::ReduceScatter, grp, elems(g, grp) * 4});
}

// The update and the step's small collectives around it, in the executor's order.
void add_update(RankWork& rw, const ParallelConfig& par, const Dims& d) {
  // The replicas of a stage's tp shard: dp, times cp under context parallelism.
  const int64_t D = par.dp * par.cp;
  const Group dp = par.cp > 1 ? Group::dpcp : Group::dp;
  const bool zero = par.zero >= 1 && D > 1;
  const double state = zero ? rw.param_elems / double(D) : rw.param_elems;
  rw.optimizer.push_back({OpKind::SumSquares, int64_t(state)});
  rw.optimizer.push_back({OpKind::AdamW, int64_t(state), d.b == 2 ? 1 : 0});
  auto small = [&](Group g, int64_t size, CommOp::When when) {
    if (size > 1) rw.step_comms.push_back({Collective::AllReduce, g, 8, when});
  };
  small(Group::pp, par.pp, CommOp::Start);              // the executor's common start
  small(Group::pp, par.pp, CommOp::BeforeUpdate);       // the loss over the stages
  small(dp, D, CommOp::BeforeUpdate);                   // ... and the replicas
  small(Group::pp, par.pp, CommOp::BeforeUpdate);       // the measured bubble: busy
  small(Group::pp, par.pp, CommOp::BeforeUpdate);       // ... and span
  if (zero) small(dp, D, CommOp::BeforeUpdate);         // the norm: ZeRO-1 chunks
  small(Group::tp, par.tp, CommOp::BeforeUpdate);       // ... tensor shards
  small(Group::pp, par.pp, CommOp::BeforeUpdate);       // ... stages
  // ZeRO-1's master, ZeRO-2's compute weights (ZeRO-3 keeps its shard); at
  // ZeRO-2 with expert parallelism the experts' over edp (ZeRO-1 with ep is
  // refused).
  if (zero && par.zero <= 2) {
    const bool edp = par.zero == 2 && par.ep > 1 && rw.expert_param_elems > 0;
    const double dense = rw.param_elems - (edp ? rw.expert_param_elems : 0);
    rw.step_comms.push_back({Collective::AllGather, dp, dense * d.b, CommOp::AfterUpdate});
    if (edp && par.dp / par.ep > 1)
      rw.step_comms.push_back({Collective::AllGather, par.cp > 1 ? Group::edpcp : Group::edp,
                               rw.expert_param_elems * d.b, CommOp::AfterUpdate});
  }
  small(Group::tp, par.tp, CommOp::AfterUpdate);        // the stop-signal agreement
  small(dp, D, CommOp::AfterUpdate);                    // (over cp too)
  small(Group::pp, par.pp, CommOp::AfterUpdate);
}

}  // namespace

RankWork rank_work(const RunConfig& cfg, int pp_rank, const WorkOptions& opts) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& par = cfg.parallel;
  Dims d = dims_of(cfg);
  d.unfused = opts.unfused_attention;
  d.dropout = opts.dropout;
  plan_experts(d, m, par, opts);
  const std::vector<int64_t> counts = stage_layer_counts(cfg);
  const int pp = int(par.pp), v = int(par.virtual_stages), S = pp * v;
  RankWork rw;
  std::vector<GradUnit> units;  // completion order
  const StagePlacement place = placement_of_schedule(par.schedule);
  for (int c = 0; c < v; ++c) {
    StageWork st = stage_work(cfg, d, counts, stage_of(place, pp, pp_rank, c), S);
    add_grad_units(units, st, m, d);
    rw.chunks.push_back(std::move(st));
  }
  for (const auto& u : units) rw.param_elems += u.second.first + u.second.second;
  for (const auto& u : units) rw.expert_param_elems += u.second.second;
  if (par.zero >= 2 && par.dp * par.cp > 1) {
    if (pp == 1 && v == 1) {
      add_zero_traffic(rw.chunks[0], units, par, m, d);
    } else {
      for (StageWork& st : rw.chunks) {  // each chunk's own units
        std::vector<GradUnit> mine;
        for (const GradUnit& u : units)
          if ((u.first >= st.first_layer && u.first < st.end_layer) || (u.first == -2 && st.embedding) ||
              (u.first == m.n_layers && st.head))
            mine.push_back(u);
        add_zero_traffic(st, mine, par, m, d, true);
      }
    }
  }
  plan_buckets(rw, units, par, m);
  add_update(rw, par, d);
  return rw;
}

}  // namespace adgt::sim
