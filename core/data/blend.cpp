// Weighted blends of token files (blend.hpp).
#include "core/data/blend.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

namespace adgt {

std::vector<BlendSource> parse_blend(const std::string& value, const std::string& key) {
  std::vector<BlendSource> out = parse_blend_as_written(value, key);
  double total = 0;
  for (const BlendSource& s : out) total += s.weight;
  for (BlendSource& s : out) s.weight /= total;
  return out;
}

std::vector<BlendSource> parse_blend_as_written(const std::string& value, const std::string& key) {
  std::istringstream in(value);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.size() == 1) return {{words[0], 1.0}};
  if (words.empty() || words.size() % 2 != 0)
    throw std::runtime_error(key + ": '" + value + "': one token file, or weights and token files in turn (\"0.7 A 0.3 B\")");
  std::vector<BlendSource> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < words.size(); i += 2) {
    double w = 0;
    size_t used = 0;
    try {
      w = std::stod(words[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != words[i].size() || !(w > 0) || !std::isfinite(w))
      throw std::runtime_error(key + ": '" + words[i] + "' before " + words[i + 1] + " is not a positive weight");
    if (!seen.insert(words[i + 1]).second)
      throw std::runtime_error(key + ": " + words[i + 1] + " is named twice; give it one weight");
    out.push_back({words[i + 1], w});
  }
  return out;
}

std::string blend_text(const std::vector<BlendSource>& sources) {
  if (sources.size() == 1) return sources[0].path;
  std::string out;
  for (const BlendSource& s : sources) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, s.weight);
    out += (out.empty() ? "" : " ") + std::string(buf, r.ptr) + " " + s.path;
  }
  return out;
}

std::string blend_source_file(const std::string& path, size_t n, const std::string& split) {
  std::error_code ec;
  if (n > 1 && std::filesystem::is_directory(path, ec)) return (std::filesystem::path(path) / split).string();
  return path;
}

BlendSampler::BlendSampler(std::vector<const TokenShard*> shards, const std::vector<double>& weights,
                           int64_t seq_len, uint64_t seed) {
  const size_t S = shards.size();
  if (S == 0 || weights.size() != S) throw std::invalid_argument("BlendSampler: one weight per shard");
  for (size_t s = 0; s < S; ++s)
    samplers_.push_back(std::make_unique<Sampler>(*shards[s], seq_len, seed + uint64_t(s) * 0x9E3779B97F4A7C15ull));
  // Samples per period: largest remainder, ties to the lower source.
  per_period_.assign(S, 0);
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t s = 0; s < S; ++s) {
    const double q = weights[s] * double(kBlendPeriod);
    per_period_[s] = int64_t(std::floor(q));
    given += per_period_[s];
    rem.push_back({q - std::floor(q), s});
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t r = 0; given < kBlendPeriod; ++r, ++given) ++per_period_[rem[r % S].second];
  // The period's order: the largest deficit first, ties to the lower source.
  table_.resize(size_t(kBlendPeriod));
  rank_.resize(size_t(kBlendPeriod));
  prefix_.assign(S, std::vector<int64_t>(size_t(kBlendPeriod) + 1, 0));
  std::vector<int64_t> have(S, 0);
  for (int64_t j = 0; j < kBlendPeriod; ++j) {
    size_t best = S;
    double best_deficit = 0;
    for (size_t s = 0; s < S; ++s) {
      if (have[s] >= per_period_[s]) continue;
      const double deficit = double(per_period_[s] * (j + 1)) / double(kBlendPeriod) - double(have[s]);
      if (best == S || deficit > best_deficit) {
        best = s;
        best_deficit = deficit;
      }
    }
    table_[size_t(j)] = int32_t(best);
    rank_[size_t(j)] = have[best]++;
    for (size_t s = 0; s < S; ++s) prefix_[s][size_t(j) + 1] = have[s];
  }
}

int64_t BlendSampler::consumed(int s, int64_t n) const {
  return (n / kBlendPeriod) * per_period_[size_t(s)] + prefix_[size_t(s)][size_t(n % kBlendPeriod)];
}

void BlendSampler::sample(int64_t index, int32_t* out) const {
  const int64_t j = index % kBlendPeriod;
  const int s = table_[size_t(j)];
  samplers_[size_t(s)]->sample((index / kBlendPeriod) * per_period_[size_t(s)] + rank_[size_t(j)], out);
}

}  // namespace adgt
