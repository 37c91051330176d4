// The parallel layout: the one rank formula, the groups it implies, and the
// layout rules that config validation and a planner share.
#include "core/layout.hpp"

#include <climits>
#include <numeric>

#include "kernels/check.hpp"

namespace adgt {

const std::vector<std::string>& layout_keys() {
  static const std::vector<std::string> k = {
      "parallel.tp",           "parallel.pp",           "parallel.dp",
      "parallel.ep",           "parallel.cp",           "parallel.cp_mode",
      "parallel.zero",         "parallel.sequence_parallel",
      "parallel.schedule",     "parallel.virtual_stages", "parallel.stage_layers",
      "parallel.microbatches", "parallel.expert_placement", "train.micro_batch",
      "train.recompute",       "train.recompute_layers"};
  return k;
}

Layout layout_of(const ParallelConfig& p) {
  return Layout{.tp = p.tp, .pp = p.pp, .dp = p.dp, .ep = p.ep, .cp = p.cp,
                .cp_mode = p.cp_mode, .zero = p.zero,
                .sequence_parallel = p.sequence_parallel, .schedule = p.schedule,
                .virtual_stages = p.virtual_stages, .microbatches = p.microbatches,
                .stage_layers = p.stage_layers, .expert_placement = p.expert_placement};
}

Layout layout_of(const RunConfig& cfg) { return layout_of(cfg.parallel); }

ParallelConfig with_layout(ParallelConfig p, const Layout& l) {
  p.tp = l.tp, p.pp = l.pp, p.dp = l.dp, p.ep = l.ep, p.zero = l.zero;
  p.cp = l.cp, p.cp_mode = l.cp_mode;
  p.sequence_parallel = l.sequence_parallel;
  p.schedule = l.schedule;
  p.virtual_stages = l.virtual_stages;
  p.microbatches = l.microbatches;
  p.stage_layers = l.stage_layers;
  p.expert_placement = l.expert_placement;
  return p;
}

std::string describe(const Layout& l) {
  std::string s = "tp=" + std::to_string(l.tp) + " dp=" + std::to_string(l.dp) +
                  " zero=" + std::to_string(l.dp * l.cp > 1 ? l.zero : 0) +
                  " sequence_parallel=" + std::to_string(l.sequence_parallel && l.tp > 1 ? 1 : 0) +
                  " pp=" + std::to_string(l.pp) + " ep=" + std::to_string(l.ep);
  if (l.pp > 1) s += " schedule=" + l.schedule + " virtual_stages=" + std::to_string(l.virtual_stages);
  if (l.cp > 1) s += " cp=" + std::to_string(l.cp) + " cp_mode=" + l.cp_mode;
  return s;
}

// ------------------------------------------------------------ rank layout
//
// tp fastest, then cp, then dp, then pp; ep is carved out of dp:
//
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
//   ep_rank = dp_rank % ep,  edp_rank = dp_rank / ep
//
// cp next to tp: its ring exchanges K/V every attention layer, so a cp group
// stays inside a node after the tp groups (with cp = 1 the formula is the
// one before context parallelism: rank = tp_rank + tp * (dp_rank + dp * pp_rank)).
//
// Worked example, 16 ranks with tp=2, dp=4, pp=2, ep=2:
//   rank  0: tp 0 dp 0 pp 0 (ep 0 edp 0)     rank  8: tp 0 dp 0 pp 1
//   rank  1: tp 1 dp 0 pp 0 (ep 0 edp 0)     rank  9: tp 1 dp 0 pp 1
//   rank  2: tp 0 dp 1 pp 0 (ep 1 edp 0)     ...
//   rank  4: tp 0 dp 2 pp 0 (ep 0 edp 1)
//   rank  7: tp 1 dp 3 pp 0 (ep 1 edp 1)     rank 15: tp 1 dp 3 pp 1
//   tp groups:  {0,1} {2,3} ... {14,15}          (consecutive pairs: one node's NVLink)
//   dp groups:  {0,2,4,6} {1,3,5,7} {8,10,12,14} {9,11,13,15}
//   pp groups:  {0,8} {1,9} ... {7,15}
//   ep groups:  {0,2} {4,6} {1,3} {5,7} ...      (ep consecutive dp ranks)
//   edp groups: {0,4} {2,6} {1,5} {3,7} ...      (the dp ranks with the same ep rank)
//
// With tp=2, cp=2, dp=2 (8 ranks): rank 0 tp 0 cp 0 dp 0, rank 1 tp 1 cp 0,
// rank 2 tp 0 cp 1, rank 3 tp 1 cp 1, rank 4 tp 0 cp 0 dp 1 ...;
//   cp groups {0,2} {1,3} {4,6} {5,7}; dp groups {0,4} {1,5} {2,6} {3,7};
//   dpcp groups {0,2,4,6} {1,3,5,7} (in the order cp fastest, then dp).
// With ep=2 as well (dp 0 and 1 one ep group): dpcp groups {0,4,2,6} {1,5,3,7}
// (ep fastest, then cp, then edp: a checkpoint sees dp x cp replicas whose
// ep rank is their place modulo ep, as without cp); edpcp groups {0,2} {4,6}
// {1,3} {5,7} (the cp ranks of each edp group).

namespace {

void check_sizes(const Layout& l) {
  ADGT_CHECK(l.tp >= 1 && l.dp >= 1 && l.pp >= 1 && l.ep >= 1 && l.cp >= 1,
             "parallel: tp=" << l.tp << " cp=" << l.cp << " dp=" << l.dp << " pp=" << l.pp
                             << " ep=" << l.ep << ": every size must be >= 1");
  ADGT_CHECK(l.dp % l.ep == 0, "parallel: ep=" << l.ep << " does not divide dp=" << l.dp);
  ADGT_CHECK(l.tp <= INT_MAX / l.dp / l.pp / l.cp,
             "parallel: tp=" << l.tp << " x cp=" << l.cp << " x dp=" << l.dp << " x pp=" << l.pp
                             << " is more ranks than an int counts");
}

void check_rank(const Layout& l, int rank) {
  check_sizes(l);
  ADGT_CHECK(rank >= 0 && rank < l.world(),
             "parallel: rank " << rank << " is outside tp=" << l.tp
                               << (l.cp > 1 ? " x cp=" + std::to_string(l.cp) : std::string())
                               << " x dp=" << l.dp << " x pp=" << l.pp << " = " << l.world()
                               << " ranks");
}

}  // namespace

RankCoords coords_of(const Layout& l, int rank) {
  check_rank(l, rank);
  const int tp = int(l.tp), cp = int(l.cp), dp = int(l.dp), ep = int(l.ep);
  RankCoords c;
  c.tp = rank % tp;
  c.cp = rank / tp % cp;
  c.dp = rank / (tp * cp) % dp;
  c.pp = rank / (tp * cp * dp);
  c.ep = c.dp % ep;
  c.edp = c.dp / ep;
  return c;
}

int rank_of(const Layout& l, const RankCoords& c) {
  check_sizes(l);
  ADGT_CHECK(c.tp >= 0 && c.tp < l.tp && c.cp >= 0 && c.cp < l.cp && c.dp >= 0 && c.dp < l.dp &&
                 c.pp >= 0 && c.pp < l.pp,
             "parallel: coordinates tp " << c.tp << (l.cp > 1 ? " cp " + std::to_string(c.cp) : "")
                                         << " dp " << c.dp << " pp " << c.pp << " are outside tp="
                                         << l.tp
                                         << (l.cp > 1 ? " cp=" + std::to_string(l.cp) : std::string())
                                         << " dp=" << l.dp << " pp=" << l.pp);
  return c.tp + int(l.tp) * (c.cp + int(l.cp) * (c.dp + int(l.dp) * c.pp));
}

const char* group_name(Group g) {
  switch (g) {
    case Group::tp: return "tp";
    case Group::dp: return "dp";
    case Group::pp: return "pp";
    case Group::ep: return "ep";
    case Group::edp: return "edp";
    case Group::world: return "world";
    case Group::cp: return "cp";
    case Group::dpcp: return "dpcp";
    case Group::edpcp: return "edpcp";
  }
  return "?";
}

std::vector<int> group_ranks(const Layout& l, Group g, int rank) {
  const RankCoords me = coords_of(l, rank);
  // Group member k: this rank's coordinates with the group's own one set to k.
  auto member = [&](int k) {
    RankCoords c = me;
    switch (g) {
      case Group::tp: c.tp = k; break;
      case Group::dp: c.dp = k; break;
      case Group::pp: c.pp = k; break;
      case Group::ep: c.dp = me.edp * int(l.ep) + k; break;  // ep consecutive dp ranks
      case Group::edp: c.dp = k * int(l.ep) + me.ep; break;  // same ep rank, every ep block
      case Group::world: return k;
      case Group::cp: c.cp = k; break;
      case Group::dpcp: {  // ep fastest, then cp, then edp
        const int e = k % int(l.ep), r = k / int(l.ep);
        c.cp = r % int(l.cp), c.dp = (r / int(l.cp)) * int(l.ep) + e;
        break;
      }
      case Group::edpcp: c.cp = k % int(l.cp), c.dp = (k / int(l.cp)) * int(l.ep) + me.ep; break;
    }
    return rank_of(l, c);
  };
  const int64_t n = g == Group::tp     ? l.tp
                    : g == Group::dp   ? l.dp
                    : g == Group::pp   ? l.pp
                    : g == Group::ep   ? l.ep
                    : g == Group::edp  ? l.dp / l.ep
                    : g == Group::cp   ? l.cp
                    : g == Group::dpcp ? l.dp * l.cp
                    : g == Group::edpcp ? l.dp / l.ep * l.cp
                                       : l.world();
  std::vector<int> out;
  for (int k = 0; k < int(n); ++k) out.push_back(member(k));
  return out;
}

int group_rank(const Layout& l, Group g, int rank) {
  const RankCoords c = coords_of(l, rank);
  switch (g) {
    case Group::tp: return c.tp;
    case Group::dp: return c.dp;
    case Group::pp: return c.pp;
    case Group::ep: return c.ep;
    case Group::edp: return c.edp;
    case Group::world: return rank;
    case Group::cp: return c.cp;
    case Group::dpcp: return c.ep + int(l.ep) * (c.cp + int(l.cp) * c.edp);
    case Group::edpcp: return c.cp + int(l.cp) * c.edp;
  }
  return rank;
}

// ------------------------------------------------------------ layout rules

namespace {

std::string num(int64_t x) { return std::to_string(x); }

// {1,2,4}
std::string set_text(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + num(v[i]);
  return s + "}";
}

// The first 12 divisors of n: {1,2,4,8}
std::string divisors_text(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n && d.size() < 12; ++i)
    if (n % i == 0) d.push_back(i);
  return set_text(d);
}

// An int list as the config writes it: [3, 3, 2]
std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i]);
  return s + "]";
}

