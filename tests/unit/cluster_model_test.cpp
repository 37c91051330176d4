// The cluster file and the collective cost model (parallel/cluster/): every
// preset parses and round-trips, bad files are named errors (file:line, key),
// and the collective times equal the ring / hierarchical formulas worked out
// here by hand (docs/cluster.md).
#include <catch2/catch.hpp>

#include <cmath>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/collectives.hpp"

using namespace adgt::cluster;
using Catch::Matchers::Contains;

namespace {
Cluster two_nodes() {
  return parse_cluster(R"(name: t
nodes: 2
devices_per_node: 4
device: {peak_bf16_tflops: 100, peak_fp32_tflops: 10, memory_gib: 16, hbm_GBps: 1000}
intra: {bandwidth_GBps: 100, latency_us: 2}
inter: {bandwidth_GBps: 10, latency_us: 10, efficiency: 0.5}
nics_per_node: 2
)",
                       "t.yaml");
}
std::string error_of(const std::string& yaml) {
  try {
    parse_cluster(yaml, "bad.yaml");
  } catch (const adgt::ConfigError& e) {
    return e.what();
  }
  return "";
}
const char* kDevice =
    "device: {peak_bf16_tflops: 100, peak_fp32_tflops: 10, memory_gib: 16, hbm_GBps: 1000}\n";
}  // namespace

TEST_CASE("cluster: every preset parses and round-trips through to_yaml", "[cluster]") {
  REQUIRE(cluster_presets().size() >= 4);
  for (const std::string& p : cluster_presets()) {
    INFO(p);
    const Cluster c = load_cluster(p);
    CHECK(c.name == p);
    CHECK(c.device.peak_bf16_flops > 0);
    Cluster back = parse_cluster(to_yaml(c), "roundtrip");
    back.source = c.source;
    CHECK(back == c);
  }
  const Cluster h = load_cluster("dgx-h100");
  CHECK(h.device.peak_bf16_flops == Approx(989e12));
  CHECK(h.inter.bandwidth == Approx(50e9));
  CHECK(with_gpus(h, 256).nodes == 32);
  CHECK(with_gpus(h, 4).devices_per_node == 4);
  CHECK_THROWS_WITH(with_gpus(h, 12), Contains("not a multiple of the 8 devices per node"));
}

