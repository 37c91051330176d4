// Time of a collective or a message on a cluster (docs/cluster.md,
// "Collectives"): the one latency-bandwidth model that the simulator, the
// planner's ranking, the controllers and the link emulation's delays use.
//
// A group is a list of world ranks; its members sit on nodes by
// Cluster::node_of. Algorithms, as NCCL runs them:
// - within one node: a ring over the intra link;
// - across nodes: hierarchical — reduce-scatter inside each node, a ring over
//   the nodes on each rank's 1/g share (g members per node), all-gather inside
//   each node; for small messages a tree (2 log2 n latency terms) when faster;
// - all-to-all: every member sends (p-1)/p of its buffer, the intra-node part
//   over the intra link and the rest over its share of the node's NICs, at
//   the slowest link between any two of the group's nodes;
// - send/recv: latency + bytes / bandwidth of the link crossed;
// - ring shift (context parallelism's K/V exchange): every member sends its
//   buffer to the next member in group order at once, the slowest of those
//   messages.
// NIC sharing: every device of a node runs the same kind of collective at the
// same time (SPMD), so a rank's inter-node bandwidth is
// nics_per_node * inter / (devices active on the node); a WAN link is shared
// by every rank of a node crossing it. Link overrides and the WAN slow the
// ring to its slowest hop. The share assumes every device of a node is busy,
// also on a node the run uses only partly (a conservative bandwidth there).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/cluster/cluster.hpp"

namespace adgt::cluster {

enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, RingShift };
const char* collective_name(Collective c);  // "all_reduce", ...

// Seconds for `c` over the group `ranks` (world ranks, group order), where
// `bytes` is the size of the full buffer of one member: all-reduce's tensor,
// reduce-scatter's input, all-gather's output, all-to-all's send buffer.
// A group of one takes 0.
double collective_time(const Cluster& cl, Collective c, const std::vector<int>& ranks,
                       double bytes);

// Seconds for one message of `bytes` from world rank `from` to `to`
// (0 when from == to), with the NIC sharing above. Across the WAN the message
// shares it with `wan_senders` ranks sending across at once (a pipeline stage
// boundary on the WAN: every rank of the stage, world / pp); 0: the
// devices of one node.
double message_time(const Cluster& cl, int from, int to, double bytes, int64_t wan_senders = 0);

// The data-parallel reduction of a group whose members span sites
// (parallel.site_reduce; docs/sites.md, parallel/comm/site_comm.hpp).
enum class SiteReduce { Flat, Hierarchical };

// The group's members (world ranks) by site: sites in the order of their
// first member, each site's members in group order. Empty when they sit on
// one site or the sites hold unequal numbers of them (SiteComm then runs the
// group flat).
std::vector<std::vector<int>> members_by_site(const Cluster& cl, const std::vector<int>& ranks);

// The cross-site phase of the hierarchical reduction: c over `cross` (one
// member per site, site order) on `bytes` (collective_time's convention, the
// shard), a ring over the sites whose WAN hops are shared by every device of
// the `site_nodes` nodes of the sending site that hold the group (every
// place's cross group runs at once, and every device of those nodes is in
// one: SPMD).
double cross_site_time(const Cluster& cl, Collective c, const std::vector<int>& cross, double bytes,
                       int64_t site_nodes);

// The phases of the hierarchical c over `ranks` (an all-reduce,
// reduce-scatter or all-gather over a group that members_by_site splits;
// nullopt otherwise), seconds: inside each site before (the slowest site's
// reduce-scatter of the whole buffer; 0 for an all-gather), the cross-site
// exchange of each member's 1/k shard (cross_site_time), inside each site
// after (all-gather; 0 for a reduce-scatter).
struct SitePhases {
  double before = 0, cross = 0, after = 0;
};
std::optional<SitePhases> site_phases(const Cluster& cl, Collective c, const std::vector<int>& ranks,
                                      double bytes);

// c over `ranks` as adgt runs it. Hierarchical, for an all-reduce,
// reduce-scatter or all-gather over a group that members_by_site splits:
// SiteComm's phases — inside each site (collective_time over the slowest
// site's members: reduce-scatter of the whole buffer for an all-reduce or a
// reduce-scatter), the cross-site exchange of each member's 1/k shard
// (cross_site_time), inside each site again (all-gather for an all-reduce or
// an all-gather): the sum of site_phases. Anything else: collective_time.
double reduction_time(const Cluster& cl, Collective c, const std::vector<int>& ranks, double bytes,
                      SiteReduce how);

// Bytes crossing the WAN, all members and directions together, for one c
// over `ranks` as reduction_time runs it: hierarchical, each cross group's
// ring (all-reduce 2(S-1)/S of the shard per member, reduce-scatter and
// all-gather (S-1)/S); flat, NCCL's node ring (each hop from one site to
// another carries (n-1)/n of the buffer per pass over n nodes: 2 passes for
// an all-reduce); an all-to-all, each member's (p-1)/p share to the members
// of other sites. 0 on one site.
double wan_bytes(const Cluster& cl, Collective c, const std::vector<int>& ranks, double bytes,
                 SiteReduce how);
// One message's WAN bytes: `bytes` when from and to sit on different sites, else 0.
double message_wan_bytes(const Cluster& cl, int from, int to, double bytes);

// NCCL's bus bandwidth of an all-reduce (nccl-tests' busBw = 2(p-1)/p *
// bytes / time): what docs/cluster.md compares with published measurements.
double bus_bandwidth(const Cluster& cl, Collective c, const std::vector<int>& ranks, double bytes);

}  // namespace adgt::cluster
