// The parallel context of one rank: the layout it runs, its place in it and
// the process groups it belongs to, as an Engine is built from them
// (parallel/engine/engine.hpp), and the emulation's wrapping of those groups.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/layout.hpp"

namespace adgt {

class Backend;

namespace emulate {
class ComputeSlowdown;
class EmulatedComm;
struct Emulation;
}  // namespace emulate

// The layout and the process groups this rank belongs to (nullptr: a group of one).
struct ParallelContext {
  // The layout the groups were made for and this rank's place in it (none:
  // the configuration's layout, this rank at the origin: a single process).
  std::optional<Layout> layout;
  RankCoords coords;
  Comm* tp = nullptr;
  Comm* dp = nullptr;
  Comm* pp = nullptr;     // the pipeline group: the same tp and dp coordinates, every stage
  Comm* ep = nullptr;     // expert parallelism: ep consecutive ranks of the dp group
  Comm* edp = nullptr;    // the dp ranks holding the same experts
  Comm* world = nullptr;  // every rank of the run: checkpoints are saved and loaded over it
  // Context parallelism (core/layout.hpp Group::cp, dpcp; docs/context-parallel.md):
  // the ranks sharing each sequence, and those holding the same weights (the
  // dp group itself when cp = 1).
  Comm* cp = nullptr;
  Comm* dpcp = nullptr;
  Comm* edpcp = nullptr;  // of dpcp, the ranks holding the same experts (edp when cp = 1)
  int world_rank = 0;     // rank 0 logs, prints and commits checkpoints
  // Link and compute emulation (parallel/emulate/, docs/emulation.md; not
  // owned). emulation: set up by the launcher for the rank table (nullptr:
  // the trainer sets it up when emulate.cluster asks for it). slowdown: this
  // rank's compute slowdown hook (nullptr: none).
  emulate::Emulation* emulation = nullptr;
  emulate::ComputeSlowdown* slowdown = nullptr;
  // Per world rank: its site (parallel/cluster/placement.hpp layout_sites();
  // docs/sites.md); empty: one site.
  std::vector<int> sites;
  // parallel.auto's plan as JSON (parallel/plan/planner.hpp plan_json; "":
  // none): logged to metrics.jsonl at the start and kept in every checkpoint
  // as state/plan/chosen.
  std::string plan_json;
};

// The hierarchical reduction over sites (parallel/comm/site_comm.hpp,
// docs/sites.md): every data-parallel group of ctx (dp, edp, dpcp, edpcp;
// each distinct object once) whose members span ctx.sites in equal numbers
// becomes a SiteComm over sub-groups split from its MPI transport (under the
// emulation, each sub-group delayed as its own members: the WAN only on the
// cross-site exchange). A group already wrapped for a device backend (a
// DeviceComm: wrap the device groups first) gets sub-groups wrapped alike,
// each with its own NCCL communicator when `nccl`, and device scratch from
// `be`. ctx's slots point at the wrappers, which it returns (they must
// outlive every user of ctx). Groups left flat (one site, unequal sites, a
// transport that is not MPI) are named in *notes, one line each.
// Collective over each group, in this order on every rank.
std::vector<std::unique_ptr<Comm>> wrap_site_groups(ParallelContext& ctx,
                                                    emulate::Emulation* emulation,
                                                    std::vector<std::string>* notes = nullptr,
                                                    Backend* be = nullptr, bool nccl = false);
// each distinct object once) whose members span ctx.sites in equal numbers
// becomes a SiteComm over sub-groups split from its MPI transport (under the
// emulation, each sub-group delayed as its own members: the WAN only on the
// cross-site exchange). ctx's slots point at the wrappers, which it returns
// (they must outlive every user of ctx). Groups left flat (one site, unequal
// sites, a transport that is not MPI) are named in *notes, one line each.
// Collective over each group, in this order on every rank.
std::vector<std::unique_ptr<Comm>> wrap_site_groups(ParallelContext& ctx,
                                                    emulate::Emulation* emulation,
                                                    std::vector<std::string>* notes = nullptr);

namespace emulate {
// Wraps every group of ctx (tp, dp, pp, ep, edp, world; each distinct object
// once) in an EmulatedComm with a private control channel, points ctx at the
// wrappers and at emu's slowdown; returns the wrappers (they must outlive
// every user of ctx). Collective over each group, in this order on every rank.
std::vector<std::unique_ptr<Comm>> wrap_emulated_groups(ParallelContext& ctx, Emulation& emu);
// One group's EmulatedComm over `c` (members: the group's world ranks in
// group order), with a private control channel split from c when it is an
// MpiComm. Collective over the group.
std::unique_ptr<EmulatedComm> emulated_group(Comm& c, Emulation& emu, std::vector<int> members);
}  // namespace emulate

// Points every group slot of ctx (tp, dp, pp, ep, edp, world, cp, dpcp,
// edpcp, in that order) at wrap(group, its Comm): distinct Comm objects are
// wrapped once (a slot sharing another's object shares its wrapper); empty
// slots are left empty unless `fill` makes them a SelfComm of the group's
// name first. Returns what it made (wrappers and fills), which must outlive
// every user of ctx.
std::vector<std::unique_ptr<Comm>> wrap_groups(
    ParallelContext& ctx, const std::function<std::unique_ptr<Comm>(Group, Comm&)>& wrap, bool fill = false);

// Wraps every group of ctx (each distinct object once) in a TracedComm
// (parallel/comm/traced_comm.hpp: its blocking calls on the rank's timeline
// while log.trace records) and points ctx at the wrappers, which it returns
// (they must outlive every user of ctx). Local: no communication.
std::vector<std::unique_ptr<Comm>> wrap_traced_groups(ParallelContext& ctx);

}  // namespace adgt
