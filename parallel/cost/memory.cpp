#include "parallel/cost/memory.hpp"

#include <algorithm>
#include <cstdio>

#include "core/model/param_table.hpp"
#include "core/model/moe_capacity.hpp"
#include "kernels/attention_path.hpp"
#include "core/model/stage_slice.hpp"
#include "parallel/cost/flops.hpp"
#include "parallel/cost/stages.hpp"

namespace adgt {

int64_t local_seq_len(const RunConfig& cfg) {
  const int64_t cp = std::max<int64_t>(1, cfg.parallel.cp);
  return cfg.model.seq_len % cp == 0 ? cfg.model.seq_len / cp : cfg.model.seq_len;
}

int64_t compute_bytes_per_element(const RunConfig& cfg) {
  return cfg.train.dtype == "f64" ? 8 : bf16_compute(cfg.train) ? 2 : 4;
}

// Notation: V vocab, C d_model, L layers, H heads, KV kv heads, hd head_dim,
// F ffn_hidden, T seq_len (a rank's seq_len / cp under context parallelism),
// B micro_batch, b bytes per element.
//
// Parameters come from build_param_table (a list of ~9L+3 names and shapes,
// no storage), so the count is exactly what the model allocates.
//
// FLOPs per token: flops.hpp's mfu_flops_per_token (the PaLM appendix B
// convention written out there: no causal discount; a MoE token counts its
// top_k experts). n_params_matmul is counted here from the parameter table:
// every weight used as a matmul operand, lm_head counted even when tied.
//
// Memory per rank (table = this rank's tensor-parallel shards):
//   params      = total_numel(table) * b      (flat buffer incl. 16-element padding)
//   grads       = total_numel(table) * max(b, 4)   (fp32 under bf16 mixed precision)
//   optimizer   = 2 * total_numel(table) * max(b, 4) / (dp under ZeRO-1, else 1)
//                 + total_numel(table) * 4 for the fp32 master weights (bf16 only)
//   With tp, H, KV, F and V below are this rank's shares (H/tp, ...); with
//   sequence parallelism the residual inputs, residual 2 and the rstds are /tp.
//   activations = B * T * b * (L * A_layer + A_final), where per token
//     A_layer = C (residual input) + C (norm1 out) + 1 (rstd1)
//             + H*hd (q) + KV*hd (k) + KV*hd (v) + H*hd (attention out)
//             + H*T (attention probabilities: the T x T matrix per head, i.e.
//                    the CPU backend's attention_saved_elems = B*H*T*T, in the
//                    master dtype: 2 H*T elements of b under bf16; with
//                    train.device: cuda, H fp32 log-sum-exps instead)
//             + C (residual 2) + C (norm2 out) + 1 (rstd2)
//             + F (gate) + F (up) + F (h = silu(gate)*up)
//     A_final = C (last block output) + C (final norm out) + 1 (rstd)
//             + V (logits, overwritten in place by their gradient) + 1 (loss)
//   An MoE layer keeps A_layer less the FFN's 3F (it has none), and its
//   block's buffers per micro-batch in flight plus its scratch (moe_bytes,
//   below: the expert rows of the capacity, or of uniform routing).
//   Scratch (bytes_scratch; core/model/model.cpp make_scratch): the backward's
//   activation gradients of one layer, N = B*T rows, Nl = N/tp with SP else N:
//     Nl*C (d_resid) + N*C (d_tmp) [+ SP: 2 Nl*C + 2 N*C] + N*(2 H + 2 KV)*hd/tp
//     + 3 N*F/tp [+ fused projections: N*(H + 2 KV)*hd/tp, the q/k/v GEMM's
//     output and its gradient], the rotary tables T*hd (master dtype), and per micro-batch
//     in flight per chunk its output rows Nl*C and 2N int32 token ids.
//   Recompute (train.recompute, core/model/model.hpp) changes what a layer
//   keeps per micro-batch in flight, plus one shared set of buffers per rank:
//     selective: a layer drops H*T (or the lse) + H*hd (attention) and F (h;
//                dense layers); shared: those once;
//     full:      a recomputed layer keeps C/rows (its input); shared: one
//                layer's activations besides the input; recompute_layers
//                limits it to the first layers of each chunk.
//   Pipeline parallelism: the rank's stage slice gives the table; the
//   activations sum over its chunks c: held[c] x (layers(c) x A_layer +
//   A_final if c holds the head); with a split backward (zb-h1, greedy) each
//   layer also keeps its output gradients from B to W: 2C + 2F/tp +
//   (H + 2KV) hd/tp per token (and C for the embedding's chunk).
namespace {

// The whole model's counts, the same on every rank: parameters (from the
// parameter table), matmul weights, and the training FLOPs per token and step.
void count_model(const RunConfig& cfg, MemoryEstimate& e) {
  const ModelConfig& m = cfg.model;
  const auto table = build_param_table(m);
  e.n_params = param_count(table);
  int64_t embedding = 0;
  for (const auto& p : table) {
    if (p.is_matrix) e.n_params_matmul += p.numel;
    if (p.is_embedding || p.name == "lm_head.weight") embedding += p.numel;
  }
  e.n_params_non_embedding = e.n_params - embedding;
  if (m.tie_embeddings) e.n_params_matmul += m.vocab_size * m.d_model;

  e.flops_per_token = mfu_flops_per_token(m);
  e.tokens_per_step = cfg.train.global_batch * m.seq_len;
  e.flops_per_step = e.flops_per_token * static_cast<double>(e.tokens_per_step);
}

// What one token keeps on one rank, in compute-dtype elements: per dense and
// MoE layer, for the head, and what recompute keeps of a layer (the formulas
// of the notation comment above).
struct ActivationSizes {
  const RunConfig& cfg;
  int64_t rows = 1;         // tp with sequence parallelism (residual rows split over tp), else 1
  int64_t a_layer = 0;      // a dense layer
  int64_t a_moe_layer = 0;  // an MoE layer
  int64_t a_final = 0;      // the final norm, logits and loss
  int64_t att_core = 0;     // what selective recompute drops of the attention
  int64_t shared_rc = 0;    // the recomputed part's buffers, once per rank
  int64_t Fl = 0;           // the FFN's hidden width on this rank

