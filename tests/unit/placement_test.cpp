// Rank placement (parallel/cluster/placement.hpp, docs/placement.md): the pure
// launcher-rank -> layout-rank map, its why and warning texts, host names to
// nodes, and the emulated launcher's rank orders (emulate::launcher_devices).
#include "parallel/cluster/placement.hpp"

#include <catch2/catch.hpp>

#include <random>

#include "core/layout.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/emulate/emulation.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

// Nodes of the layout ranks of each tp group (tp consecutive layout ranks).
std::vector<std::vector<int>> tp_group_nodes(const Placement& p, int tp) {
  std::vector<std::vector<int>> out;
  for (size_t l = 0; l < p.launcher_of.size(); l += size_t(tp)) {
    out.emplace_back();
    for (int i = 0; i < tp; ++i) out.back().push_back(p.node_of_layout(int(l) + i));
  }
  return out;
}

bool inverse(const Placement& p) {
  for (size_t r = 0; r < p.layout_of.size(); ++r)
    if (p.launcher_of.at(size_t(p.layout_of[r])) != int(r)) return false;
  return p.layout_of.size() == p.launcher_of.size();
}

}  // namespace

TEST_CASE("placement topology: block order is already node-contiguous", "[placement]") {
  const Placement p = place_ranks({0, 0, 0, 0, 1, 1, 1, 1}, "topology", 4);
  CHECK(p.identity());
  CHECK(p.layout_of == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(p.why == "placement: topology (the launcher's order is already node-contiguous)");
  CHECK(p.warning.empty());
  CHECK(tp_group_nodes(p, 4) == std::vector<std::vector<int>>{{0, 0, 0, 0}, {1, 1, 1, 1}});
}

TEST_CASE("placement topology: round-robin order is rebuilt node by node", "[placement]") {
  // mpirun --map-by node on 2 nodes: launcher ranks alternate nodes.
  const Placement p = place_ranks({0, 1, 0, 1, 0, 1, 0, 1}, "topology", 4);
  CHECK_FALSE(p.identity());
  CHECK(p.launcher_of == std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7});
  CHECK(p.layout_of == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
  CHECK(inverse(p));
  CHECK(tp_group_nodes(p, 4) == std::vector<std::vector<int>>{{0, 0, 0, 0}, {1, 1, 1, 1}});
  CHECK(p.why ==
        "placement: topology (the launcher's order put 2 of 2 tp groups across nodes; "
        "rebuilt node-contiguous so every tp group is inside one node)");
  CHECK(p.warning.empty());
  // tp=2 dp=2 pp=2 on the same launch: each tp group and each dp group inside
  // a node; the pipeline's two stages are the two nodes.
  const Layout L{.tp = 2, .pp = 2, .dp = 2};
  const Placement q = place_ranks({0, 1, 0, 1, 0, 1, 0, 1}, "topology", 2);
  for (int l = 0; l < 8; ++l)
    for (Group g : {Group::tp, Group::dp})
      for (int m : group_ranks(L, g, l)) CHECK(q.node_of_layout(m) == q.node_of_layout(l));
  CHECK(q.node_of_layout(group_ranks(L, Group::pp, 0)[0]) !=
        q.node_of_layout(group_ranks(L, Group::pp, 0)[1]));
}

TEST_CASE("placement topology: interleaved nodes with tp=1 put dp inside a node", "[placement]") {
  const Placement p = place_ranks({0, 1, 0, 1}, "topology", 1);
  CHECK(p.launcher_of == std::vector<int>{0, 2, 1, 3});
  CHECK_THAT(p.why, Contains("the launcher's order interleaved the nodes") &&
                        Contains("dp groups take the faster links before pp does"));
}

TEST_CASE("placement topology: nodes by first launcher rank, any node ids", "[placement]") {
  // Node 7 holds launcher rank 0, so it comes first; within a node, launcher order.
  const Placement p = place_ranks({7, 3, 3, 7}, "topology", 2);
  CHECK(p.launcher_of == std::vector<int>{0, 3, 1, 2});
  CHECK(p.node_of_layout(0) == 7);
  CHECK(p.node_of_layout(2) == 3);
  CHECK(place_ranks({5, 5, 5}, "topology", 1).why ==
        "placement: topology (one node: the launcher's order)");
}

TEST_CASE("placement: unequal nodes and tp not dividing a node warn", "[placement]") {
  // 3 ranks on node 0, 1 on node 1, tp=2: tp group {2,3} must cross.
  const Placement p = place_ranks({0, 1, 0, 0}, "topology", 2);
  CHECK(p.launcher_of == std::vector<int>{0, 2, 3, 1});
  CHECK(p.warning ==
        "placement: the nodes hold unequal rank counts (node 0: 3, node 1: 1), so "
        "tp groups must cross nodes: 1 of 2 tp groups run their all-reduces over the "
        "inter-node links; use a tp that divides the ranks of every node");
  // 2 ranks per node, tp=4: every tp group spans both nodes.
  const Placement q = place_ranks({0, 0, 1, 1}, "topology", 4);
  CHECK_THAT(q.warning, Contains("tp=4 does not divide the 2 ranks per node, so tp groups must "
                                 "cross nodes: 1 of 1 tp group run"));
  // Unequal nodes whose tp groups still fit: a softer note.
  CHECK(place_ranks({0, 0, 0, 0, 1, 1}, "topology", 2).warning ==
        "placement: the nodes hold unequal rank counts (node 0: 4, node 1: 2); every tp group "
        "still fits inside one node");
  CHECK(place_ranks({0, 0, 1, 1}, "topology", 2).warning.empty());
}

TEST_CASE("placement launcher: the identity, and the why names crossing tp groups", "[placement]") {
  const Placement p = place_ranks({0, 1, 0, 1, 0, 1, 0, 1}, "launcher", 4);
  CHECK(p.identity());
  CHECK(p.launcher_of == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(tp_group_nodes(p, 4) == std::vector<std::vector<int>>{{0, 1, 0, 1}, {0, 1, 0, 1}});
  CHECK(p.why ==
        "placement: launcher (the launcher's order as it comes; 2 of 2 tp groups cross "
        "nodes; parallel.placement=topology orders the ranks by node)");
  CHECK(
      place_ranks({0, 0, 1, 1}, "launcher", 2).why ==
      "placement: launcher (the launcher's order as it comes; every tp group is inside one node)");
  CHECK_THROWS_WITH(
      place_ranks({0}, "random", 1),
      Contains("parallel.placement=\"random\": unknown placement; use topology, nodes or launcher"));
  // A default Placement is the identity with unknown nodes.
  const Placement none;
  CHECK(none.identity());
  CHECK(none.layout_rank(5) == 5);
  CHECK(none.launcher_rank(5) == 5);
  CHECK(none.node_of_layout(5) == -1);
}

TEST_CASE("placement: launcher rank 0 is layout rank 0 in every placement", "[placement]") {
  // World rank 0 logs and commits checkpoints; an in-memory layout switch
  // (docs/reliability.md) keeps it on its process because neither mode can
  // move it: topology orders nodes by their first launcher rank (rank 0's
  // node first) and a node's ranks in launcher order. Random node
  // assignments, node counts and tp sizes.
  std::mt19937 g(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int W = 1 + int(g() % 16), nodes = 1 + int(g() % 5);
    std::vector<int> node_of(static_cast<size_t>(W));
    for (int& n : node_of) n = int(g() % 7) * 3 % (nodes + 4);  // arbitrary ids, uneven nodes
    for (const char* mode : {"topology", "launcher"})
      for (int tp : {1, 2, 4}) {
        INFO("trial " << trial << " " << mode << " tp " << tp);
        const Placement p = place_ranks(node_of, mode, tp);
        CHECK(p.layout_rank(0) == 0);
        CHECK(p.launcher_rank(0) == 0);
        CHECK(inverse(p));
      }
  }
}

TEST_CASE("placement: host names to nodes in order of first appearance", "[placement]") {
  CHECK(nodes_of_hosts({"b", "a", "b", "c", "a"}) == std::vector<int>{0, 1, 0, 2, 1});
  CHECK(nodes_of_hosts({}).empty());
}

TEST_CASE("emulated launcher: block and round-robin rank orders", "[placement][emulate]") {
  cluster::Cluster cl;
  cl.nodes = 2;
  cl.devices_per_node = 4;
  CHECK(emulate::launcher_devices(cl, 8, "block") == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // Round-robin: rank r on node r % 2 as its (r / 2)-th device.
  const std::vector<int> rr = emulate::launcher_devices(cl, 8, "round-robin");
  CHECK(rr == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
  std::vector<int> nodes;
  for (int d : rr) nodes.push_back(int(cl.node_of(d)));
  CHECK(nodes == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  CHECK(emulate::launcher_devices(cl, 3, "round-robin") == std::vector<int>{0, 4, 1});
  CHECK_THROWS_WITH(emulate::launcher_devices(cl, 9, "block"),
                    Contains("9 ranks on the 8 devices of cluster"));
  CHECK_THROWS_WITH(emulate::launcher_devices(cl, 2, "zigzag"),
                    Contains("emulate.rank_order=\"zigzag\": unknown order"));
}

TEST_CASE("setup_emulation: layout ranks sit on their launcher rank's device",
          "[placement][emulate]") {
  // One process (no world) sees only its own rank; the per-rank vectors of a
  // 1-rank run under round-robin are the trivial ones.
  RunConfig cfg;
  cfg.emulate.cluster = "cpu-here";
  cfg.emulate.rank_order = "round-robin";
  Placement p = place_ranks({0}, "topology", 1);
  auto emu = emulate::setup_emulation(cfg, nullptr, 0, &p);
  REQUIRE(emu);
  CHECK(emu->devices == std::vector<int>{0});
  CHECK(emu->nodes == std::vector<int>{0});
  CHECK(emu->launcher_of == std::vector<int>{0});
  CHECK_THAT(emu->summary(), Contains("launcher ranks handed out round-robin"));
  CHECK(emu->state->device(0) == 0);
  // A device map: world rank r is device_of[r]; without one, device r.
  const emulate::EmulatedRank mapped(cluster::load_cluster("cpu-here"), 1, {4, 0});
  CHECK(mapped.device(0) == 4);
  CHECK(mapped.device(1) == 0);
  CHECK(emulate::EmulatedRank(cluster::load_cluster("cpu-here"), 0).device(3) == 3);
}

TEST_CASE("placement topology: sites one after another, nodes inside each", "[placement][sites]") {
  // Nodes 0..3 with two ranks each; the launcher's node order alternates the
  // sites (node 0 and 2 on site 0, nodes 1 and 3 on site 1).
  const std::vector<int> nodes{0, 0, 1, 1, 2, 2, 3, 3}, sites{0, 0, 1, 1, 0, 0, 1, 1};
  const Placement p = place_ranks(nodes, "topology", 2, sites);
  CHECK(p.launcher_of == std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7});
  CHECK(inverse(p));
  CHECK(p.layout_sites() == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  CHECK(p.why ==
        "placement: topology (the launcher's order interleaved the 2 sites; rebuilt site by site, "
        "node-contiguous inside each, so dp groups fill a site before they cross the wide-area "
        "link and pipeline stages split at it)");
  // tp2 x dp2 x pp2: each pipeline stage is one site, its dp groups inside it.
  const Layout L{.tp = 2, .pp = 2, .dp = 2};
  for (int l = 0; l < 8; ++l) {
    for (int m : group_ranks(L, Group::dp, l)) CHECK(p.site_of_layout(m) == p.site_of_layout(l));
    const auto pp = group_ranks(L, Group::pp, l);
    CHECK(p.site_of_layout(pp[0]) != p.site_of_layout(pp[1]));
  }
  // nodes: the same launch with the sites ignored keeps the node order, so
  // the stages straddle the sites and the dp groups cross the WAN.
  const Placement q = place_ranks(nodes, "nodes", 2, sites);
  CHECK(q.identity());
  CHECK(q.layout_sites() == sites);
  CHECK(q.why == "placement: nodes (the launcher's order is already node-contiguous; the 2 sites "
                 "ignored)");
  for (int l = 0; l < 8; ++l) {
    const auto dp = group_ranks(L, Group::dp, l);
    CHECK(q.site_of_layout(dp[0]) != q.site_of_layout(dp[1]));
  }
  // A launch already site by site is kept, and says so.
  CHECK(place_ranks(nodes, "topology", 2, {0, 0, 0, 0, 1, 1, 1, 1}).why ==
        "placement: topology (the launcher's order is already site by site over 2 sites and "
        "node-contiguous)");
  // One site: as without sites.
  CHECK(place_ranks(nodes, "topology", 2, std::vector<int>(8, 4)).layout_sites().empty());
  CHECK(place_ranks(nodes, "topology", 2, std::vector<int>(8, 4)).identity());
}

TEST_CASE("placement: a node in two sites and a short site list are refused", "[placement][sites]") {
  CHECK_THROWS_WITH(place_ranks({0, 0, 1, 1}, "topology", 1, {0, 1, 1, 1}),
                    "placement: node 0 holds ranks of site 0 and of site 1 (launcher rank 1); "
                    "every rank of a host must name the same site (ADGT_SITE)");
  CHECK_THROWS_WITH(place_ranks({0, 0, 1, 1}, "topology", 1, {0, 1}),
                    "placement: 2 sites for 4 launcher ranks");
  CHECK_THROWS_WITH(place_ranks({0}, "random", 1),
                    Contains("use topology, nodes or launcher"));
}

TEST_CASE("emulated launcher: interleave-sites takes the sites' nodes in turn",
          "[placement][emulate][sites]") {
  const cluster::Cluster cl = cluster::parse_cluster(
      "nodes: 4\ndevices_per_node: 2\ndevice: {name: cpu-rank, peak_bf16_tflops: 0.05, "
      "peak_fp32_tflops: 0.05, memory_gib: 24, hbm_GBps: 10}\n"
      "intra: {bandwidth_GBps: 1, latency_us: 5}\ninter: {bandwidth_GBps: 1, latency_us: 5}\n"
      "sites: [2, 2]\nwan: {bandwidth_GBps: 0.1, latency_us: 100}\n",
      "two-sites");
  CHECK(emulate::launcher_devices(cl, 8, "interleave-sites") ==
        std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7});
  CHECK(emulate::launcher_nodes(cl, 4, "interleave-sites") == std::vector<int>{0, 0, 2, 2});
  CHECK(emulate::launcher_sites(cl, 8, "interleave-sites") ==
        std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1});
  CHECK(emulate::launcher_sites(cl, 8, "block") == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  // The placement rebuilds the site order from it.
  const Placement p = place_ranks(emulate::launcher_nodes(cl, 8, "interleave-sites"), "topology", 2,
                                  emulate::launcher_sites(cl, 8, "interleave-sites"));
  CHECK(p.layout_sites() == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  // One site: no sites.
  CHECK(emulate::launcher_sites(cluster::load_cluster("cpu-here"), 1, "block").empty());
}
