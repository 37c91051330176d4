// One parallel layout value: how the model and the batch are split over the
// ranks (tp, pp, dp, ep, ZeRO, sequence parallelism, the pipeline schedule,
// its chunks, micro-batches and stage split, the expert placement). Config
// validation, the world-size check, the process groups and the checkpoint's
// shard layout all read it; nothing else writes the rank formula.
//
// Rank order: tp fastest, then dp, then pp; expert parallelism is carved out
// of dp (ep consecutive dp ranks form an ep group). The formula and a worked
// example sit beside the code in core/layout.cpp.
//
// The checks are pure and report every broken rule instead of throwing at the
// first, so a planner can score many candidate layouts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

struct Layout {
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;  // ep divides dp: expert ranks are carved out of dp
  // Context parallelism (docs/context-parallel.md): each sequence split over
  // cp ranks, attention by ring (K/V blocks around the cp ring) or
  // all-to-all (heads scattered, sequence gathered: Ulysses).
  int64_t cp = 1;
  std::string cp_mode = "ring";            // ring | all-to-all
  int64_t zero = 0;                        // ZeRO stage 0-3 over dp x cp (docs/zero.md)
  bool sequence_parallel = false;          // norm/residual regions split along the sequence over tp
  std::string schedule = "1f1b";           // gpipe | 1f1b | interleaved | zb-h1 | zb-v | greedy
  int64_t virtual_stages = 1;              // chunks per pipeline rank
  int64_t microbatches = 0;                // 0: derived from the batch (the accumulation steps)
  std::vector<int64_t> stage_layers;       // layers per stage (pp x virtual_stages); []: balanced
  std::vector<int64_t> expert_placement;   // owner ep rank of each expert; empty: contiguous blocks
  // Sizes are int64_t like the config keys they come from, so a check reports
  // any value read from YAML as it was written; the rank functions below take
  // and give int ranks.
  int64_t world() const { return tp * cp * pp * dp; }
  bool operator==(const Layout&) const = default;
};

// The layout keys of a config (parallel.bucket_mb stays in ParallelConfig: it
// tunes how gradients travel, not where anything lives).
Layout layout_of(const ParallelConfig& p);
Layout layout_of(const RunConfig& cfg);
// The run-file keys that choose the layout and how the step is cut into
// micro-batches ("parallel.tp", ..., "train.micro_batch", "train.recompute",
// "train.recompute_layers"): what the planner chooses (and keeps when the
// user set them) and what an in-memory layout switch may change.
const std::vector<std::string>& layout_keys();
// The inverse: `base` (its bucket_mb kept) with the layout's keys.
ParallelConfig with_layout(ParallelConfig base, const Layout& l);
// The layout as checkpoints record it (meta/layout): "tp=2 dp=2 zero=1
// sequence_parallel=0 pp=2 ep=1 schedule=1f1b virtual_stages=1"; zero and
// sequence_parallel as they take effect (ZeRO-1 needs dp > 1, SP tp > 1),
// the schedule only with pp > 1.
std::string describe(const Layout& l);

// One rank's place. ep and edp follow from dp: ep = dp % layout.ep (the rank
// within its ep group) and edp = dp / layout.ep (the rank within its
// expert-data-parallel group, the dp ranks holding the same experts).
struct RankCoords {
  int tp = 0, dp = 0, pp = 0, ep = 0, edp = 0;
  int cp = 0;  // the rank's place in its cp group (which chunks of each sequence it holds)
  bool operator==(const RankCoords&) const = default;
};

// Both throw (std::runtime_error, via ADGT_CHECK) for sizes < 1, ep not
// dividing dp, or a rank / coordinate outside the layout. rank_of reads tp, cp,
// dp and pp (ep and edp are implied by dp).
RankCoords coords_of(const Layout& l, int rank);
int rank_of(const Layout& l, const RankCoords& c);

// cp: the ranks holding the chunks of the same sequences (the same tp, dp and
// pp coordinates); dpcp: the ranks holding the same weights of one stage's tp
// shard, dp x cp of them (gradients are reduced over it; dp when cp = 1),
// ordered ep fastest, then cp, then edp (cp, then dp, when ep = 1); edpcp:
// of them, those holding the same experts (the same ep coordinate), edp x cp
// (expert gradients are reduced over it; edp when cp = 1), cp fastest.
enum class Group { tp, dp, pp, ep, edp, world, cp, dpcp, edpcp };
const char* group_name(Group g);  // "tp", "dp", ..., "world", "cp", "dpcp", "edpcp"
// World ranks of the g group containing `rank`, in group-rank order (group
// rank k is entry k); this rank's group rank is group_rank(l, g, rank).
std::vector<int> group_ranks(const Layout& l, Group g, int rank);
int group_rank(const Layout& l, Group g, int rank);

// A broken layout rule: the key it is about and the message (the text after
// "<config file>: " in the ConfigError that validate() throws).
struct LayoutIssue {
  std::string key;      // "parallel.tp"
  std::string message;  // "parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}"
};

// Every rule the layout breaks for this model and batch, in the order
// validate() checks them (so the first is the one validate() reports). A rule
// whose premise an earlier issue already broke is not evaluated: with a batch
// that does not split into micro-batches, the micro-batch-count rules are
// skipped; sizes < 1 stop the check. Assumes the model and train keys pass
// their own checks (validate() runs those first).
std::vector<LayoutIssue> layout_errors(const ModelConfig& m, const TrainConfig& t,
                                       const Layout& l);
// The first of layout_errors(), or none.
std::optional<std::string> layout_error(const ModelConfig& m, const TrainConfig& t,
                                        const Layout& l);
// The launch rule: tp * cp * pp * dp must equal the number of ranks.
std::optional<std::string> world_error(const Layout& l, int64_t world_size);

}  // namespace adgt