// The rules in the order validate() checks them; each adds its issue to `out`.
struct Checker {
  const ModelConfig& m;
  const TrainConfig& t;
  const Layout& l;
  std::vector<LayoutIssue> out;
  bool batch_exact = true;  // the global batch splits into micro-batches exactly

  void add(const std::string& key, std::string message) {
    out.push_back({key, std::move(message)});
  }

  // Sizes the rest divides by (validate()'s per-key ranges catch them first).
  bool sizes_ok() {
    const std::pair<const char*, int64_t> sizes[] = {
        {"parallel.tp", l.tp}, {"parallel.pp", l.pp}, {"parallel.dp", l.dp},
        {"parallel.ep", l.ep}, {"parallel.cp", l.cp}, {"parallel.virtual_stages", l.virtual_stages},
        {"train.micro_batch", t.micro_batch}};
    for (const auto& [key, v] : sizes)
      if (v < 1) add(key, std::string(key) + "=" + num(v) + ": must be >= 1");
    return out.empty();
  }

  void batch() {
    const int64_t per_pass = t.micro_batch * l.dp;
    if (t.global_batch % per_pass == 0) return;
    batch_exact = false;
    const int64_t lo = t.global_batch / per_pass * per_pass, hi = lo + per_pass;
    add("train.global_batch",
        "train.global_batch=" + num(t.global_batch) + " is not a multiple of train.micro_batch=" +
            num(t.micro_batch) + " x parallel.dp=" + num(l.dp) + "; use " +
            (lo > 0 ? num(lo) + " or " : std::string()) + num(hi));
  }

