// The collective and message cost model (collectives.hpp; docs/cluster.md).
#include "parallel/cluster/collectives.hpp"

#include "core/site_split.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

namespace adgt::cluster {
namespace {

bool crosses_wan(const Cluster& cl, int64_t a, int64_t b) {
  return !cl.sites.empty() && a != b && cl.site_of_node(a) != cl.site_of_node(b) &&
         &cl.link_between(a, b) == &cl.wan;
}

// A rank's share of the bandwidth of the link between nodes a != b (bytes/s):
// every device of a node uses the node's NICs at once; the WAN is one pipe
// per direction between two sites, shared by every device of the
// `wan_nodes` nodes of a's site that cross it at once.
double rank_bandwidth(const Cluster& cl, int64_t a, int64_t b, int64_t wan_nodes = 1) {
  const Link& l = cl.link_between(a, b);
  const double dpn = static_cast<double>(cl.devices_per_node);
  if (a == b) return l.effective_bandwidth();
  if (crosses_wan(cl, a, b))
    return l.effective_bandwidth() / (dpn * static_cast<double>(std::max<int64_t>(1, wan_nodes)));
  return l.effective_bandwidth() * std::min(1.0, static_cast<double>(cl.nics_per_node) / dpn);
}

struct Shape {
  int p = 0;                  // members
  std::vector<int64_t> nodes; // distinct nodes, in order of first appearance
  int g = 1;                  // most members on one node
  double ring_bw = 0;         // slowest inter-node hop of the node ring (per rank)
  double ring_lat = 0;        // its largest latency
  double pair_bw = 0;         // slowest link between any two of the nodes (all-to-all)
  double pair_lat = 0;        // its largest latency
};

Shape shape_of(const Cluster& cl, const std::vector<int>& ranks) {
  Shape s;
  s.p = static_cast<int>(ranks.size());
  std::vector<int> count;
  for (int r : ranks) {
    if (r < 0 || r >= cl.world())
      throw std::invalid_argument("collective cost: rank " + std::to_string(r) +
                                  " is outside the cluster's " + std::to_string(cl.world()) +
                                  " devices (" + cl.name + ")");
    const int64_t n = cl.node_of(r);
    auto it = std::find(s.nodes.begin(), s.nodes.end(), n);
    if (it == s.nodes.end()) {
      s.nodes.push_back(n);
      count.push_back(1);
    } else {
      ++count[static_cast<size_t>(it - s.nodes.begin())];
    }
  }
  for (int c : count) s.g = std::max(s.g, c);
  if (s.nodes.size() > 1) {
    const size_t n = s.nodes.size();
    // The ring's hops from one site to another run at once and share the WAN.
    const auto wan_hops = [&](int64_t a, int64_t b) {
      int64_t h = 0;
      for (size_t i = 0; i < n; ++i) {
        const int64_t x = s.nodes[i], y = s.nodes[(i + 1) % n];
        h += crosses_wan(cl, x, y) && cl.site_of_node(x) == cl.site_of_node(a) &&
             cl.site_of_node(y) == cl.site_of_node(b);
      }
      return h;
    };
    s.ring_bw = INFINITY;
    for (size_t i = 0; i < n; ++i) {
      const int64_t a = s.nodes[i], b = s.nodes[(i + 1) % n];
      s.ring_bw = std::min(s.ring_bw, rank_bandwidth(cl, a, b, crosses_wan(cl, a, b) ? wan_hops(a, b) : 1));
      s.ring_lat = std::max(s.ring_lat, cl.link_between(a, b).latency);
    }
    // Every member of an all-to-all talks to every node, not only the ring's
    // neighbours; every node of a site sends across the WAN at once.
    const auto nodes_in_site = [&](int64_t a) {
      int64_t k = 0;
      for (int64_t x : s.nodes) k += cl.site_of_node(x) == cl.site_of_node(a);
      return k;
    };
    s.pair_bw = INFINITY;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        const int64_t a = s.nodes[i], b = s.nodes[j];
        s.pair_bw = std::min(s.pair_bw, rank_bandwidth(cl, a, b, std::max(nodes_in_site(a), nodes_in_site(b))));
        s.pair_lat = std::max(s.pair_lat, cl.link_between(a, b).latency);
      }
  }
  return s;
}

// Ring phases over k participants moving `frac` of `bytes` each hop count.
double ring(int k, double bytes, double bw, double lat, int passes) {
  if (k <= 1) return 0;
  return passes * ((k - 1.0) / k * bytes / bw + (k - 1.0) * lat);
}

double tree_all_reduce(int k, double bytes, double bw, double lat) {
  if (k <= 1) return 0;
  return 2.0 * std::ceil(std::log2(static_cast<double>(k))) * lat + 2.0 * bytes / bw;
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Broadcast: return "broadcast";
    case Collective::RingShift: return "ring_shift";
  }
  return "?";
}

