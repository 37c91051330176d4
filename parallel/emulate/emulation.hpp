// Link and compute emulation for CPU ranks (docs/emulation.md), configured by
// emulate.cluster and emulate.slow_ranks: one cluster file, one Comm decorator
// on every group (emulated_comm.hpp), one compute slowdown hook
// (slowdown.hpp). Off unless emulate.cluster is set.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/emulate/emulated_comm.hpp"
#include "parallel/emulate/slowdown.hpp"

namespace adgt {
struct Placement;
}

namespace adgt::emulate {

// The run's emulation, the same on every rank but for `state` and `slowdown`,
// which are this rank's. "World rank" below is the layout rank (the rank of
// the process groups' world, parallel/cluster/placement.hpp); the launcher (MPI) rank
// decides the device under emulate.rank_order and is the key of
// emulate.slow_ranks.
struct Emulation {
  std::string spec;                  // emulate.cluster as configured
  cluster::Cluster cluster;
  std::string rank_order = "block";  // emulate.rank_order
  int world = 1;                     // ranks of the run
  std::vector<int> launcher_of;      // per world rank: its launcher rank
  std::vector<int> devices;          // per world rank: its device of the cluster
  std::vector<int> nodes;            // per world rank: its node (device / devices_per_node)
  std::vector<double> factors;       // per world rank: compute slowdown (>= 1) from the start
  // Per world rank: a further slowdown from step onset_step on
  // (emulate.slow_ranks "rank:factor@step"; factor 1: none).
  std::vector<double> onset_factor;
  std::vector<int64_t> onset_step;
  // emulate.link_bandwidth: (from step, factor) of every link's bandwidth,
  // steps ascending; the cluster as loaded is `base`.
  std::vector<std::pair<int64_t, double>> link_schedule;
  cluster::Cluster base;
  double link_factor = 1;
  // emulate.slow_links in world ranks: the link between a and b takes
  // `factor` times the model's time from step from_step on.
  struct SlowLinkW {
    int a = 0, b = 0;
    double factor = 1;
    int64_t from_step = 0;
  };
  std::vector<SlowLinkW> slow_links;
  int world_rank = 0;
  ClockKind clock = ClockKind::Wall;  // emulate.clock
  double model_flops = 0;             // emulate.model_flops (the model clock's compute rate)
  int cores = 0;                      // virtual clock: the host's core tokens (0: none)
  std::shared_ptr<EmulatedRank> state;
  ComputeSlowdown slowdown;
  // emulate.power_cap_w: this rank's further slowdown, what the power model
  // says the capped device's clock costs its compute at the running
  // micro-batch (>= 1; 1: not throttled). The throttling this rank reports.
  double power_factor = 1;
  bool onset_on = false;  // the "rank:factor@step" slowdown has started
  // Sets power_factor; the slowdown becomes factors x onset x power.
  void set_power_factor(double f);

  // The training loop calls this at the start of every step: a straggler
  // injected mid-run ("rank:factor@step") starts computing slower here, and
  // the links take emulate.link_bandwidth's factor of that step (every rank
  // calls it at the same step, so every member of a group times its
  // collectives on the same cluster).
  void at_step(int64_t step);  // ... and emulate.slow_links' links of this rank
  // The link times of the messages this rank received in the group named
  // `group` (an EmulatedComm's name: "pp", ...) since the last call, per
  // sender's group rank (the differences of EmulatedRank::link_in since
  // then; senders with no new message left out).
  std::map<int, EmulatedRank::LinkTime> take_link_times(const std::string& group);
  // The same since the start (EmulatedRank::link_in): for a reader that
  // keeps its own last totals and must not take take_link_times' samples.
  std::map<int, EmulatedRank::LinkTime> link_totals(const std::string& group) const;
  // link_in as of the last take_link_times, per group and sender.
  std::map<std::pair<std::string, int>, EmulatedRank::LinkTime> taken;
  // "emulation: cluster <name> (<source>): ..." — the cluster, its links and
  // the slow ranks, one line.
  std::string summary() const;
  // World rank r's cell of the rank table: "node 1" or "node 1, compute x2".
  std::string cell(int world_rank) const;
};

// The cluster of emulate.cluster for a run of `world` ranks. Throws the same
// CollectiveError on every rank, naming emulate.cluster, when it is neither a
// preset nor a readable file or has fewer devices than the run has ranks.
cluster::Cluster load_emulated_cluster(const RunConfig& cfg, int world);
// Before the launch (adgt-train's input checks): the emulation's inputs for a
// world of `world` ranks — the cluster loads and is large enough, the slow
// ranks and links name ranks of the run. Throws ConfigError (the run file's
// name, the key, the fix); nothing when emulate.cluster is unset.
void check_emulation_inputs(const RunConfig& cfg, int world);

// The device of each launcher rank 0..world-1 on `cl` as the emulated launcher
// hands them out (emulate.rank_order): "block": rank r is device r (node r /
// devices_per_node); "round-robin": rank r is on node r % nodes, as its
// (r / nodes)-th device (mpirun --map-by node); "interleave-sites": block
// over the nodes taken from the cluster's sites in turn (site 0's first node,
// site 1's first, site 0's second, ...: a host list alternating datacenters).
// Pure; throws
// std::invalid_argument for another order or too small a cluster.
std::vector<int> launcher_devices(const cluster::Cluster& cl, int world,
                                  const std::string& rank_order);
// c with every link's bandwidth (intra, inter, wan, overrides) times f;
// latencies unchanged (emulate.link_bandwidth).
cluster::Cluster scale_link_bandwidth(const cluster::Cluster& c, double f);

// The node of each launcher rank: cl.node_of(launcher_devices(...)[r]).
std::vector<int> launcher_nodes(const cluster::Cluster& cl, int world,
                                const std::string& rank_order);
// The device of each layout rank of a `world`-rank run of cfg on `cl`: the
// emulated launcher's devices (emulate.rank_order) reordered by
// parallel.placement, as the run places them (what adgt-sim simulates, so a
// placement that ignores the sites is priced as it runs). Empty when that is
// the identity. Throws std::invalid_argument as launcher_devices and
// place_ranks do.
std::vector<int> layout_devices(const RunConfig& cfg, const cluster::Cluster& cl, int world);
// The site of each launcher rank's node; empty when the cluster has one site.
std::vector<int> launcher_sites(const cluster::Cluster& cl, int world,
                                const std::string& rank_order);

// nullptr when cfg.emulate.cluster is "". Otherwise loads the cluster and
// checks, collectively over `world` (the process groups' world; nullptr: a
// single process), that it has a device for every rank, that every rank runs
// on one host (the delays use a clock all ranks share) and that no node it
// uses is faster than real (node_speed <= 1); every rank throws the same
// CollectiveError naming emulate.cluster. world_rank: this process's rank of
// `world` (its layout rank). placement (nullptr: the identity): which launcher
// rank each world rank is, so world rank r sits on the device
// launcher_devices() gives its launcher rank. The compute factor of world
// rank r is the emulate.slow_ranks factor of its launcher rank / node_speed of
// its node.
std::unique_ptr<Emulation> setup_emulation(const RunConfig& cfg, Comm* world, int world_rank,
                                           const Placement* placement = nullptr);

}  // namespace adgt::emulate
