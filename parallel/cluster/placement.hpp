// Rank placement (docs/placement.md; parallel.placement): which layout rank
// (core/layout.hpp: tp fastest, then dp, then pp) each launcher rank (the MPI
// world rank mpirun or srun gave the process) takes.
//
//   topology: the ranks of one node become consecutive layout ranks; nodes in
//     the order of their first launcher rank, a node's ranks in launcher
//     order. tp groups (tp consecutive layout ranks) then stay inside a node
//     whenever tp divides the ranks per node; dp groups take the next-fastest
//     links and pipeline stages (outermost) cross nodes.
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
  std::string why;      // "placement: topology (...)" for the rank table; "" when not computed
  std::string warning;  // "" or why some tp groups must cross nodes

  bool identity() const;
  int layout_rank(int launcher_rank) const;
  int launcher_rank(int layout_rank) const;
  int node_of_layout(int layout_rank) const;  // -1 when the nodes are unknown
};

// The placement of mode "topology" or "launcher" (anything else throws
// std::invalid_argument naming parallel.placement) for launcher ranks on the
// nodes `node_of_launcher` (any ids; one entry per launcher rank) and tensor
// parallel size tp (>= 1).
Placement place_ranks(const std::vector<int>& node_of_launcher, const std::string& mode, int tp);

// Node ids of host names: equal names share an id, ids 0, 1, ... in the
// order of each name's first appearance.
std::vector<int> nodes_of_hosts(const std::vector<std::string>& hosts);

}  // namespace adgt
