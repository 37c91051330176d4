// Link and compute emulation for CPU ranks (docs/emulation.md), configured by
// emulate.cluster and emulate.slow_ranks: one cluster file, one Comm decorator
// on every group (emulated_comm.hpp), one compute slowdown hook
// (slowdown.hpp). Off unless emulate.cluster is set.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/emulate/emulated_comm.hpp"
#include "parallel/emulate/slowdown.hpp"

namespace adgt {
struct ParallelContext;
}

namespace adgt::emulate {

// The run's emulation, the same on every rank but for `state` and `slowdown`,
// which are this rank's.
struct Emulation {
  std::string spec;                  // emulate.cluster as configured
  cluster::Cluster cluster;
  int world = 1;                     // ranks of the run
  std::vector<double> factors;       // per world rank: compute slowdown (>= 1)
  std::shared_ptr<EmulatedRank> state;
  ComputeSlowdown slowdown;

  // "emulation: cluster <name> (<source>): ..." — the cluster, its links and
  // the slow ranks, one line.
  std::string summary() const;
  // World rank r's cell of the rank table: "node 1" or "node 1, compute x2".
  std::string cell(int world_rank) const;
};

// nullptr when cfg.emulate.cluster is "". Otherwise loads the cluster and
// checks, collectively over `world` (nullptr: a single process), that it has
// a device for every rank, that every rank runs on one host (the delays use a
// clock all ranks share) and that no node it uses is faster than real
// (node_speed <= 1); every rank throws the same CollectiveError naming
// emulate.cluster. The compute factor of world rank r is its
// emulate.slow_ranks factor / node_speed of its node.
std::unique_ptr<Emulation> setup_emulation(const RunConfig& cfg, Comm* world, int world_rank);

// Wraps every group of ctx (tp, dp, pp, ep, edp, world; each distinct object
// once) in an EmulatedComm with a private control channel, points ctx at the
// wrappers and at emu's slowdown; returns the wrappers (they must outlive
// every user of ctx). Collective over each group, in this order on every rank.
std::vector<std::unique_ptr<Comm>> wrap_emulated_groups(ParallelContext& ctx, Emulation& emu);

}  // namespace adgt::emulate
