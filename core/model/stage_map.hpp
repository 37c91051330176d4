// Where the pipeline stages sit on the pipeline ranks (docs/pipeline-schedules.md,
// "Placements"). The model's layers are cut into S = pp x v stages; each rank
// holds v of them, its chunks 0..v-1, in stage order.
//
//   looped (Megatron's interleaving; the only one with v != 2):
//     chunk c of rank r is stage c*pp + r       (rank = s % pp, chunk = s / pp)
//   vee (ZB-V, Qi et al. 2024; v = 2):
//     chunk 0 of rank r is stage r, chunk 1 is stage 2pp-1-r
//
// With vee a micro-batch's forward runs down the ranks and back up: rank 0
// holds the first stage (the embedding) and the last (the head and the loss),
// and rank pp-1 holds stages pp-1 and pp, so the activations turn there
// without leaving the rank. Header-only: the schedule IR (no model) and the
// model's stage slices both read it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace adgt {

enum class StagePlacement : std::uint8_t { looped, vee };

inline const char* stage_placement_name(StagePlacement p) {
  return p == StagePlacement::vee ? "vee" : "looped";
}
inline std::optional<StagePlacement> parse_stage_placement(const std::string& s) {
  if (s == "looped") return StagePlacement::looped;
  if (s == "vee") return StagePlacement::vee;
  return std::nullopt;
}

// Stage of chunk `chunk` of pipeline rank `rank`.
inline int stage_of(StagePlacement p, int pp, int rank, int chunk) {
  if (p == StagePlacement::vee && chunk % 2 == 1) return (chunk + 1) * pp - 1 - rank;
  return chunk * pp + rank;
}
// The rank holding stage s, and which of its chunks it is.
inline int rank_of_stage(StagePlacement p, int pp, int s) {
  if (p == StagePlacement::vee && (s / pp) % 2 == 1) return pp - 1 - s % pp;
  return s % pp;
}
inline int chunk_of_stage(StagePlacement, int pp, int s) { return s / pp; }

// The placement a run's parallel.schedule puts its stages in: zb-v runs on
// vee, every other schedule on looped. A run's placement is fixed when its
// model is built (it decides which layers a rank holds); a re-plan keeps it.
inline StagePlacement placement_of_schedule(const std::string& schedule) {
  return schedule == "zb-v" ? StagePlacement::vee : StagePlacement::looped;
}

}  // namespace adgt