  // Mixture-of-experts and expert-parallel rules.
  void experts() {
    if (m.n_experts == 0) {
      if (m.moe_bias_init_zipf > 0)
        add("model.moe_bias_init_zipf",
            "model.moe_bias_init_zipf is set but model.n_experts=0; remove it or set "
            "model.n_experts");
      if (l.ep != 1)
        add("parallel.ep", "parallel.ep=" + num(l.ep) +
                               " needs a mixture-of-experts model; set model.n_experts (e.g. 8) or "
                               "parallel.ep: 1");
      if (!l.expert_placement.empty())
        add("parallel.expert_placement",
            "parallel.expert_placement is set but model.n_experts=0; remove it or set "
            "model.n_experts");
      return;
    }
    if (m.moe_bias_init_zipf > 0 && !m.moe_aux_free)
      add("model.moe_bias_init_zipf",
          "model.moe_bias_init_zipf=" + fmt_real(m.moe_bias_init_zipf) +
              " sets the initial selection bias of aux-loss-free routing; set model.moe_aux_free: "
              "true (and moe_bias_rate: 0 to keep the skew) or moe_bias_init_zipf: 0");
    if (m.moe_top_k > m.n_experts)
      add("model.moe_top_k", "model.moe_top_k=" + num(m.moe_top_k) +
                                 " is larger than model.n_experts=" + num(m.n_experts) +
                                 "; use moe_top_k <= " + num(m.n_experts));
    const bool ep_splits_experts = m.n_experts % l.ep == 0;
    if (!ep_splits_experts)
      add("parallel.ep", "parallel.ep=" + num(l.ep) + " does not divide model.n_experts=" +
                             num(m.n_experts) + "; use ep in " + divisors_text(m.n_experts));
    if (l.dp % l.ep != 0)
      add("parallel.ep", "parallel.ep=" + num(l.ep) + " does not divide parallel.dp=" + num(l.dp) +
                             " (expert-parallel ranks are carved out of the data-parallel "
                             "group); use ep in " +
                             divisors_text(std::gcd(l.dp, m.n_experts)));
    if (l.ep > 1 && l.zero == 1)
      add("parallel.zero", "parallel.zero=" + num(l.zero) + " with parallel.ep=" + num(l.ep) +
                               " is not supported yet (expert weights differ across the "
                               "data-parallel group); use zero: 0, 2 or 3");
    if (m.expert_ffn() % l.tp != 0)
      add("parallel.tp", "parallel.tp=" + num(l.tp) + " does not divide the expert FFN size " +
                             num(m.expert_ffn()) + " (model.expert_ffn_hidden, or ffn_hidden)");
    const auto& pl = l.expert_placement;
    if (pl.empty()) return;
    if (int64_t(pl.size()) != m.n_experts) {
      add("parallel.expert_placement",
          "parallel.expert_placement has " + num(int64_t(pl.size())) +
              " entries; it needs one owner ep rank per expert (model.n_experts=" +
              num(m.n_experts) + ")");
      return;
    }
    for (size_t e = 0; e < pl.size(); ++e)
      if (pl[e] < 0 || pl[e] >= l.ep) {
        add("parallel.expert_placement", "parallel.expert_placement entry " + std::to_string(e) +
                                             " is " + num(pl[e]) + "; owners are ep ranks 0.." +
                                             num(l.ep - 1));
        return;
      }
    if (!ep_splits_experts) return;  // no equal share to count against
    std::vector<int64_t> count(size_t(l.ep), 0);
    for (int64_t r : pl) ++count[size_t(r)];
    for (int64_t r = 0; r < l.ep; ++r)
      if (count[size_t(r)] != m.n_experts / l.ep) {
        add("parallel.expert_placement",
            "parallel.expert_placement gives ep rank " + num(r) + " " + num(count[size_t(r)]) +
                " experts; every rank needs n_experts/ep = " + num(m.n_experts / l.ep));
        return;
      }
  }

