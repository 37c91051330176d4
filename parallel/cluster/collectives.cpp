// The collective and message cost model (collectives.hpp; docs/cluster.md).
#include "parallel/cluster/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace adgt::cluster {
namespace {

// A rank's share of the bandwidth of the link between nodes a != b (bytes/s):
// every device of a node uses the node's NICs at once; a WAN is one pipe.
double rank_bandwidth(const Cluster& cl, int64_t a, int64_t b) {
  const Link& l = cl.link_between(a, b);
  const double dpn = static_cast<double>(cl.devices_per_node);
  if (a == b) return l.effective_bandwidth();
  if (!cl.sites.empty() && cl.site_of_node(a) != cl.site_of_node(b) && &l == &cl.wan)
    return l.effective_bandwidth() / dpn;
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
    s.ring_bw = INFINITY;
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      const int64_t a = s.nodes[i], b = s.nodes[(i + 1) % s.nodes.size()];
      s.ring_bw = std::min(s.ring_bw, rank_bandwidth(cl, a, b));
      s.ring_lat = std::max(s.ring_lat, cl.link_between(a, b).latency);
    }
    // Every member of an all-to-all talks to every node, not only the ring's neighbours.
    s.pair_bw = INFINITY;
    for (size_t i = 0; i < s.nodes.size(); ++i)
      for (size_t j = i + 1; j < s.nodes.size(); ++j) {
        s.pair_bw = std::min(s.pair_bw, rank_bandwidth(cl, s.nodes[i], s.nodes[j]));
        s.pair_lat = std::max(s.pair_lat, cl.link_between(s.nodes[i], s.nodes[j]).latency);
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

double message_time(const Cluster& cl, int from, int to, double bytes) {
  if (from == to) return 0;
  for (int r : {from, to})
    if (r < 0 || r >= cl.world())
      throw std::invalid_argument("message cost: rank " + std::to_string(r) +
                                  " is outside the cluster's " + std::to_string(cl.world()) +
                                  " devices (" + cl.name + ")");
  const int64_t a = cl.node_of(from), b = cl.node_of(to);
  return cl.link_between(a, b).latency + bytes / rank_bandwidth(cl, a, b);
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
