// Gradient compression's per-rank state in checkpoints (compression_state.hpp).
#include "parallel/dp/compression_state.hpp"

#include <sstream>
#include <utility>

namespace adgt {

namespace {
constexpr const char* kBuckets = "compress/buckets";
constexpr const char* kGroups = "compress/groups";
std::string bucket_key(size_t i, const char* what) {
  return "compress/bucket_" + std::to_string(i) + "/" + what;
}
}  // namespace

std::map<std::string, StateEntry> compression_state(const GradReducer& r) {
  const std::vector<GradBucket>& buckets = r.buckets();
  const Comm& dp = r.dp_group();
  const Comm* edp_comm = r.edp_group();
  std::map<std::string, StateEntry> s;
  bool any = false;
  for (size_t i = 0; i < buckets.size(); ++i)
    any |= !r.state(int(i)).codec.empty() || !r.state(int(i)).wan.empty();
  if (!any) return s;
  std::vector<int64_t> geo;
  for (size_t i = 0; i < buckets.size(); ++i)
    geo.insert(geo.end(), {buckets[i].begin, buckets[i].end, int64_t(buckets[i].op),
                           int64_t(buckets[i].group), int64_t(r.level(int(i)))});
  s[kBuckets] = StateEntry::of_ints(geo);
  s[kGroups] = StateEntry::of_ints({dp.size(), dp.rank(), edp_comm ? edp_comm->size() : 1, edp_comm ? edp_comm->rank() : 0});
  for (size_t i = 0; i < buckets.size(); ++i) {
    const compress::BucketCodecState& c = r.state(int(i)).codec;
    if (!c.residual.empty()) s[bucket_key(i, "residual")] = StateEntry::of_floats(c.residual);
    if (!c.owner_residual.empty()) s[bucket_key(i, "owner_residual")] = StateEntry::of_floats(c.owner_residual);
    if (!c.q.empty()) s[bucket_key(i, "q")] = StateEntry::of_floats(c.q);
    // The cross-site level's (docs/sites.md): this rank's shard.
    const compress::BucketCodecState& w = r.state(int(i)).wan;
    if (!w.residual.empty()) s[bucket_key(i, "wan_residual")] = StateEntry::of_floats(w.residual);
    if (!w.owner_residual.empty())
      s[bucket_key(i, "wan_owner_residual")] = StateEntry::of_floats(w.owner_residual);
  }
  return s;
}

std::string restore_compression_state(GradReducer& r, const std::map<std::string, StateEntry>& s) {
  const std::vector<GradBucket>& buckets = r.buckets();
  const Comm& dp = r.dp_group();
  const Comm* edp_comm = r.edp_group();
  auto it = s.find(kBuckets);
  if (it == s.end()) return "";
  auto g = s.find(kGroups);
  const int64_t edp = edp_comm ? edp_comm->size() : 1;
  if (g == s.end() || g->second.ints.size() != 4 || g->second.ints[0] != dp.size() ||
      g->second.ints[2] != edp) {
    std::ostringstream os;
    os << "it was saved with dp=" << (g != s.end() && g->second.ints.size() == 4 ? g->second.ints[0] : -1)
       << " (edp=" << (g != s.end() && g->second.ints.size() == 4 ? g->second.ints[2] : -1)
       << "), this run has dp=" << dp.size() << " (edp=" << edp << ")";
    return os.str();
  }
  const std::vector<int64_t>& geo = it->second.ints;
  bool same = geo.size() == 5 * buckets.size();
  for (size_t i = 0; same && i < buckets.size(); ++i)
    same = geo[5 * i] == buckets[i].begin && geo[5 * i + 1] == buckets[i].end &&
           geo[5 * i + 2] == int64_t(buckets[i].op) && geo[5 * i + 3] == int64_t(buckets[i].group);
  if (!same)
    return "its gradient buckets differ from this run's (parallel.bucket_mb, parallel.zero or the "
           "layout changed)";
  std::vector<compress::BucketCodecState> got(buckets.size()), wan(buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    const int64_t n = buckets[i].end - buckets[i].begin;
    auto take = [&](const char* what, std::vector<float>& to) -> std::string {
      auto e = s.find(bucket_key(i, what));
      if (e == s.end()) return "";
      if (e->second.kind != StateEntry::Kind::Floats)
        return std::string("state ") + bucket_key(i, what) + " is not fp32";
      to = e->second.floats;
      return "";
    };
    for (auto [what, to] : {std::pair<const char*, std::vector<float>*>{"residual", &got[i].residual},
                            {"owner_residual", &got[i].owner_residual}, {"q", &got[i].q},
                            {"wan_residual", &wan[i].residual},
                            {"wan_owner_residual", &wan[i].owner_residual}})
      if (std::string e = take(what, *to); !e.empty()) return e;
    if (!got[i].residual.empty() && int64_t(got[i].residual.size()) != n)
      return bucket_key(i, "residual") + " has " + std::to_string(got[i].residual.size()) +
             " values for a bucket of " + std::to_string(n);
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    r.state(int(i)).codec = std::move(got[i]);
    r.state(int(i)).wan = std::move(wan[i]);
  }
  return "";
}

}  // namespace adgt
