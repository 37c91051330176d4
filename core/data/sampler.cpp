#include "core/data/sampler.hpp"

#include <stdexcept>
#include <string>

#include "kernels/check.hpp"

namespace adgt {
namespace {

constexpr int kFeistelRounds = 6;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// SplitMix64's finaliser: a bijective 64-bit mixer.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The permutation key of epoch `epoch` under `seed`.
uint64_t epoch_key(uint64_t seed, int64_t epoch) {
  return mix64(mix64(seed) + static_cast<uint64_t>(epoch));
}

}  // namespace

FeistelPermutation::FeistelPermutation(int64_t n, uint64_t key) : n_(n), key_(key) {
  ADGT_CHECK(n >= 1, "FeistelPermutation needs a domain of at least 1 element, got " << n);
  int bits = 2;
  while (bits < 62 && (int64_t{1} << bits) < n) ++bits;
  bits += bits & 1;  // even, so both halves have the same width
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t FeistelPermutation::round_fn(uint64_t half, int round) const {
  const uint64_t round_key = mix64(key_ ^ (kGolden * static_cast<uint64_t>(round + 1)));
  return mix64(half ^ round_key) & half_mask_;
}

int64_t FeistelPermutation::operator()(int64_t x) const {
  ADGT_CHECK(x >= 0 && x < n_, "FeistelPermutation: " << x << " is outside [0, " << n_ << ")");
  if (n_ == 1) return 0;
  uint64_t y = static_cast<uint64_t>(x);
  do {  // cycle-walk: re-apply until the value lands back inside [0, n)
    uint64_t left = y >> half_bits_, right = y & half_mask_;
    for (int r = 0; r < kFeistelRounds; ++r) {
      const uint64_t next = left ^ round_fn(right, r);
      left = right;
      right = next;
    }
    y = (left << half_bits_) | right;
  } while (y >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(y);
}

Sampler::Sampler(const TokenShard& shard, int64_t seq_len, uint64_t seed)
    : shard_(&shard), seq_len_(seq_len), seed_(seed) {
  ADGT_CHECK(seq_len >= 1, "sampler: seq_len=" << seq_len << " must be >= 1");
  if (shard.size() < seq_len + 1)
    throw std::runtime_error("token shard '" + shard.path() + "' has " +
                             std::to_string(shard.size()) +
                             " tokens, fewer than seq_len+1 = " + std::to_string(seq_len + 1) +
                             "; use a shorter model.seq_len or more text");
  windows_ = (shard.size() - 1) / seq_len;
}

int64_t Sampler::window_of(int64_t index) const {
  ADGT_CHECK(index >= 0, "sampler: sample index " << index << " must be >= 0");
  const int64_t epoch = index / windows_, pos = index % windows_;
  return FeistelPermutation(windows_, epoch_key(seed_, epoch))(pos);
}

void Sampler::sample(int64_t index, int32_t* out) const {
  shard_->read(window_of(index) * seq_len_, seq_len_ + 1, out);
}

int64_t num_eval_windows(const TokenShard& shard, int64_t seq_len) {
  ADGT_CHECK(seq_len >= 1, "num_eval_windows: seq_len=" << seq_len << " must be >= 1");
  return shard.size() < seq_len + 1 ? 0 : (shard.size() - 1) / seq_len;
}

void eval_window(const TokenShard& shard, int64_t seq_len, int64_t i, int32_t* out) {
  const int64_t n = num_eval_windows(shard, seq_len);
  ADGT_CHECK(i >= 0 && i < n, "eval window " << i << " of token shard '" << shard.path()
                                             << "' is outside [0, " << n
                                             << ") at seq_len=" << seq_len);
  shard.read(i * seq_len, seq_len + 1, out);
}

}  // namespace adgt
