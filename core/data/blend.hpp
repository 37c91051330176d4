// Weighted blends of token files (docs/data-format.md, "Blends"):
// data.train names one token file, or several with weights in the form
// "0.7 PATH_A 0.3 PATH_B" (weights > 0, normalised; a directory stands for
// its train.bin), or, in YAML, a list of {path, weight} maps that the config
// turns into that text (core/config_blend.hpp). data.val takes the same forms
// (a directory stands for its val.bin there) and is evaluated per source. The blend is a pure function of (seed, global sample
// index), like the sampler of one file, so the order is the same for any
// layout and a resume continues it exactly:
//
//   The index space is cut into periods of kBlendPeriod samples. In every
//   period source s gets n_s samples (n_s = w_s * P rounded by largest
//   remainder, ties to the lower source), interleaved by the largest
//   deficit: position j goes to the source s with the largest
//   n_s * (j+1) / P - (its samples so far in the period), ties to the lower
//   source. Sample i is then source s = table[i % P]'s sample number
//   k = (i / P) * n_s + (its samples before i in the period), read by that
//   source's own Sampler (seed: train.seed for source 0, a fixed offset of
//   it for each further source).
//
// With one source the blend is the plain Sampler: sample i is window i's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/data/sampler.hpp"
#include "core/data/token_shard.hpp"

namespace adgt {

inline constexpr int64_t kBlendPeriod = 4096;

struct BlendSource {
  std::string path;
  double weight = 1;  // normalised: the weights sum to 1
};

// data.train's (or data.val's) value as sources. `key` names the setting in
// errors. Throws std::runtime_error on an odd list, a weight that is not a
// positive number, or a path given twice.
std::vector<BlendSource> parse_blend(const std::string& value, const std::string& key);
// The same with the weights as written (not normalised; 1 for a lone path).
std::vector<BlendSource> parse_blend_as_written(const std::string& value, const std::string& key);
// The shorthand text of sources: "0.7 A 0.3 B" (the shortest decimal that
// reads back as each weight), or the lone path of one source.
std::string blend_text(const std::vector<BlendSource>& sources);
// The token file source `path` stands for in a blend of `n` sources: a
// directory's `split` file ("train.bin", "val.bin") when n > 1, else the path.
std::string blend_source_file(const std::string& path, size_t n, const std::string& split);

class BlendSampler {
 public:
  // One shard per source (they must outlive the sampler), weights summing to 1.
  BlendSampler(std::vector<const TokenShard*> shards, const std::vector<double>& weights, int64_t seq_len,
               uint64_t seed);
  int sources() const { return int(samplers_.size()); }
  int source_of(int64_t index) const { return table_[size_t(index % kBlendPeriod)]; }
  // Samples of source s among global indices [0, n).
  int64_t consumed(int s, int64_t n) const;
  // out[0, seq_len] = the seq_len+1 tokens of global sample `index`.
  void sample(int64_t index, int32_t* out) const;
  // Samples per period of each source (they sum to kBlendPeriod).
  const std::vector<int64_t>& per_period() const { return per_period_; }

 private:
  std::vector<std::unique_ptr<Sampler>> samplers_;
  std::vector<int64_t> per_period_;
  std::vector<int32_t> table_;  // period position -> source
  std::vector<int64_t> rank_;   // period position -> the source's samples before it in the period
  std::vector<std::vector<int64_t>> prefix_;  // [s][j]: source s's samples at positions < j
};

}  // namespace adgt
