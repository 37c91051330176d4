// The members of a group by site (datacenter; docs/sites.md), shared by the
// hierarchical reduction (parallel/comm/site_comm.hpp) and the cost model
// that prices it (parallel/cluster/collectives.hpp). Pure.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace adgt {

// The split of a group by its members' sites: for group rank r, its site
// index (sites numbered in order of first member) and its place inside the
// site (its order among the site's members). nullopt when the members are on
// one site or the sites hold unequal numbers of them (`why` says which).
struct SiteSplit {
  int sites = 1;                // S
  int per_site = 1;             // k
  std::vector<int> site;        // (group size) site index of group rank r
  std::vector<int> place;       // (group size) place of group rank r inside its site
  std::vector<std::vector<int>> rank_at;  // [site][place] -> group rank
  // Group rank r's shard of an n-element buffer cut into per_site parts of
  // ceil(n / per_site) (the hierarchical reduce-scatter's): its first element
  // and how many of its elements are the buffer's (the last places' may be
  // short or empty; the rest is padding).
  std::pair<int64_t, int64_t> shard(int64_t n, int r) const {
    const int64_t m = (n + per_site - 1) / per_site, first = int64_t(place[size_t(r)]) * m;
    return {first, first < n ? (n - first < m ? n - first : m) : 0};
  }
};
inline std::optional<SiteSplit> split_by_site(const std::vector<int>& site_of_member,
                                              std::string* why = nullptr) {
  const auto say = [&](const std::string& w) {
    if (why) *why = w;
    return std::nullopt;
  };
  std::map<int, int> index;  // site id -> site index, by first member
  SiteSplit s;
  std::vector<int> count;
  for (int id : site_of_member) {
    auto [it, fresh] = index.emplace(id, int(index.size()));
    if (fresh) count.push_back(0);
    s.site.push_back(it->second);
    s.place.push_back(count[size_t(it->second)]++);
  }
  if (index.size() <= 1) return say("the group's ranks are on one site");
  for (size_t i = 0; i < count.size(); ++i)
    if (count[i] != count[0]) {
      std::string w = "the sites hold unequal numbers of the group's ranks (";
      for (size_t j = 0; j < count.size(); ++j)
        w += (j ? ", " : "") + std::to_string(count[j]);
      return say(w + ")");
    }
  s.sites = int(count.size());
  s.per_site = count[0];
  s.rank_at.assign(size_t(s.sites), std::vector<int>(size_t(s.per_site), 0));
  for (size_t r = 0; r < s.site.size(); ++r) s.rank_at[size_t(s.site[r])][size_t(s.place[r])] = int(r);
  return s;
}

}  // namespace adgt