double collective_time(const Cluster& cl, Collective c, const std::vector<int>& ranks,
                       double bytes) {
  if (ranks.size() <= 1 || bytes < 0) return 0;
  if (c == Collective::RingShift) {  // one hop each, all at once: the slowest
    double t = 0;
    for (size_t i = 0; i < ranks.size(); ++i)
      t = std::max(t, message_time(cl, ranks[i], ranks[(i + 1) % ranks.size()], bytes));
    return t;
  }
  const Shape s = shape_of(cl, ranks);
  const double bwi = cl.intra.effective_bandwidth(), lati = cl.intra.latency;
  const int n = static_cast<int>(s.nodes.size());
  if (n == 1) {
    switch (c) {
      case Collective::AllReduce:
        return std::min(ring(s.p, bytes, bwi, lati, 2), tree_all_reduce(s.p, bytes, bwi, lati));
      case Collective::ReduceScatter:
      case Collective::AllGather: return ring(s.p, bytes, bwi, lati, 1);
      case Collective::Broadcast: return bytes / bwi + std::ceil(std::log2(s.p)) * lati;
      case Collective::AllToAll: return (s.p - 1.0) / s.p * bytes / bwi + lati;
      case Collective::RingShift: break;
    }
  }
  // Hierarchical: intra-node phases over g members, the node ring on 1/g.
  const double per = bytes / s.g;
  switch (c) {
    case Collective::AllReduce:
      return ring(s.g, bytes, bwi, lati, 2) +
             std::min(ring(n, per, s.ring_bw, s.ring_lat, 2),
                      tree_all_reduce(n, per, s.ring_bw, s.ring_lat));
    case Collective::ReduceScatter:
    case Collective::AllGather:
      return ring(s.g, bytes, bwi, lati, 1) + ring(n, per, s.ring_bw, s.ring_lat, 1);
    case Collective::Broadcast:
      return bytes / std::min(bwi, s.ring_bw) + std::ceil(std::log2(s.p)) * s.ring_lat;
    case Collective::AllToAll: {
      const double intra_bytes = (s.g - 1.0) / s.p * bytes;
      const double inter_bytes = (s.p - s.g) / static_cast<double>(s.p) * bytes;
      return std::max(intra_bytes / bwi, inter_bytes / s.pair_bw) + std::max(lati, s.pair_lat);
    }
    case Collective::RingShift: break;
  }
  return 0;
}

double message_time(const Cluster& cl, int from, int to, double bytes, int64_t wan_senders) {
  if (from == to) return 0;
  for (int r : {from, to})
    if (r < 0 || r >= cl.world())
      throw std::invalid_argument("message cost: rank " + std::to_string(r) +
                                  " is outside the cluster's " + std::to_string(cl.world()) +
                                  " devices (" + cl.name + ")");
  const int64_t a = cl.node_of(from), b = cl.node_of(to);
  // Across the WAN: wan_senders ranks at once (rank_bandwidth shares it by
  // nodes of devices_per_node ranks).
  const double bw = crosses_wan(cl, a, b) && wan_senders > 0
                        ? cl.wan.effective_bandwidth() / double(wan_senders)
                        : rank_bandwidth(cl, a, b);
  return cl.link_between(a, b).latency + bytes / bw;
}

std::vector<std::vector<int>> members_by_site(const Cluster& cl, const std::vector<int>& ranks) {
  if (cl.sites.size() <= 1) return {};
  std::vector<int> site_of;
  for (int r : ranks) site_of.push_back(int(cl.site_of_node(cl.node_of(r))));
  const std::optional<SiteSplit> split = split_by_site(site_of);  // SiteComm's split
  if (!split) return {};
  std::vector<std::vector<int>> by;
  for (const auto& at : split->rank_at) {
    by.emplace_back();
    for (int i : at) by.back().push_back(ranks[size_t(i)]);
  }
  return by;
}

double cross_site_time(const Cluster& cl, Collective c, const std::vector<int>& cross, double bytes,
                       int64_t site_nodes) {
  const int S = int(cross.size());
  if (S <= 1 || bytes <= 0) return 0;
  double bw = INFINITY, lat = 0;
  for (int i = 0; i < S; ++i) {
    const int64_t a = cl.node_of(cross[size_t(i)]), b = cl.node_of(cross[size_t((i + 1) % S)]);
    bw = std::min(bw, rank_bandwidth(cl, a, b, site_nodes));
    lat = std::max(lat, cl.link_between(a, b).latency);
  }
  switch (c) {
    case Collective::AllReduce: return ring(S, bytes, bw, lat, 2);
    case Collective::ReduceScatter:
    case Collective::AllGather: return ring(S, bytes, bw, lat, 1);
    default: return collective_time(cl, c, cross, bytes);
  }
}

