// Rank placement (placement.hpp; docs/placement.md).
#include "parallel/cluster/placement.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace adgt {

namespace {

// tp groups (tp consecutive layout ranks) whose ranks are not all on one
// node, given each layout rank's node.
int crossing_tp_groups(const std::vector<int>& node_of_layout, int tp) {
  int crossing = 0;
  for (size_t g = 0; g + size_t(tp) <= node_of_layout.size(); g += size_t(tp))
    for (size_t i = g + 1; i < g + size_t(tp); ++i)
      if (node_of_layout[i] != node_of_layout[g]) {
        ++crossing;
        break;
      }
  return crossing;
}

std::string of_groups(int k, int groups) {
  return std::to_string(k) + " of " + std::to_string(groups) + " tp group" +
         (groups == 1 ? "" : "s");
}

}  // namespace

bool Placement::identity() const {
  for (size_t r = 0; r < layout_of.size(); ++r)
    if (layout_of[r] != int(r)) return false;
  return true;
}

int Placement::layout_rank(int launcher_rank) const {
  return layout_of.empty() ? launcher_rank : layout_of.at(size_t(launcher_rank));
}

int Placement::launcher_rank(int layout_rank) const {
  return launcher_of.empty() ? layout_rank : launcher_of.at(size_t(layout_rank));
}

int Placement::node_of_layout(int layout_rank) const {
  return node_of.empty() ? -1 : node_of.at(size_t(launcher_rank(layout_rank)));
}

int Placement::site_of_layout(int layout_rank) const {
  return site_of.empty() ? 0 : site_of.at(size_t(launcher_rank(layout_rank)));
}

std::vector<int> Placement::layout_sites() const {
  std::vector<int> out;
  for (size_t l = 0; l < site_of.size(); ++l) out.push_back(site_of_layout(int(l)));
  for (int s : out)
    if (s != out.front()) return out;
  return {};
}