  // ZeRO, tensor and sequence parallelism.
  void dense() {
    if (l.zero < 0 || l.zero > 3)
      add("parallel.zero", "parallel.zero=" + num(l.zero) +
                               ": ZeRO stages are 0, 1, 2 and 3");
    const std::pair<const char*, int64_t> split[] = {
        {"model.n_heads", m.n_heads}, {"model.n_kv_heads", m.n_kv_heads},
        {"model.ffn_hidden", m.ffn_hidden}};
    const int64_t all_three = std::gcd(std::gcd(m.n_heads, m.n_kv_heads), m.ffn_hidden);
    for (const auto& [name, v] : split)
      if (v % l.tp != 0) {  // one issue: the fix names every tp that divides all three
        add("parallel.tp", "parallel.tp=" + num(l.tp) + " does not divide " + name + "=" + num(v) +
                               "; use tp in " + divisors_text(all_three));
        break;
      }
    const int64_t local_seq = m.seq_len % l.cp == 0 ? m.seq_len / l.cp : m.seq_len;
    if (l.sequence_parallel && l.tp > 1 && (t.micro_batch * local_seq) % l.tp != 0)
      add("parallel.sequence_parallel",
          "parallel.sequence_parallel needs train.micro_batch x model.seq_len" +
              std::string(l.cp > 1 ? " / parallel.cp" : "") + " = " +
              num(t.micro_batch * local_seq) + " tokens divisible by parallel.tp=" + num(l.tp));
  }

