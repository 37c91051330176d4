// The training order, as a pure function of (seed, global sample index), so a
// run reads the same sequence whatever its data-parallel size (rank r of n
// reads indices r, r+n, r+2n, ... of the one global order).
//
// A shard of S tokens is cut into W = (S-1)/seq_len windows of seq_len+1
// tokens; window w covers tokens [w*seq_len, w*seq_len + seq_len] (inputs are
// the first seq_len, targets the last seq_len). Global sample index i is in
// epoch e = i / W at position p = i % W and reads window perm(seed, e)(p),
// where perm is a keyed bijection of [0, W): a 6-round balanced Feistel
// network on the smallest even-bit power-of-4 domain >= W, cycle-walked back
// into [0, W). So every epoch visits every window exactly once, and each epoch
// has its own order. docs/data-format.md has the exact round function.
#pragma once
#include <cstdint>

#include "core/data/token_shard.hpp"

namespace adgt {

// The keyed permutation of [0, n) the sampler uses; exposed for tests/docs.
class FeistelPermutation {
 public:
  FeistelPermutation(int64_t n, uint64_t key);
  int64_t operator()(int64_t x) const;  // x in [0, n) -> [0, n), bijective
  int64_t size() const { return n_; }

 private:
  uint64_t round_fn(uint64_t half, int round) const;
  int64_t n_;
  uint64_t key_;
  int half_bits_;
  uint64_t half_mask_;
};

class Sampler {
 public:
  // Keeps a reference to `shard`, which must outlive the sampler. Throws,
  // naming the file, if the shard has fewer than seq_len+1 tokens.
  Sampler(const TokenShard& shard, int64_t seq_len, uint64_t seed);
  int64_t windows_per_epoch() const { return windows_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  // Which window global sample `index` (>= 0) reads.
  int64_t window_of(int64_t index) const;
  // out[0, seq_len] = the seq_len+1 tokens of window_of(index).
  void sample(int64_t index, int32_t* out) const;

 private:
  const TokenShard* shard_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t windows_;
};

// Validation reads the windows of the val shard in order: window i covers
// tokens [i*seq_len, i*seq_len + seq_len]. (S-1)/seq_len of them (0 when the
// shard is too short).
int64_t num_eval_windows(const TokenShard& shard, int64_t seq_len);
// out[0, seq_len] = eval window i; throws unless 0 <= i < num_eval_windows.
void eval_window(const TokenShard& shard, int64_t seq_len, int64_t i, int32_t* out);

}  // namespace adgt