TEST_CASE("cluster: bad files name the file, the line and the key", "[cluster]") {
  CHECK_THAT(error_of(std::string("nodes: 1\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\nnic: 3\n"),
             Contains("bad.yaml:5: nic: unknown key; allowed:"));
  CHECK_THAT(error_of(std::string("nodes: 2\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"),
             Contains("inter is required with nodes > 1"));
  CHECK_THAT(error_of(std::string("nodes: 1\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: fast, latency_us: 1}\n"),
             Contains("bad.yaml:4: intra.bandwidth_GBps: expected a number, got 'fast'"));
  CHECK_THAT(error_of(std::string("nodes: 2\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"
                      "inter: {bandwidth_GBps: 1, latency_us: 1}\nnode_speed: [1, 1, 1]\n"),
             Contains("bad.yaml:6: node_speed: has 3 entries but nodes=2"));
  CHECK_THAT(error_of(std::string("nodes: 2\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"
                      "inter: {bandwidth_GBps: 1, latency_us: 1}\nsites: [1, 2]\n"),
             Contains("sites: the node counts sum to 3 but nodes=2"));
  CHECK_THAT(error_of(std::string("nodes: 2\ndevices_per_node: 8\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"
                      "inter: {bandwidth_GBps: 1, latency_us: 1}\n"
                      "link_overrides:\n  - {nodes: [0, 5], bandwidth_GBps: 1, latency_us: 1}\n"),
             Contains("bad.yaml:7: link_overrides[0].nodes: node 5 is outside 0..1"));
  CHECK_THAT(error_of(std::string("nodes: 1\ndevices_per_node: 0\n") + kDevice +
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"),
             Contains("bad.yaml:2: devices_per_node: must be >= 1, got 0"));
  CHECK_THAT(error_of("nodes: 1\ndevices_per_node: 1\ndevice: {peak_bf16_tflops: 1}\n"
                      "intra: {bandwidth_GBps: 1, latency_us: 1}\n"),
             Contains("bad.yaml:3: device.peak_fp32_tflops is required"));
  CHECK_THROWS_WITH(load_cluster("no-such-preset"), Contains("neither a preset nor a readable file"));
}

TEST_CASE("collectives: ring and hierarchical times by hand", "[cluster]") {
  const Cluster c = two_nodes();
  const double B = 64e6;
  // One node, 4 ranks: ring all-reduce 2 (p-1)/p B / bw + 2 (p-1) alpha.
  const double ring = 2 * 3.0 / 4 * B / 100e9 + 2 * 3 * 2e-6;
  CHECK(collective_time(c, Collective::AllReduce, {0, 1, 2, 3}, B) == Approx(ring));
  CHECK(collective_time(c, Collective::ReduceScatter, {0, 1, 2, 3}, B) == Approx(ring / 2));
  CHECK(collective_time(c, Collective::AllGather, {0, 1, 2, 3}, B) == Approx(ring / 2));
  // Large messages: NCCL's bus bandwidth of an intra-node ring is the link's.
  CHECK(bus_bandwidth(c, Collective::AllReduce, {0, 1, 2, 3}, 1e12) == Approx(100e9).epsilon(1e-3));
  // Two nodes, one rank each: a rank's share of the NICs is 2 x 10 GB/s x 0.5 / 4 devices.
  const double nic = 2 * 10e9 * 0.5 / 4;
  CHECK(collective_time(c, Collective::AllReduce, {0, 4}, B) ==
        Approx(std::min(2 * 0.5 * B / nic + 2 * 10e-6, 2 * 1 * 10e-6 + 2 * B / nic)));
  // All 8: intra reduce-scatter and all-gather over 4, the node ring on B / 4.
  const double hier = 2 * (3.0 / 4 * B / 100e9 + 3 * 2e-6) + 2 * (0.5 * (B / 4) / nic + 10e-6);
  CHECK(collective_time(c, Collective::AllReduce, {0, 1, 2, 3, 4, 5, 6, 7}, B) == Approx(hier));
  CHECK(collective_time(c, Collective::AllReduce, {3}, B) == 0);
  // Messages.
  CHECK(message_time(c, 0, 1, B) == Approx(2e-6 + B / 100e9));
  CHECK(message_time(c, 0, 5, B) == Approx(10e-6 + B / nic));
  CHECK(message_time(c, 2, 2, B) == 0);
  CHECK_THROWS_WITH(message_time(c, 0, 8, B), Contains("rank 8 is outside the cluster's 8 devices"));
}

namespace {

// 2 sites x 2 nodes x 2 devices joined by a 1 GB/s, 5 ms WAN.
std::string two_sites() {
  return std::string(R"(nodes: 4
devices_per_node: 2
)") + kDevice + R"(intra: {bandwidth_GBps: 100, latency_us: 2}
inter: {bandwidth_GBps: 10, latency_us: 10}
nics_per_node: 2
sites: [2, 2]
wan: {bandwidth_GBps: 1, latency_us: 5000}
)";
}

}  // namespace

TEST_CASE("collectives: a WAN between sites and a slow link override slow the ring", "[cluster]") {
  Cluster c = parse_cluster(two_sites() + R"(link_overrides:
  - {nodes: [0, 1], bandwidth_GBps: 2, latency_us: 50}
)",
                            "wan.yaml");
  CHECK(&c.link_between(0, 2) == &c.wan);
  CHECK(c.link_between(0, 1).bandwidth == Approx(2e9));
  CHECK(&c.link_between(2, 3) == &c.inter);
  // Across the WAN a message shares it with the devices of its node, or with
  // the ranks that send across at once (a pipeline stage: world / pp).
  CHECK(message_time(c, 0, 4, 1e6) == Approx(5000e-6 + 1e6 / (1e9 / 2)));
  CHECK(message_time(c, 0, 4, 1e6, 4) == Approx(5000e-6 + 1e6 / (1e9 / 4)));
  CHECK(message_time(c, 0, 2, 1e6) == Approx(50e-6 + 1e6 / 2e9));
  CHECK(message_time(c, 4, 6, 1e6) == Approx(10e-6 + 1e6 / 10e9));
  // A dp group of one rank per node within site 1: the fast NIC ring; across
  // both sites the ring runs at the WAN's share.
  const double B = 1e8;
  const double site1 = collective_time(c, Collective::AllReduce, {4, 6}, B);
  const double both = collective_time(c, Collective::AllReduce, {0, 2, 4, 6}, B);
  CHECK(site1 == Approx(std::min(B / 10e9 + 2 * 10e-6, 2 * 10e-6 + 2 * B / 10e9)));
  CHECK(both == Approx(std::min(2 * 0.75 * B / 0.5e9 + 6 * 5000e-6, 2 * 2 * 5000e-6 + 2 * B / 0.5e9)));
}

TEST_CASE("collectives: the WAN is one pipe per direction; the hierarchical reduction crosses it once",
          "[cluster][sites]") {
  const Cluster c = parse_cluster(two_sites(), "wan.yaml");
  const double B = 1e8;
  // A ring in site order crosses once each way (a node's 2 devices share
  // it); interleaved, twice each way at once: half of that each.
  const double ordered = collective_time(c, Collective::AllReduce, {0, 2, 4, 6}, B);
  const double interleaved = collective_time(c, Collective::AllReduce, {0, 4, 2, 6}, B);
  CHECK(ordered == Approx(std::min(2 * 0.75 * B / 0.5e9 + 6 * 5000e-6, 2 * 2 * 5000e-6 + 2 * B / 0.5e9)));
  CHECK(interleaved == Approx(std::min(2 * 0.75 * B / 0.25e9 + 6 * 5000e-6, 2 * 2 * 5000e-6 + 2 * B / 0.25e9)));
  // The members by site: equal sites split, others not.
  CHECK(members_by_site(c, {0, 4, 2, 6}) == std::vector<std::vector<int>>{{0, 2}, {4, 6}});
  CHECK(members_by_site(c, {0, 2}).empty());
  CHECK(members_by_site(c, {0, 2, 4}).empty());
  // Hierarchical: inside site 0 (nodes 0, 1), the shard across the WAN
  // (shared by the 2 x 2 devices of the site's nodes), inside again.
  const double cross = 2 * (0.5 * (B / 2) / (1e9 / 4) + 5000e-6);
  CHECK(cross_site_time(c, Collective::AllReduce, {0, 4}, B / 2, 2) == Approx(cross));
  const double rs = collective_time(c, Collective::ReduceScatter, {0, 2}, B);
  const double ag = collective_time(c, Collective::AllGather, {0, 2}, B);
  CHECK(reduction_time(c, Collective::AllReduce, {0, 2, 4, 6}, B, SiteReduce::Hierarchical) ==
        Approx(rs + cross + ag));
  CHECK(reduction_time(c, Collective::ReduceScatter, {0, 2, 4, 6}, B, SiteReduce::Hierarchical) ==
        Approx(rs + cross / 2));
  CHECK(reduction_time(c, Collective::AllReduce, {0, 2, 4, 6}, B, SiteReduce::Flat) == Approx(ordered));
  CHECK(reduction_time(c, Collective::AllReduce, {0, 2}, B, SiteReduce::Hierarchical) ==
        Approx(collective_time(c, Collective::AllReduce, {0, 2}, B)));
  // WAN bytes: hierarchical, 2 cross groups x 2 members x 2 passes x 1/2 of
  // the B/2 shard = B each way; flat, the 4-node ring's 2 crossing hops x 2
  // passes x 3/4 B.
  CHECK(wan_bytes(c, Collective::AllReduce, {0, 2, 4, 6}, B, SiteReduce::Hierarchical) == Approx(2 * B));
  CHECK(wan_bytes(c, Collective::AllReduce, {0, 2, 4, 6}, B, SiteReduce::Flat) == Approx(3 * B));
  CHECK(wan_bytes(c, Collective::ReduceScatter, {0, 2, 4, 6}, B, SiteReduce::Hierarchical) == Approx(B));
  CHECK(wan_bytes(c, Collective::AllReduce, {0, 2}, B, SiteReduce::Flat) == 0);
  CHECK(wan_bytes(c, Collective::AllToAll, {0, 4}, B, SiteReduce::Flat) == Approx(B));
  CHECK(message_wan_bytes(c, 0, 4, B) == B);
  CHECK(message_wan_bytes(c, 0, 2, B) == 0);
}

TEST_CASE("collectives: an all-to-all runs at the slowest link between any two of its nodes", "[cluster]") {
  // Four nodes of one rank; the slow link joins nodes 0 and 2, which are not
  // neighbours on the group's node ring 0-1-2-3-0: a ring collective never
  // crosses it, an all-to-all does.
  Cluster c = parse_cluster(std::string(R"(nodes: 4
devices_per_node: 1
)") + kDevice + R"(intra: {bandwidth_GBps: 100, latency_us: 2}
inter: {bandwidth_GBps: 10, latency_us: 10}
link_overrides:
  - {nodes: [0, 2], bandwidth_GBps: 1, latency_us: 100}
)",
                            "a2a.yaml");
  const double B = 1e8;
  // Group {0, 1, 2, 3}: the node ring is 0-1-2-3-0, which never uses 0-2.
  const double a2a = collective_time(c, Collective::AllToAll, {0, 1, 2, 3}, B);
  CHECK(a2a == Approx(3.0 / 4 * B / 1e9 + 100e-6));
  // Without the slow pair the NIC's bandwidth decides.
  CHECK(collective_time(c, Collective::AllToAll, {0, 1, 3}, B) == Approx(2.0 / 3 * B / 10e9 + 10e-6));
}

TEST_CASE("collectives: NCCL's bus bandwidth on an H100 node", "[cluster]") {
  // nccl-tests' ring all-reduce on 8 H100s of an HGX board: 741 GB/s
  // bidirectional bus bandwidth for large buffers, 370.7 GB/s per direction
  // (ASTRA-sim's hardware validation, docs/cluster.md). The preset within 5%.
  const Cluster h = with_gpus(load_cluster("dgx-h100"), 8);
  const double bus = bus_bandwidth(h, Collective::AllReduce, {0, 1, 2, 3, 4, 5, 6, 7}, 8e9);
  CHECK(bus == Approx(370.7e9).epsilon(0.05));
}