  // Context parallelism (parallel.cp, cp_mode; docs/context-parallel.md).
  void context() {
    if (l.cp_mode != "ring" && l.cp_mode != "all-to-all")
      add("parallel.cp_mode",
          "parallel.cp_mode='" + l.cp_mode + "': use ring or all-to-all");
    if (l.cp == 1) return;
    // Each rank holds chunks r and 2cp-1-r of every sequence: 2cp equal chunks.
    if (m.seq_len % (2 * l.cp) != 0) {
      std::vector<int64_t> fit;
      for (int64_t c = 1; 2 * c <= m.seq_len && fit.size() < 12; ++c)
        if (m.seq_len % (2 * c) == 0) fit.push_back(c);
      add("parallel.cp", "parallel.cp=" + num(l.cp) + " needs model.seq_len=" + num(m.seq_len) +
                             " divisible by 2 x cp = " + num(2 * l.cp) +
                             " (each rank holds two of 2 x cp equal chunks of a sequence); use cp in " +
                             (fit.empty() ? std::string("{1}") : set_text(fit)));
    }
    if (l.cp_mode == "all-to-all") {
      // Ulysses: each rank of the cp group takes heads/cp of the (tp-local)
      // heads for the whole sequence.
      const int64_t h = m.n_heads % l.tp == 0 ? m.n_heads / l.tp : m.n_heads;
      const int64_t kv = m.n_kv_heads % l.tp == 0 ? m.n_kv_heads / l.tp : m.n_kv_heads;
      if (h % l.cp != 0 || kv % l.cp != 0)
        add("parallel.cp_mode",
            "parallel.cp_mode=all-to-all scatters the attention heads over the cp ranks: it needs "
            "model.n_heads / tp = " + num(h) + " and model.n_kv_heads / tp = " + num(kv) +
                " divisible by parallel.cp=" + num(l.cp) + "; use cp in " +
                divisors_text(std::gcd(h, kv)) + " or cp_mode: ring");
    }
  }