namespace {

bool site_phased(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::AllGather;
}

// Nodes holding the members of one site (the most of any site).
int64_t nodes_per_site(const Cluster& cl, const std::vector<std::vector<int>>& by) {
  int64_t most = 1;
  for (const auto& m : by) {
    std::vector<int64_t> nodes;
    for (int r : m)
      if (std::find(nodes.begin(), nodes.end(), cl.node_of(r)) == nodes.end()) nodes.push_back(cl.node_of(r));
    most = std::max<int64_t>(most, int64_t(nodes.size()));
  }
  return most;
}

}  // namespace

std::optional<SitePhases> site_phases(const Cluster& cl, Collective c, const std::vector<int>& ranks,
                                      double bytes) {
  if (!site_phased(c)) return std::nullopt;
  const auto by = members_by_site(cl, ranks);
  if (by.empty()) return std::nullopt;
  const size_t k = by[0].size();
  const int64_t site_nodes = nodes_per_site(cl, by);
  SitePhases p;
  for (const auto& m : by) {
    if (c != Collective::AllGather)
      p.before = std::max(p.before, collective_time(cl, Collective::ReduceScatter, m, bytes));
    if (c != Collective::ReduceScatter)
      p.after = std::max(p.after, collective_time(cl, Collective::AllGather, m, bytes));
  }
  for (size_t i = 0; i < k; ++i) {
    std::vector<int> x;
    for (const auto& m : by) x.push_back(m[i]);
    p.cross = std::max(p.cross, cross_site_time(cl, c, x, bytes / double(k), site_nodes));
  }
  return p;
}

double reduction_time(const Cluster& cl, Collective c, const std::vector<int>& ranks, double bytes,
                      SiteReduce how) {
  if (how == SiteReduce::Hierarchical)
    if (const auto p = site_phases(cl, c, ranks, bytes)) return p->before + p->cross + p->after;
  return collective_time(cl, c, ranks, bytes);
}

double wan_bytes(const Cluster& cl, Collective c, const std::vector<int>& ranks, double bytes,
                 SiteReduce how) {
  if (cl.sites.size() <= 1 || ranks.size() <= 1 || bytes <= 0) return 0;
  const auto site_of = [&](int r) { return cl.site_of_node(cl.node_of(r)); };
  const double p = double(ranks.size());
  if (c == Collective::AllToAll) {  // each member's (p-1)/p, the part to other sites' members
    double b = 0;
    for (int r : ranks)
      for (int q : ranks)
        if (q != r && site_of(q) != site_of(r)) b += bytes / p;
    return b;
  }
  if (c == Collective::RingShift) {
    double b = 0;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (site_of(ranks[i]) != site_of(ranks[(i + 1) % ranks.size()])) b += bytes;
    return b;
  }
  const double passes = c == Collective::AllReduce ? 2 : 1;
  if (how == SiteReduce::Hierarchical && site_phased(c)) {
    const auto by = members_by_site(cl, ranks);
    if (!by.empty()) {  // k cross groups of S members, each sending (S-1)/S of the shard per pass
      const double S = double(by.size()), k = double(by[0].size());
      return k * S * passes * (S - 1) / S * bytes / k;
    }
  }
  if (c == Collective::Broadcast) {  // the chain crosses each site boundary once
    std::vector<int64_t> sites;
    for (int r : ranks)
      if (std::find(sites.begin(), sites.end(), site_of(r)) == sites.end()) sites.push_back(site_of(r));
    return (double(sites.size()) - 1) * bytes;
  }
  // Flat: NCCL's node ring, every hop carrying (n-1)/n of the buffer per pass.
  std::vector<int64_t> nodes;
  for (int r : ranks)
    if (std::find(nodes.begin(), nodes.end(), cl.node_of(r)) == nodes.end()) nodes.push_back(cl.node_of(r));
  const double n = double(nodes.size());
  double hops = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    hops += cl.site_of_node(nodes[i]) != cl.site_of_node(nodes[(i + 1) % nodes.size()]);
  return hops * passes * (n - 1) / n * bytes;
}

double message_wan_bytes(const Cluster& cl, int from, int to, double bytes) {
  if (cl.sites.size() <= 1) return 0;
  return cl.site_of_node(cl.node_of(from)) != cl.site_of_node(cl.node_of(to)) ? bytes : 0;
}

double bus_bandwidth(const Cluster& cl, Collective c, const std::vector<int>& ranks,
                     double bytes) {
  const double t = collective_time(cl, c, ranks, bytes);
  if (t <= 0) return 0;
  const double p = static_cast<double>(ranks.size());
  const double factor = c == Collective::AllReduce                                  ? 2 * (p - 1) / p
                        : c == Collective::Broadcast || c == Collective::RingShift ? 1.0
                                                     : (p - 1) / p;
  return factor * bytes / t;
}

}  // namespace adgt::cluster