Placement place_ranks(const std::vector<int>& node_of_launcher, const std::string& mode, int tp,
                      const std::vector<int>& site_of_launcher) {
  if (mode != "topology" && mode != "nodes" && mode != "launcher")
    throw std::invalid_argument("parallel.placement=\"" + mode +
                                "\": unknown placement; use topology, nodes or launcher");
  if (tp < 1) throw std::invalid_argument("placement: tp=" + std::to_string(tp) + " must be >= 1");
  const int W = int(node_of_launcher.size());
  if (!site_of_launcher.empty() && int(site_of_launcher.size()) != W)
    throw std::invalid_argument("placement: " + std::to_string(site_of_launcher.size()) +
                                " sites for " + std::to_string(W) + " launcher ranks");
  Placement p;
  p.mode = mode;
  p.node_of = node_of_launcher;
  p.site_of = site_of_launcher;

  // Nodes in the order of their first launcher rank, each with its ranks in order.
  std::vector<int> order;
  std::map<int, std::vector<int>> ranks_on;
  for (int r = 0; r < W; ++r) {
    const int n = node_of_launcher[size_t(r)];
    if (!ranks_on.count(n)) order.push_back(n);
    ranks_on[n].push_back(r);
  }
  // Each node's site (one per node), and the sites in order of first appearance.
  std::map<int, int> site_of_node;
  std::vector<int> sites;
  for (int r = 0; r < W && !site_of_launcher.empty(); ++r) {
    const int n = node_of_launcher[size_t(r)], s = site_of_launcher[size_t(r)];
    auto [it, fresh] = site_of_node.emplace(n, s);
    if (!fresh && it->second != s)
      throw std::invalid_argument("placement: node " + std::to_string(n) + " holds ranks of site " +
                                  std::to_string(it->second) + " and of site " + std::to_string(s) +
                                  " (launcher rank " + std::to_string(r) +
                                  "); every rank of a host must name the same site (ADGT_SITE)");
    if (std::find(sites.begin(), sites.end(), s) == sites.end()) sites.push_back(s);
  }
  // topology: the nodes site by site (stable inside a site).
  std::vector<int> node_order = order;
  if (mode == "topology" && sites.size() > 1) {
    node_order.clear();
    for (int s : sites)
      for (int n : order)
        if (site_of_node[n] == s) node_order.push_back(n);
  }
  const bool sites_moved = node_order != order;

  p.launcher_of.resize(size_t(W));
  for (int r = 0; r < W; ++r) p.launcher_of[size_t(r)] = r;
  if (mode != "launcher") {
    p.launcher_of.clear();
    for (int n : node_order)
      for (int r : ranks_on[n]) p.launcher_of.push_back(r);
  }
  p.layout_of.assign(size_t(W), 0);
  for (int l = 0; l < W; ++l) p.layout_of[size_t(p.launcher_of[size_t(l)])] = l;

  std::vector<int> before(static_cast<size_t>(W)), after(static_cast<size_t>(W));
  for (int l = 0; l < W; ++l) {
    before[size_t(l)] = node_of_launcher[size_t(l)];
    after[size_t(l)] = node_of_launcher[size_t(p.launcher_of[size_t(l)])];
  }
  const int groups = W / tp;
  const int cross_before = crossing_tp_groups(before, tp);
  const int cross_after = crossing_tp_groups(after, tp);

  const std::string n_sites = std::to_string(sites.size()) + " sites";
  if (mode == "launcher") {
    p.why = "placement: launcher (the launcher's order as it comes; " +
            (cross_after == 0 ? std::string("every tp group is inside one node)")
                              : of_groups(cross_after, groups) +
                                    " cross nodes; parallel.placement=topology orders the "
                                    "ranks by node)");
  } else if (sites_moved) {
    p.why = "placement: topology (the launcher's order interleaved the " + n_sites +
            "; rebuilt site by site, node-contiguous inside each, so dp groups fill a site "
            "before they cross the wide-area link and pipeline stages split at it)";
  } else if (p.identity() && sites.size() > 1 && mode == "topology") {
    p.why = "placement: topology (the launcher's order is already site by site over " + n_sites +
            " and node-contiguous)";
  } else if (p.identity()) {
    p.why = order.size() <= 1
                ? "placement: topology (one node: the launcher's order)"
                : "placement: topology (the launcher's order is already node-contiguous)";
  } else if (cross_after < cross_before) {
    p.why = "placement: topology (the launcher's order put " + of_groups(cross_before, groups) +
            " across nodes; rebuilt node-contiguous so " +
            (cross_after == 0 ? std::string("every tp group is inside one node)")
                              : "only " + std::to_string(cross_after) + " cross)");
  } else {
    p.why =
        "placement: topology (the launcher's order interleaved the nodes; rebuilt "
        "node-contiguous so dp groups take the faster links before pp does)";
  }

  if (mode == "nodes") {
    p.why.replace(p.why.find("topology"), 8, "nodes");
    if (sites.size() > 1) p.why.insert(p.why.size() - 1, "; the " + n_sites + " ignored");
  }

  // The node shape: unequal nodes, or tp not dividing the ranks per node,
  // leave tp groups that must cross nodes whatever the order.
  bool unequal = false;
  for (int n : order) unequal = unequal || ranks_on[n].size() != ranks_on[order[0]].size();
  const int per_node = order.empty() ? 0 : int(ranks_on[order[0]].size());
  std::string shape;
  if (unequal) {
    shape = "the nodes hold unequal rank counts (";
    for (size_t i = 0; i < order.size(); ++i)
      shape += (i ? ", node " : "node ") + std::to_string(order[i]) + ": " +
               std::to_string(ranks_on[order[i]].size());
    shape += ")";
  } else if (order.size() > 1 && per_node % tp != 0) {
    shape = "tp=" + std::to_string(tp) + " does not divide the " + std::to_string(per_node) +
            " ranks per node";
  }
  if (!shape.empty() && cross_after > 0)
    p.warning = "placement: " + shape +
                ", so tp groups must cross nodes: " + of_groups(cross_after, groups) +
                " run their all-reduces over the inter-node links; use a tp that divides the "
                "ranks of every node";
  else if (!shape.empty())
    p.warning = "placement: " + shape + "; every tp group still fits inside one node";
  return p;
}

std::vector<int> nodes_of_hosts(const std::vector<std::string>& hosts) {
  std::map<std::string, int> id;
  std::vector<int> out;
  out.reserve(hosts.size());
  for (const std::string& h : hosts) {
    auto it = id.find(h);
    if (it == id.end()) it = id.emplace(h, int(id.size())).first;
    out.push_back(it->second);
  }
  return out;
}

}  // namespace adgt