  // Pipeline rules (parallel.pp, schedule, microbatches, virtual_stages,
  // stage_layers). The micro-batch counts are exact only when batch() passed.
  void pipeline() {
    const int64_t mb = t.global_batch / (t.micro_batch * l.dp);  // the accumulation steps
    const int64_t per_mb = t.micro_batch * l.dp;  // sequences per pipeline micro-batch, all dp
    // "train.global_batch=16 / (train.micro_batch=8 x parallel.dp=1) = 2"
    const std::string batch = "train.global_batch=" + num(t.global_batch) +
                              " / (train.micro_batch=" + num(t.micro_batch) +
                              " x parallel.dp=" + num(l.dp) + ") = " + num(mb);

    if (batch_exact && l.microbatches > 0 && l.microbatches != mb)
      add("parallel.microbatches",
          "parallel.microbatches=" + num(l.microbatches) + " does not match " + batch +
              " accumulation steps, which are the pipeline's micro-batches; set "
              "train.global_batch=" + num(l.microbatches * per_mb) + " (= " +
              num(l.microbatches) + " x " + num(t.micro_batch) + " x " + num(l.dp) +
              "), or parallel.microbatches=0 to derive it");

    // Schedule and chunks per rank.
    const int64_t v = l.virtual_stages;
    if (l.schedule == "interleaved") {
      if (l.pp < 2)
        add("parallel.pp", "parallel.pp=" + num(l.pp) +
                               ": the interleaved schedule needs at least 2 pipeline ranks; use "
                               "pp >= 2, or parallel.schedule=1f1b with parallel.virtual_stages=1");
      if (v < 2)
        add("parallel.virtual_stages",
            "parallel.virtual_stages=" + num(v) +
                ": the interleaved schedule needs at least 2 chunks per rank; use "
                "virtual_stages >= 2, or parallel.schedule=1f1b");
    } else if (l.schedule == "zb-v") {
      // ZB-V's V-shaped placement: rank r holds stages r and 2pp-1-r
      // (core/model/stage_map.hpp), exactly two chunks per rank.
      if (l.pp < 2)
        add("parallel.pp", "parallel.pp=" + num(l.pp) +
                               ": the zb-v schedule needs at least 2 pipeline ranks (it places two stages "
                               "on each in a V); use pp >= 2, or parallel.schedule=1f1b");
      if (v != 2)
        add("parallel.virtual_stages",
            "parallel.virtual_stages=" + num(v) +
                ": the zb-v schedule places exactly 2 chunks per rank (stages r and 2pp-1-r); use "
                "virtual_stages=2");
    } else if (v > 1 && l.schedule == "greedy") {
      if (l.pp < 2)
        add("parallel.pp", "parallel.pp=" + num(l.pp) + ": greedy with parallel.virtual_stages=" + num(v) +
                               " needs at least 2 pipeline ranks; use pp >= 2, or virtual_stages=1");
    } else if (v > 1) {
      add("parallel.virtual_stages",
          "parallel.virtual_stages=" + num(v) + " needs parallel.schedule=interleaved, greedy or zb-v (got " +
              l.schedule + "); use virtual_stages=1, or schedule=interleaved, greedy or zb-v");
    }

    if (l.pp > 1) {
      if (m.tie_embeddings)
        add("model.tie_embeddings",
            "model.tie_embeddings=true with parallel.pp=" + num(l.pp) +
                (l.schedule == "zb-v"
                     ? ": zb-v puts the embedding (stage 0) and lm_head (stage " + num(2 * l.pp - 1) +
                           ") on pipeline rank 0 but in different chunks, whose gradients are "
                           "reduced separately, so they cannot share one weight; "
                     : ": the embedding (first stage) and lm_head (last stage) live on different "
                       "pipeline ranks and cannot share one weight; ") +
                "set model.tie_embeddings: false or parallel.pp: 1");
      const bool needs_pp =
          l.schedule == "1f1b" || l.schedule == "zb-h1" || l.schedule == "interleaved";
      if (batch_exact && needs_pp && mb < l.pp) {
        add("train.global_batch",
            "parallel.schedule=" + l.schedule + " with parallel.pp=" + num(l.pp) +
                ": fewer micro-batches than stages (" + batch + ", need >= " + num(l.pp) +
                "); use train.global_batch >= " + num(l.pp * per_mb) +
                ", or parallel.schedule=gpipe");
      } else if (batch_exact && l.schedule == "interleaved" && mb % l.pp != 0) {
        const int64_t lo = mb / l.pp * l.pp, hi = lo + l.pp;
        add("train.global_batch",
            "parallel.schedule=interleaved with parallel.pp=" + num(l.pp) +
                ": the micro-batches (" + batch +
                ") run in groups of pp and must be a multiple of " + num(l.pp) +
                "; use train.global_batch=" + num(lo * per_mb) + " or " +
                num(hi * per_mb));
      }
    }

    // Layers per stage.
    const int64_t stages = l.pp * v;
    const std::string stages_text = "parallel.pp x parallel.virtual_stages = " + num(l.pp) +
                                    " x " + num(v) + " = " + num(stages) +
                                    (stages == 1 ? " stage" : " stages");
    const bool enough_layers = m.n_layers >= stages;
    if (!enough_layers)
      add("parallel.pp", "model.n_layers=" + num(m.n_layers) + " is fewer than " + stages_text +
                             " (each stage needs at least one layer); use pp x virtual_stages <= " +
                             num(m.n_layers));
    const auto& sl = l.stage_layers;
    if (!sl.empty()) {
      if (int64_t(sl.size()) != stages) {
        add("parallel.stage_layers",
            "parallel.stage_layers=" + list_text(sl) + " has " + num(int64_t(sl.size())) +
                (sl.size() == 1 ? " entry" : " entries") + ", but " + stages_text + "; " +
                (stages == 1 ? "with one stage the only list is [" + num(m.n_layers) +
                                   "] (model.n_layers), or [] to leave it out"
                             : "give one layer count per stage, or [] to balance by cost"));
      } else if (const int64_t sum = std::accumulate(sl.begin(), sl.end(), int64_t{0});
                 sum != m.n_layers) {
        add("parallel.stage_layers",
            "parallel.stage_layers=" + list_text(sl) + " sums to " + num(sum) +
                ", but model.n_layers=" + num(m.n_layers) + "; make the counts add up to " +
                num(m.n_layers) + ", or use [] to balance by cost");
      }
    } else if (enough_layers && v > 1 && m.n_layers % stages != 0) {
      std::vector<int64_t> ok;
      for (int64_t d = 2; d * l.pp <= m.n_layers && ok.size() < 12; ++d)
        if (m.n_layers % (d * l.pp) == 0) ok.push_back(d);
      add("parallel.virtual_stages",
          "model.n_layers=" + num(m.n_layers) + " is not divisible by " + stages_text +
              ": without parallel.stage_layers every interleaved stage holds the same number of "
              "layers; " +
              (ok.empty() ? "no virtual_stages >= 2 does that with pp=" + num(l.pp)
                          : "use virtual_stages in " + set_text(ok)) +
              ", or list the layers per stage in parallel.stage_layers");
    }
  }
};

}  // namespace

