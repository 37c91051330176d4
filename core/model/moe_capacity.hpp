// Expert capacity groups that span ranks (context parallelism).
//
// One process cuts its micro-batch's token rows into capacity groups in
// token order (model.moe_capacity_segment rows each, or the whole
// micro-batch) and keeps, per group and expert, the first cap assignments
// (MoeLayer, Backend::moe_dispatch_plan). Under context parallelism a rank
// holds only chunks of each sequence (parallel/cp/chunks.hpp), so a group
// may lie partly on other ranks. Its rows are then cut into runs that each
// lie in one group and one chunk; every rank counts each run's assignments
// per expert, the counts are all-gathered over the cp group with each run's
// place in the micro-batch, and each run starts from the group's
// assignments before it (its prior): the drops are the single process's,
// rank by rank.
#pragma once
#include <cstdint>
#include <vector>

#include "core/comm.hpp"

namespace adgt {

// How a rank's rows sit in the micro-batch. A rank's N rows are B sequences
// of positions.size() tokens, row b * positions.size() + j at position
// positions[j] of a sequence of seq_len tokens; the rest of each sequence is
// on the other ranks of `group`. The positions come in chunks of `chunk`
// consecutive tokens, each starting at a multiple of `chunk` (the same on
// every rank of the group: the runs, and so the all-gather, are then the
// same size on each, even where a rank's two chunks happen to be adjacent).
struct MoeSequenceSplit {
  Comm* group = nullptr;           // nullptr or one rank: no split
  std::vector<int64_t> positions;  // ascending, each < seq_len
  int64_t seq_len = 0;
  int64_t chunk = 0;
};

// The runs of a call of N rows of a split (s.positions, s.seq_len; s.group
// is not used) under a capacity of `segment` rows per group (0: the whole
// micro-batch, B x seq_len rows).
struct MoeCapacityRuns {
  int64_t run = 0;         // rows per run (divides N)
  int64_t group_rows = 0;  // rows per capacity group
  // False when every group lies in one run on this rank (the segment
  // divides the chunks): the plan needs no counts from other ranks.
  bool spans = false;
};
MoeCapacityRuns moe_capacity_runs(const MoeSequenceSplit& s, int64_t segment, int64_t N);

// The expert rows a rank's MoE buffers are sized for (MoeLayer::grow; the
// memory estimate counts the same): with capacity factor `factor` > 0 each of
// the P senders keeps at most moe_capacity_limit rows of each of the El held
// experts per capacity group of `segment` rows (0: the whole N), so the
// rank receives at most P x El x min(N, the groups' limits), and never more
// than P x N x min(k, El); dropless (factor <= 0), the uniform routing's
// N x k, which a skewed routing exceeds.
int64_t moe_recv_reserve(double factor, int64_t segment, int64_t N, int64_t k, int64_t E, int64_t P,
                         int64_t El);

// Each run's first row's index in the micro-batch (b x seq_len + position).
std::vector<int64_t> moe_run_starts(const MoeSequenceSplit& s, int64_t run, int64_t N);

// Assignments per run and expert ((N / run) x E), from choice (N x k, host).
std::vector<int64_t> moe_run_counts(const int32_t* choice, int64_t N, int64_t k, int64_t E,
                                    int64_t run);

// The priors of rank `rank`'s runs ((R x E) int32): `gathered` holds every
// rank's R rows of [start, count per expert] (P x R x (E + 1), rank order);
// a run's prior for expert e is the count of e in the runs of its group
// (start / group_rows) with a smaller start, on any rank.
std::vector<int32_t> moe_run_priors(const std::vector<double>& gathered, int rank, int P,
                                    int64_t R, int64_t E, int64_t group_rows);

}  // namespace adgt