  bool recomputed(int64_t index_in_chunk) const {
    const std::string& rc = cfg.train.recompute;
    if (rc == "selective") return true;
    return rc == "full" && (cfg.train.recompute_layers == 0 || index_in_chunk < cfg.train.recompute_layers);
  }
  // What layer l (index_in_chunk within its chunk) keeps per token.
  int64_t kept(int64_t l, int64_t index_in_chunk) const {
    const bool moe = cfg.model.is_moe_layer(l);
    const int64_t all = moe ? a_moe_layer : a_layer;
    if (!recomputed(index_in_chunk)) return all;
    if (cfg.train.recompute == "selective") return all - att_core - (moe ? 0 : Fl);
    return cfg.model.d_model / rows;
  }
};

ActivationSizes activation_sizes(const RunConfig& cfg, int64_t bpp) {
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, H = m.n_heads, KV = m.n_kv_heads, hd = m.head_dim(), F = m.ffn_hidden,
                T = local_seq_len(cfg);
  const int64_t tp = cfg.parallel.tp;
  const bool sp = cfg.parallel.sequence_parallel && tp > 1;
  const int64_t Hl = H / tp, KVl = KV / tp, Fl = F / tp, Vl = padded_vocab(m, tp) / tp;
  ActivationSizes z{cfg};
  z.rows = sp ? tp : 1;
  const int64_t a_layer_num = 2 * C + 2;  // x_in, x_mid, rstd1, rstd2 (divided by `rows`)
  // What the attention saves per token and head: the CPU backend's T
  // probabilities, or the CUDA kernels' one fp32 log-sum-exp (train.device:
  // cuda), counted in compute-dtype elements. Context parallelism's ring
  // keeps the merged log-sum-exp on every backend (its backward recomputes
  // each block's probabilities from it).
  // All-to-all keeps the backend's own saved tensor for the whole sequence
  // over heads / cp: per local token, as many as without cp.
  // The saved tensor is in the model's master dtype (core/model/model.cpp
  // mdt_: fp32 when the activations are bf16), so a bf16 run's T
  // probabilities take 2 T compute-dtype elements (the estimate counted T:
  // 44.6% under the emulated device's peak at seq_len 512 before).
  const bool ring = cfg.parallel.cp > 1 && cfg.parallel.cp_mode == "ring";
  const int64_t att_saved = cfg.train.device == "cuda" || ring
                                ? std::max<int64_t>(1, 4 / bpp)
                                : m.seq_len * std::max<int64_t>(1, 4 / bpp);
  const int64_t a_layer_full = 2 * C + 2 * Hl * hd + 2 * KVl * hd + Hl * att_saved + 3 * Fl;
  z.a_layer = a_layer_num / z.rows + a_layer_full;
  // An MoE layer keeps the dense layer's but the FFN's 3F; its MoE block's
  // own buffers are counted apart, in bytes (moe_bytes: they are kept under
  // every recompute mode).
  z.a_moe_layer = z.a_layer - 3 * Fl;
  z.a_final = C / z.rows + 1 + C + Vl + 1;
  // Recompute: what a layer keeps, and the shared buffers of the recomputed part.
  const std::string& rc = cfg.train.recompute;
  z.att_core = Hl * att_saved + Hl * hd;  // selective drops these (and h)
  z.shared_rc = rc == "selective" ? z.att_core + Fl : rc == "full" ? z.a_layer - C / z.rows : 0;
  z.Fl = Fl;
  return z;
}

// One pipeline rank's activations per token, summed over its chunks, each
// times the micro-batches it holds.
struct RankActivations {
  int64_t act = 0;        // everything kept, the recomputed part's shared buffers included
  int64_t n_held = 0;     // micro-batches held, over all chunks
  int64_t split_act = 0;  // of act: a split backward's output gradients
  int64_t moe_layers = 0;  // MoE layers on this rank (each its own scratch: moe_bytes)
  int64_t moe_slots = 0;   // MoE layers x the micro-batches each holds (a slot each)
};

// held[r][c] where given, else what 1F1B (or ZB-V's vee) holds at most.
RankActivations rank_activations(const RunConfig& cfg, const ActivationSizes& z, const StageSlice& slice, int r,
                                 const std::vector<std::vector<int64_t>>& held, bool split,
                                 StagePlacement placement) {
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, hd = m.head_dim(), tp = cfg.parallel.tp;
  const int64_t Hl = m.n_heads / tp, KVl = m.n_kv_heads / tp;
  const int pp = int(cfg.parallel.pp);
  const int64_t mb = cfg.pipeline_microbatches();
  RankActivations out;
  bool any_recomputed = false;
  for (int c = 0; c < int(slice.chunks.size()); ++c) {
    const int64_t h = r < int(held.size()) && c < int(held[size_t(r)].size())
                          ? held[size_t(r)][size_t(c)]
                          : pp == 1                            ? 1
                            : placement == StagePlacement::vee ? std::min<int64_t>(pp, mb)  // ZB-V: 1F1B's pp stages
                                                               : std::min<int64_t>(pp - r, mb);
    const bool head = slice.head && c + 1 == int(slice.chunks.size());
    int64_t per = head ? z.a_final : 0;
    // A split backward (zb-h1, greedy) keeps each layer's output gradients
    // from B to W (model.cpp make_split_buffers), and the embedding's.
    if (split) {
      const int64_t layers = slice.chunks[size_t(c)].second - slice.chunks[size_t(c)].first;
      const int64_t g = layers * (2 * C + 2 * z.Fl + (Hl + 2 * KVl) * hd) +
                        (slice.embedding && c == 0 ? C : 0);
      per += g;
      out.split_act += h * g;
    }
    for (int64_t l = slice.chunks[size_t(c)].first; l < slice.chunks[size_t(c)].second; ++l) {
      const int64_t i = l - slice.chunks[size_t(c)].first;
      per += z.kept(l, i);
      any_recomputed = any_recomputed || z.recomputed(i);
      if (m.is_moe_layer(l)) out.moe_layers += 1, out.moe_slots += h;
    }
    out.act += h * per;
    out.n_held += h;
  }
  if (any_recomputed) out.act += z.shared_rc;
  return out;
}

// x's per-rank bytes for a rank holding `numel` parameter elements and the
// activations `a`.
// ZeRO-2/3's shard and largest unit (parallel/dp/zero_shards.hpp): the
// units are the embedding, each layer, and the final norm with the head;
// each is split into D slots of ceil(n / D) rounded up to 16 elements. With
// expert parallelism (De > 0) an MoE layer's expert weights are a segment of
// their own, split into De (edp x cp) slots.
struct ZeroSizes {
  int64_t shard = 0;     // elements of a rank's shard (its slots)
  int64_t max_unit = 0;  // the largest segment's slots x ranks (a gathered buffer)
  // Per unit, in the backward's order (the head first): its segments' (slot, ranks).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> segs;
};
ZeroSizes zero_sizes(const std::vector<ParamSpec>& table, int64_t D, int64_t De) {
  ZeroSizes z;
  auto unit_of = [](const std::string& name) {
    if (name.rfind("model.layers.", 0) == 0) return name.substr(0, name.find('.', 13));
    return name == "model.embed_tokens.weight" ? std::string("embed") : std::string("head");
  };
  auto seg = [&](int64_t n, int64_t P, std::vector<std::pair<int64_t, int64_t>>& out) {
    if (n <= 0) return;
    const int64_t slot = ((n + P - 1) / P + 15) / 16 * 16;
    z.shard += slot;
    z.max_unit = std::max(z.max_unit, slot * P);
    out.push_back({slot, P});
  };
  for (size_t i = 0; i < table.size();) {
    const std::string u = unit_of(table[i].name);
    size_t j = i;
    while (j + 1 < table.size() && unit_of(table[j + 1].name) == u) ++j;
    const int64_t end = table[j].offset + (table[j].numel + 15) / 16 * 16;
    int64_t cut = end;  // the first expert weight (a suffix of the unit)
    if (De > 0)
      for (size_t k = i; k <= j; ++k)
        if (table[k].expert >= 0) cut = std::min(cut, table[k].offset);
    std::vector<std::pair<int64_t, int64_t>> segs;
    seg(cut - table[i].offset, D, segs);
    seg(end - cut, De, segs);
    z.segs.insert(z.segs.begin(), segs);
    i = j + 1;
  }
  return z;
}

// What ZeroStore keeps besides its shards (bytes). It walks the units as a
// step does and lists the buffers in use at each point: in the forward a
// unit, the next one (its norm) and the prefetched ones gathered; in the
// backward a unit and the prefetched ones gathered (every unit not yet done
// without resharding after the forward), its whole gradient being written
// and the two before it being reduce-scattered (each with its output slot);
// with accumulation the last two units' reduce-scatters still in flight in
// the next micro-batch's forward; ZeRO-2: the gradients, and the update's
// gather buffer. Each unit is a buffer per segment. The store keeps its
// buffers for reuse (ZeroStore::take: a buffer serves requests down to 2/3
// of its size), so what it holds is, for each size class, the most of that
// class in use at one point, times the class's largest size.
int64_t zero_working_bytes(const ZeroSizes& z, int level, int64_t prefetch, bool reshard,
                           int64_t b, int64_t mb, bool accumulates) {
  const int64_t n = int64_t(z.segs.size());
  // Unit g's whole buffers (bytes per element e), or its output slots.
  auto whole = [&](std::vector<int64_t>& pt, int64_t g, int64_t e) {
    if (g < 0 || g >= n) return;
    for (const auto& [slot, P] : z.segs[size_t(g)]) pt.push_back(slot * P * e);
  };
  auto slots = [&](std::vector<int64_t>& pt, int64_t g) {
    if (g < 0 || g >= n) return;
    for (const auto& [slot, P] : z.segs[size_t(g)]) pt.push_back(slot * mb);
  };
  std::vector<std::vector<int64_t>> points;  // the buffers (bytes) in use at each point
  std::vector<int64_t> inflight;
  for (int64_t g = n - 2; accumulates && g < n; ++g) whole(inflight, g, mb), slots(inflight, g);
  if (level < 3) {
    points.push_back({z.max_unit * b});
    points.push_back(inflight);
  }
  for (int64_t g = n - 1; g >= 0 && level >= 3; --g) {  // the forward: g - 1 is next
    std::vector<int64_t> pt = inflight;
    const int64_t ahead = std::max<int64_t>(1, prefetch);
    for (int64_t k = g - ahead; k <= (reshard ? g : n - 1); ++k) whole(pt, k, b);
    points.push_back(pt);
  }
  for (int64_t g = 0; g < n; ++g) {  // the backward: g + 1 is next
    std::vector<int64_t> pt;
    if (level >= 3)
      for (int64_t k = g; k <= (reshard ? g + prefetch : n - 1); ++k) whole(pt, k, b);
    whole(pt, g, mb);
    for (int64_t k = 1; k <= 2 && g - k >= 0; ++k) whole(pt, g - k, mb), slots(pt, g - k);
    points.push_back(pt);
  }
  // Size classes: sizes within 1.5x of the class's smallest share buffers.
  std::vector<int64_t> sizes;
  for (const auto& pt : points) sizes.insert(sizes.end(), pt.begin(), pt.end());
  std::sort(sizes.begin(), sizes.end());
  std::vector<std::pair<int64_t, int64_t>> classes;  // (smallest, largest)
  for (int64_t x : sizes) {
    if (x <= 0) continue;
    if (!classes.empty() && x <= classes.back().first + classes.back().first / 2)
      classes.back().second = x;
    else
      classes.push_back({x, x});
  }
  int64_t total = 0;
  for (const auto& [lo, hi] : classes) {
    int64_t most = 0;
    for (const auto& pt : points) {
      int64_t k = 0;
      for (int64_t x : pt) k += x >= lo && x <= hi;
      most = std::max(most, k);
    }
    total += most * hi;
  }
  return total;
}

// An MoE layer's buffers (core/model/moe.cpp), in bytes, for N = B x T
// token rows: per micro-batch in flight (its slot: the input copy, the
// routing, the send positions, the received rows' permutation, the experts'
// inputs, gate (fused: gate and up), up, h, and the outputs in send order)
// and once per layer (its scratch: logits, the send list and plan, the send,
// receive and gathered rows, the return's, the backward's dh, dgate, dup and
// the combine weights' gradient). The rows are MoeLayer's: N k sent, and
// received moe_recv_reserve (the capacity's most; dropless, the uniform
// routing's N k, which a skewed routing exceeds). Expert replicas'
// buffers (expert_slots) are not counted.
struct MoeBytes {
  int64_t slot = 0, scratch = 0;
};
MoeBytes moe_bytes(const RunConfig& cfg, int64_t bpp, int64_t N) {
  const ModelConfig& m = cfg.model;
  MoeBytes b;
  if (m.n_experts <= 0) return b;
  const int64_t C = m.d_model, E = m.n_experts, k = m.moe_top_k, F = m.expert_ffn() / cfg.parallel.tp;
  const int64_t P = std::max<int64_t>(1, cfg.parallel.ep), El = E / P;
  const bool fused = cfg.train.fused_projections;
  const int64_t rb = bpp == 8 ? 8 : 4;                 // the routing's dtype (f64, else f32)
  const int64_t gb = std::max<int64_t>(bpp, 4);         // gradients' (fp32 under bf16)
  const int64_t Ms = N * k;
  const int64_t Mr = cfg.parallel.cp > 1 ? N * k  // capacity groups spanning cp ranks: uniform
                                         : moe_recv_reserve(m.moe_capacity_factor, m.moe_capacity_segment,
                                                            N, k, E, P, El);
  const int64_t gate = fused ? 2 * F : F, up = fused ? 0 : F;
  b.slot = N * C * bpp + N * E * rb + N * k * (4 + rb + bpp + 4) + N * rb + E * 8 + Mr * 2 * 4 +
           Mr * (C + gate + up + F) * bpp + Ms * C * bpp;
  const int64_t L = 3 * E + 2, G = 2 * E + 2;
  b.scratch = N * E * bpp + N * k * 4 + (L + G + E) * 8 + Ms * C * bpp + Mr * C * bpp +
              (P > 1 ? 2 * Mr * C * bpp : 0) + Mr * (F + gate + up) * bpp + N * k * gb;
  return b;
}

void fill_rank_bytes(const RunConfig& cfg, int64_t bpp, const std::vector<ParamSpec>& table,
                     const RankActivations& a, const ActivationSizes& z, MemoryEstimate& x) {
  const int64_t numel = total_numel(table);
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, hd = m.head_dim(), T = local_seq_len(cfg), B = cfg.train.micro_batch;
  const int64_t tp = cfg.parallel.tp, dp = cfg.parallel.dp;
  const bool sp = cfg.parallel.sequence_parallel && tp > 1;
  const int64_t Hl = m.n_heads / tp, KVl = m.n_kv_heads / tp;
  x.bytes_params = numel * bpp;
  x.bytes_grads = numel * std::max<int64_t>(bpp, 4);
  // ZeRO-1 shards the AdamW state over the ranks holding the same weights:
  // dp x cp (Megatron's distributed optimizer does the same with cp).
  x.bytes_optimizer = 2 * numel * std::max<int64_t>(bpp, 4) / (cfg.parallel.zero ? dp * cfg.parallel.cp : 1) +
                      (bpp < 4 ? numel * 4 : 0);
  const int64_t D = dp * cfg.parallel.cp;
  if (cfg.parallel.zero >= 2 && D > 1) {
    // ZeRO-2/3 (parallel/dp/zero_store.hpp): the shards (master, gradient,
    // AdamW m and v; in mixed precision also the bf16 compute copy), and the
    // working set: whole-unit gradients while they are reduce-scattered (the
    // unit being written and two in flight, with their output slots), and at
    // ZeRO-3 the gathered units (the forward's unit and the next one or the
    // prefetched ones; the backward's and its prefetched ones beside the
    // gradients; without resharding after the forward every unit).
    const int64_t mb = std::max<int64_t>(bpp, 4);
    const int64_t ep = std::max<int64_t>(1, cfg.parallel.ep);
    const ZeroSizes zs = zero_sizes(table, D, ep > 1 ? D / ep : 0);
    const int64_t compute_shard = bpp < 4 ? zs.shard * bpp : 0;
    const int64_t p = std::max<int64_t>(0, cfg.parallel.zero3_prefetch);
    x.bytes_params = cfg.parallel.zero >= 3 ? compute_shard : numel * bpp + compute_shard;
    x.bytes_grads = zs.shard * mb;
    x.bytes_optimizer = 3 * zs.shard * mb;
    x.bytes_zero_working = zero_working_bytes(zs, int(cfg.parallel.zero), p,
                                              cfg.parallel.zero3_reshard_after_forward, bpp, mb,
                                              cfg.accum_steps() > 1);
    if (cfg.parallel.pp > 1) {
      // With a pipeline the stage's gradients stay whole over the step (each
      // unit's buffer, reduce-scattered at its chunk's ReduceGrads), and at
      // ZeRO-3 a pass holds its unit, the next and the prefetched ones (every
      // unit of the stage without resharding). Measured: pp2 x dp2 ZeRO-3 on
      // the emulated device, this 4.6% under the peak (ctest
      // zero_memory_estimate_emulated).
      x.bytes_grads += numel * mb;
      x.bytes_zero_working =
          cfg.parallel.zero >= 3 ? (cfg.parallel.zero3_reshard_after_forward
                                        ? (1 + std::max<int64_t>(1, p)) * zs.max_unit * bpp
                                        : numel * bpp)
                                 : zs.max_unit * bpp;
    }
  }
  const MoeBytes moe = moe_bytes(cfg, bpp, B * T);
  x.bytes_activations = B * T * a.act * bpp + a.moe_slots * moe.slot;
  x.bytes_split = B * T * a.split_act * bpp;
  if (cfg.train.device == "cuda" && bf16_compute(cfg.train)) {
    const AttentionPath ap = cuda_attention_path(AttentionShape{B, T, Hl, KVl, hd});
    x.bytes_attention_fallback = ap.fallback_bytes;
    x.attention_fallback = ap.reason;
  }
  const int64_t Nt = B * T, Nl = Nt / z.rows, mbytes = std::max<int64_t>(bpp, 4);
  x.bytes_scratch =
      (Nl * C + Nt * C + (sp ? 2 * Nl * C + 2 * Nt * C : 0) + Nt * (2 * Hl + 2 * KVl) * hd +
       3 * Nt * z.Fl + (cfg.train.fused_projections ? Nt * (Hl + 2 * KVl) * hd : 0)) * bpp +
      T * hd * mbytes + a.n_held * (Nl * C * bpp + 2 * Nt * 4) + a.moe_layers * moe.scratch;
  // Context parallelism's ring: the K/V block arriving while the one in hand
  // is computed on, and in the backward this rank's own dK/dV, a step's dK/dV
  // and two travelling accumulators (parallel/cp/ring_attention.hpp): six
  // K/V-sized buffers, plus the running output and log-sum-exp of the merge.
  if (cfg.parallel.cp > 1 && cfg.parallel.cp_mode == "ring") {
    x.bytes_ring = (6 * Nt * 2 * KVl * hd + Nt * Hl * hd) * bpp + Nt * Hl * 4;
    x.bytes_scratch += x.bytes_ring;
  } else if (cfg.parallel.cp > 1) {
    // All-to-all: the head-sharded q, k, v, out and in the backward dout,
    // dq, dk, dv (each as many elements as the local one), and a send and a
    // receive buffer of the largest.
    x.bytes_ring = (4 * Nt * Hl * hd + 4 * Nt * KVl * hd + 2 * Nt * Hl * hd) * bpp;
    x.bytes_scratch += x.bytes_ring;
  }
  if (cfg.train.dtype == "fp8") {
    // The FP8 linears (core/model/fp8_linear.hpp): the layers' q/k/v, o,
    // gate/up and down weights and the experts' w1, w3, w2 (this rank's,
    // and the replicas it serves: parallel.expert_slots beyond E / ep) cast
    // once per step and kept (one byte each, two on CUDA with the
    // transposed codes the backward reads; without train.fp8_weight_cache
    // cast at each use, below); the input and output-gradient
    // codes, each grown to its largest GEMM; on the CPU backends the
    // emulation's fp32 copies of the largest GEMM (its backward: dy, w, x
    // and dx). An expert's GEMM has up to twice the uniform routing's rows
    // (Nt k ep / E), at most Nt ep.
    const bool cuda = cfg.train.device == "cuda";
    int64_t linear = 0, expert = 0, largest = 0;
    for (const ParamSpec& p : table) {
      const bool proj = p.name.find("_proj.weight") != std::string::npos;
      if (proj) linear += p.numel;
      if (p.expert >= 0) expert += p.numel;
      if (proj || p.expert >= 0) largest = std::max(largest, p.numel);
    }
    const int64_t ep = std::max<int64_t>(1, cfg.parallel.ep);
    const int64_t per_rank = m.n_experts > 0 ? m.n_experts / ep : 0;
    if (per_rank > 0 && cfg.parallel.expert_slots > per_rank)
      expert = expert / per_rank * cfg.parallel.expert_slots;
    int64_t xq = 0, dyq = 0, scratch = 0;
    auto gemm = [&](int64_t rows, int64_t O, int64_t I) {  // y (rows, O) = x (rows, I) w^T
      xq = std::max(xq, rows * I);
      dyq = std::max(dyq, rows * O);
      scratch = std::max(scratch, (rows * O + O * I + 2 * rows * I) * 4);
    };
    const bool fused = cfg.train.fused_projections;
    bool dense_ffn = false;
    for (int64_t l = 0; l < m.n_layers; ++l) dense_ffn = dense_ffn || !m.is_moe_layer(l);
    if (fused) {
      gemm(Nt, (Hl + 2 * KVl) * hd, C);
    } else {
      gemm(Nt, Hl * hd, C);
      gemm(Nt, KVl * hd, C);
    }
    gemm(Nt, C, Hl * hd);
    if (dense_ffn) {
      gemm(Nt, fused ? 2 * z.Fl : z.Fl, C);
      gemm(Nt, C, z.Fl);
    }
    // On CUDA (and the emulated device, which models it) an expert GEMM's
    // rows are padded to 16 in bf16 copies of x, dy and the output (y or dx).
    const bool pads = cuda || cfg.train.device == "emulated";
    int64_t padded = 0;
    if (m.n_experts > 0) {
      const int64_t Fel = m.expert_ffn() / tp, O1 = fused ? 2 * Fel : Fel;
      int64_t rows = std::min(Nt * ep, (2 * Nt * m.moe_top_k * ep + m.n_experts - 1) / m.n_experts);
      if (pads) rows = (rows + 15) / 16 * 16;
      gemm(rows, O1, C);
      gemm(rows, C, Fel);
      if (pads) {
        const int64_t px = rows * std::max(C, Fel), pdy = rows * std::max(O1, C);
        padded = (px + pdy + std::max(px, pdy)) * 2;
      }
    }
    // Without the cache (train.fp8_weight_cache; auto: ZeRO-3 freeing each
    // unit after use) one GEMM's weight codes at a time; the fused GEMMs'
    // weights are two or three of the table's adjacent tensors.
    if (!fp8_weight_cache_on(cfg)) linear = 3 * largest, expert = 0;
    x.bytes_fp8 = (linear + expert + xq + dyq) * (cuda ? 2 : 1) + (cuda ? 0 : scratch) + padded;
    // parallel.fp8_allgather: the local and the gathered codes of one gather.
    if (cfg.parallel.fp8_allgather && sp) x.bytes_fp8 += Nt * C + Nt * C / tp;
  }
  x.bytes_total = x.bytes_params + x.bytes_grads + x.bytes_optimizer + x.bytes_activations +
                  x.bytes_attention_fallback + x.bytes_scratch + x.bytes_zero_working +
                  x.bytes_fp8;
}

}  // namespace

// Per rank: this rank's tensor-parallel shards (the parameter table for rank 0
// of tp), AdamW state divided over dp under ZeRO-1, and with sequence
// parallelism the residual/norm rows divided over tp; with pipeline
// parallelism the pipeline rank with the largest total.
MemoryEstimate estimate_memory(const RunConfig& cfg, int64_t bpp,
                               const std::vector<std::vector<int64_t>>& held) {
  const ModelConfig& m = cfg.model;
  MemoryEstimate e;
  count_model(cfg, e);
  const ActivationSizes z = activation_sizes(cfg, bpp);
  const int64_t ep = std::max<int64_t>(1, cfg.parallel.ep);
  std::vector<int64_t> experts0;  // ep rank 0's experts (every rank holds E / ep)
  for (int64_t x = 0; x < m.n_experts / ep; ++x) experts0.push_back(x);
  e.bytes_per_element = bpp;
  const int pp = int(cfg.parallel.pp), v = int(cfg.parallel.virtual_stages);
  const std::vector<int64_t> counts = stage_layer_counts(cfg);
  const bool split = pp > 1 && (cfg.parallel.schedule == "zb-h1" || cfg.parallel.schedule == "zb-v" ||
                                cfg.parallel.schedule == "greedy");
  const StagePlacement placement = placement_of_schedule(cfg.parallel.schedule);
  for (int r = 0; r < pp; ++r) {
    const StageSlice slice = stage_slice(counts, pp, v, r, placement);
    const std::vector<ParamSpec> table =
        build_param_table(m, cfg.parallel.tp, 0, &slice, m.n_experts > 0 ? &experts0 : nullptr);
    const RankActivations a = rank_activations(cfg, z, slice, r, held, split, placement);
    MemoryEstimate x = e;
    fill_rank_bytes(cfg, bpp, table, a, z, x);
    x.pp_rank = r;
    x.microbatches_held = a.n_held;
    if (r == 0 || x.bytes_total > e.bytes_total) e = x;
  }
  return e;

}

// The re-plan's most: split buffers, each chunk held as on its busiest rank.
MemoryEstimate estimate_memory_replanned(const RunConfig& cfg, int64_t bpp,
                                         const std::vector<std::vector<int64_t>>& held) {
  const int pp = int(cfg.parallel.pp);
  if (pp < 2) return estimate_memory(cfg, bpp, held);
  RunConfig split = cfg;
  // A split backward, any number of chunks; zb-v keeps its own (the vee
  // placement's stage slices).
  if (cfg.parallel.schedule != "zb-v") split.parallel.schedule = "greedy";
  const int64_t mb = cfg.pipeline_microbatches();
  std::vector<std::vector<int64_t>> most;
  for (int r = 0; r < pp; ++r) {
    std::vector<int64_t> row = r < int(held.size()) ? held[size_t(r)] : std::vector<int64_t>{};
    if (row.empty()) row.push_back(std::min<int64_t>(pp - r, mb));
    most.push_back(row);
  }
  for (size_t c = 0;; ++c) {
    int64_t m = 0;
    bool any = false;
    for (const auto& row : most)
      if (c < row.size()) m = std::max(m, row[c]), any = true;
    if (!any) break;
    for (auto& row : most)
      if (c < row.size()) row[c] = m;
  }
  return estimate_memory(split, bpp, most);
}

std::string with_thousands(int64_t n) {
  std::string d = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return (n < 0 ? "-" : "") + out;
}

namespace {

std::string trim(const std::string& x) {
  const size_t a = x.find_first_not_of(' ');
  return a == std::string::npos ? x : x.substr(a);
}

std::string printf_str(const char* fmt, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string short_count(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return printf_str("%.2f B", x / 1e9);
  if (x >= 1e6) return printf_str("%.2f M", x / 1e6);
  if (x >= 1e3) return printf_str("%.2f K", x / 1e3);
  return std::to_string(n);
}

std::string gib(int64_t bytes) {
  return printf_str("%10.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

std::string format_estimate(const RunConfig& cfg, const MemoryEstimate& e,
                            const MemoryEstimate* replan) {
  const ModelConfig& m = cfg.model;
  const TrainConfig& t = cfg.train;
  const int64_t bpp = e.bytes_per_element;
  const std::string dt = bpp == 8 ? "fp64" : bpp == 4 ? "fp32" : bpp == 2 ? "bf16" : "?";
  std::string s;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line("dry run: " + (cfg.source.empty() ? std::string("(config)") : cfg.source) +
       " (estimated, nothing allocated)");
  line("  model        " + std::to_string(m.n_layers) + " layers, d_model " +
       std::to_string(m.d_model) + ", " + std::to_string(m.n_heads) + " heads (" +
       std::to_string(m.n_kv_heads) + " kv, head_dim " + std::to_string(m.head_dim()) +
       "), ffn " + std::to_string(m.ffn_hidden) + ", vocab " + std::to_string(m.vocab_size) +
       ", seq_len " + std::to_string(m.seq_len) +
       (m.tie_embeddings ? ", tied embeddings" : ", untied embeddings"));
  line("  parameters   " + with_thousands(e.n_params) + " (" + short_count(e.n_params) +
       "); non-embedding " + with_thousands(e.n_params_non_embedding));
  const int64_t cp = cfg.parallel.cp;
  line("  batch        " + std::to_string(t.global_batch) + " sequences/step = micro_batch " +
       std::to_string(t.micro_batch) + " x " + std::to_string(cfg.accum_steps()) +
       " accumulation x dp " + std::to_string(cfg.parallel.dp) + "; " +
       with_thousands(e.tokens_per_step) + " tokens/step");
  line("  compute      " + printf_str("%.3e", e.flops_per_token) +
       " FLOP/token (6 x matmul params + 12 L H hd T, no causal discount); " +
       printf_str("%.3e", e.flops_per_step) + " FLOP/step");
  const ParallelConfig& par = cfg.parallel;
  const bool mixed = bf16_compute(t);
  line("  memory per rank (" + (mixed ? std::string("bf16 parameters, fp32 master weights and gradients")
                                      : dt + " parameters and gradients") +
       ", AdamW m and v; attention saves " +
       (cp > 1 && par.cp_mode == "ring" ? "log-sum-exps (ring attention)"
        : t.device == "cuda"             ? "log-sum-exps (train.device cuda)"
                                         : "probabilities (CPU backend)") +
       "; tp " +
       std::to_string(par.tp) + (par.sequence_parallel && par.tp > 1 ? " with SP" : "") +
       (cp > 1 ? ", cp " + std::to_string(cp) + " " + par.cp_mode : std::string()) +
       ", dp " + std::to_string(par.dp) +
       (par.zero && par.dp * par.cp > 1 ? " with ZeRO-" + std::to_string(par.zero) : std::string()) +
       (par.pp > 1 ? ", pp " + std::to_string(par.pp) + " " + par.schedule + ": pipeline rank " +
                         std::to_string(e.pp_rank) + ", the largest" : std::string()) +
       "):");
  const bool zero23 = par.zero >= 2 && par.dp * par.cp > 1;
  if (zero23) {
    line("    parameters   " + gib(e.bytes_params) +
         (par.zero >= 3 ? (mixed ? "  (this rank's shard of the bf16 copy)" : "  (held as the master shard)")
                        : (mixed ? "  (whole bf16 weights, and this rank's shard of them)"
                                 : "  (whole weights)")));
    line("    gradients    " + gib(e.bytes_grads) + "  (this rank's shard)");
    line("    optimizer    " + gib(e.bytes_optimizer) + "  (AdamW m, v and the " +
         (mixed ? "fp32 " : "") + "master weights: this rank's shard)");
    line("    ZeRO working " + gib(e.bytes_zero_working) +
         (par.zero >= 3 ? "  (gathered units: the largest x " +
                              (par.zero3_reshard_after_forward
                                   ? std::to_string(1 + std::max<int64_t>(1, par.zero3_prefetch)) +
                                         " (parallel.zero3_prefetch " +
                                         std::to_string(par.zero3_prefetch) + ")"
                                   : std::string("all (zero3_reshard_after_forward false)")) +
                              "; whole-unit gradients being reduce-scattered)"
                        : "  (whole-unit gradients being reduce-scattered)"));
  } else {
  line("    parameters   " + gib(e.bytes_params));
  line("    gradients    " + gib(e.bytes_grads));
  line("    optimizer    " + gib(e.bytes_optimizer) +
       (mixed ? "  (AdamW m, v, fp32 master weights)" : "  (AdamW m, v)"));
  }
  line("    activations  " + gib(e.bytes_activations) + "  (micro_batch " +
       std::to_string(t.micro_batch) + " x seq_len " + std::to_string(m.seq_len) +
       (cp > 1 ? " / cp " + std::to_string(cp) : std::string()) +
       (par.pp > 1 ? " x " + std::to_string(e.microbatches_held) + " chunk micro-batches in flight"
                   : std::string()) +
       ", saved for backward" +
       (t.recompute == "none" ? std::string()
        : t.recompute == "selective"
            ? std::string("; selective recompute")
            : "; full recompute of " +
                  (t.recompute_layers ? std::to_string(t.recompute_layers) + " layers per stage"
                                      : std::string("every layer"))) +
       (m.n_experts > 0
            ? m.moe_capacity_factor > 0
                  ? std::string("; expert rows at most the capacity's")
                  : std::string("; expert rows of uniform routing: a skewed one adds to them, "
                                "model.moe_capacity_factor bounds them")
            : std::string()) +
       ")");
  if (e.bytes_split > 0)
    line("                 of which " + gib(e.bytes_split) +
         " the split backward's output gradients, kept from B to W");
  if (e.bytes_attention_fallback > 0)
    line("    attention    " + gib(e.bytes_attention_fallback) +
         "  (fp32 scratch: bf16 attention runs the exact kernel, not flash: " +
         e.attention_fallback + ")");
  line("    scratch      " + gib(e.bytes_scratch) +
       "  (one layer's activation gradients, rotary tables, chunk outputs in flight" +
       (e.bytes_ring > 0 ? "; " + trim(gib(e.bytes_ring)) +
                               (cfg.parallel.cp_mode == "ring" ? " the cp ring's K/V and dK/dV buffers"
                                                               : " the cp all-to-all's buffers")
                         : std::string()) +
       ")");
  if (e.bytes_fp8 > 0)
    line("    fp8          " + gib(e.bytes_fp8) +
         (!fp8_weight_cache_on(cfg) ? "  (one GEMM's FP8 weight codes (cast at each use)"
                                    : "  (cached FP8 weight codes") +
         (t.device == "cuda" ? " and their transposes" : "") +
         ", one GEMM's input and gradient codes" +
         (t.device == "cuda" ? "" : ", the CPU emulation's fp32 operand copies") + ")");
  line("    total        " + gib(e.bytes_total));
  if (par.dp * par.cp > 1) {
    // The same layout at every ZeRO level: model state (parameters,
    // gradients, optimizer) and the total (docs/zero.md).
    std::string z = "  ZeRO levels  ";
    for (int64_t level = 0; level <= 3; ++level) {
      RunConfig c = cfg;
      c.parallel.zero = level;
      const MemoryEstimate x = estimate_memory(c, bpp);
      z += (level ? "; " : "") + std::to_string(level) + ": state " +
           trim(gib(x.bytes_params + x.bytes_grads + x.bytes_optimizer)) + ", total " +
           trim(gib(x.bytes_total));
    }
    line(z + (par.pp > 1 ? " (1 micro-batch in flight)" : ""));
  }
  if (replan && replan->bytes_total > e.bytes_total)
    line("  parallel.adapt: a re-plan to a split schedule would hold up to " +
         trim(gib(replan->bytes_total)) + " (pipeline rank " + std::to_string(replan->pp_rank) +
         "); it is taken only within 90% of the device's memory (docs/adaptation.md)");
  return s;
}

}  // namespace adgt