std::vector<LayoutIssue> layout_errors(const ModelConfig& m, const TrainConfig& t,
                                       const Layout& l) {
  Checker c{m, t, l, {}};
  if (!c.sizes_ok()) return c.out;
  c.batch();
  c.experts();
  c.dense();
  c.context();
  c.pipeline();
  return c.out;
}

std::optional<std::string> layout_error(const ModelConfig& m, const TrainConfig& t,
                                        const Layout& l) {
  std::vector<LayoutIssue> all = layout_errors(m, t, l);
  if (all.empty()) return std::nullopt;
  return all.front().message;
}

std::optional<std::string> world_error(const Layout& l, int64_t world_size) {
  const int64_t want = l.world();
  if (want == world_size) return std::nullopt;
  std::string alt;
  const int64_t fixed = l.tp * l.pp * l.cp;  // all but dp
  if (fixed > 0 && world_size % fixed == 0)
    alt = "; with tp=" + num(l.tp) + (l.cp > 1 ? " cp=" + num(l.cp) : std::string()) +
          " pp=" + num(l.pp) + " use dp=" + num(world_size / fixed);
  return "parallel.tp=" + num(l.tp) + (l.cp > 1 ? " x cp=" + num(l.cp) : std::string()) +
         " x pp=" + num(l.pp) + " x dp=" + num(l.dp) + " = " + num(want) +
         " ranks, but the launch has " + num(world_size) + " (mpirun -np / srun -n)" + alt;
}

}  // namespace adgt
