// Rank placement (docs/placement.md; parallel.placement): which layout rank
// (core/layout.hpp: tp fastest, then dp, then pp) each launcher rank (the MPI
// world rank mpirun or srun gave the process) takes.
//
//   topology: the ranks of one node become consecutive layout ranks; nodes in
//     the order of their first launcher rank, a node's ranks in launcher
//     order. tp groups (tp consecutive layout ranks) then stay inside a node
//     whenever tp divides the ranks per node; dp groups take the next-fastest
//     links and pipeline stages (outermost) cross nodes.
//     With sites (datacenters joined by a wide-area link: the emulated
//     cluster's `sites`, or ADGT_SITE per process), the nodes are first
//     ordered site by site (sites in the order of their first launcher rank):
//     dp groups then fill a site before they cross the WAN, and pipeline
//     stages (outermost) split at a site boundary whenever the stages divide
//     the sites evenly.
//   nodes: topology with the sites ignored (nodes in the order of their first
//     launcher rank): a placement that knows nodes but not sites, the
//     baseline of the two-site benchmark (docs/sites.md).
//   launcher: the identity; layout rank = launcher rank.
//
// Example: 2 nodes x 4 ranks handed out round-robin (mpirun --map-by node:
// launcher ranks 0,2,4,6 on node 0 and 1,3,5,7 on node 1), tp=4 dp=2.
//   launcher: tp group {0,1,2,3} = launcher ranks 0..3 spans both nodes.
//   topology: layout ranks 0..3 = launcher ranks 0,2,4,6 (node 0),
//             layout ranks 4..7 = launcher ranks 1,3,5,7 (node 1).
//
// Pure: the physical node of every launcher rank comes in (host names on a
// real cluster, nodes_of_hosts(); the emulated cluster and
// emulate.rank_order under emulation, parallel/emulate/emulation.hpp).
#pragma once
#include <string>
#include <vector>

namespace adgt {

struct Placement {
  std::string mode = "launcher";  // "topology" | "launcher"
  std::vector<int> layout_of;     // per launcher rank: its layout rank; empty: identity
  std::vector<int> launcher_of;   // per layout rank: its launcher rank; empty: identity
  std::vector<int> node_of;       // per launcher rank: its physical node; empty: unknown
  std::vector<int> site_of;       // per launcher rank: its site; empty: one site (unknown)
  std::string why;      // "placement: topology (...)" for the rank table; "" when not computed
  std::string warning;  // "" or why some tp groups must cross nodes

  bool identity() const;
  int layout_rank(int launcher_rank) const;
  int launcher_rank(int layout_rank) const;
  int node_of_layout(int layout_rank) const;  // -1 when the nodes are unknown
  int site_of_layout(int layout_rank) const;  // 0 when the sites are unknown
  // Per layout rank: its site (empty when the sites are unknown or one).
  std::vector<int> layout_sites() const;
};

// The placement of mode "topology", "nodes" or "launcher" (anything else
// throws std::invalid_argument naming parallel.placement) for launcher ranks
// on the nodes `node_of_launcher` (any ids; one entry per launcher rank),
// tensor parallel size tp (>= 1) and, when given, the sites of the launcher
// ranks (any ids; empty: unknown). Ranks of one node in two sites throw
// std::invalid_argument naming both.
Placement place_ranks(const std::vector<int>& node_of_launcher, const std::string& mode, int tp,
                      const std::vector<int>& site_of_launcher = {});

// Node ids of host names: equal names share an id, ids 0, 1, ... in the
// order of each name's first appearance.
std::vector<int> nodes_of_hosts(const std::vector<std::string>& hosts);

}  // namespace adgt
