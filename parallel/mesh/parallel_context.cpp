#include "parallel/mesh/parallel_context.hpp"

#include <algorithm>
#include <utility>

#include "kernels/check.hpp"
#include "parallel/comm/device_comm.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/site_comm.hpp"
#include "parallel/comm/traced_comm.hpp"
#include "parallel/emulate/emulation.hpp"

namespace adgt::emulate {

std::vector<std::unique_ptr<Comm>> wrap_emulated_groups(ParallelContext& ctx, Emulation& emu) {
  ctx.slowdown = &emu.slowdown;
  if (!ctx.world) return {};  // a single process: no group to delay
  ADGT_CHECK(ctx.layout, "emulation: the process groups come without their layout");
  const Layout lay = *ctx.layout;
  const int me = ctx.world_rank;
  emu.state->wan_senders = lay.world() / std::max<int64_t>(1, lay.pp);  // one stage's ranks
  return wrap_groups(ctx, [&](Group group, Comm& c) -> std::unique_ptr<Comm> {
    return emulated_group(c, emu, group_ranks(lay, group, me));
  });
}

std::unique_ptr<EmulatedComm> emulated_group(Comm& c, Emulation& emu, std::vector<int> members) {
  std::unique_ptr<Comm> control;
  if (auto* m = dynamic_cast<MpiComm*>(&c); m && m->size() > 1)
    control = m->split(0, m->rank(), m->name());  // a private duplicate, same order
  return std::make_unique<EmulatedComm>(c, emu.state, std::move(members), std::move(control));
}

}  // namespace adgt::emulate

namespace adgt {

std::vector<std::unique_ptr<Comm>> wrap_groups(
    ParallelContext& ctx, const std::function<std::unique_ptr<Comm>(Group, Comm&)>& wrap, bool fill) {
  std::vector<std::unique_ptr<Comm>> owned;
  std::vector<std::pair<Comm*, Comm*>> done;  // (object, its wrapper)
  const std::pair<Comm**, Group> slots[] = {{&ctx.tp, Group::tp}, {&ctx.dp, Group::dp},
                                            {&ctx.pp, Group::pp}, {&ctx.ep, Group::ep},
                                            {&ctx.edp, Group::edp}, {&ctx.world, Group::world},
                                            {&ctx.cp, Group::cp},   {&ctx.dpcp, Group::dpcp},
                                            {&ctx.edpcp, Group::edpcp}};
  for (const auto& [slot, group] : slots) {
    if (!*slot && fill) {
      owned.push_back(std::make_unique<SelfComm>(group_name(group)));
      *slot = owned.back().get();
    }
    if (!*slot) continue;
    Comm* wrapped = nullptr;
    for (const auto& [from, to] : done)
      if (from == *slot) wrapped = to;
    if (!wrapped) {
      owned.push_back(wrap(group, **slot));
      wrapped = owned.back().get();
      done.emplace_back(*slot, wrapped);
    }
    *slot = wrapped;
  }
  return owned;
}

std::vector<std::unique_ptr<Comm>> wrap_site_groups(ParallelContext& ctx,
                                                    emulate::Emulation* emulation,
                                                    std::vector<std::string>* notes, Backend* be,
                                                    bool nccl) {
  std::vector<std::unique_ptr<Comm>> owned;
  if (ctx.sites.empty() || !ctx.world || !ctx.layout) return owned;
  const Layout lay = *ctx.layout;
  const int me = ctx.world_rank;
  std::vector<std::pair<Comm*, Comm*>> done;  // (object, its wrapper)
  const std::pair<Comm**, Group> slots[] = {{&ctx.dp, Group::dp}, {&ctx.edp, Group::edp},
                                            {&ctx.dpcp, Group::dpcp}, {&ctx.edpcp, Group::edpcp}};
  for (const auto& [slot, group] : slots) {
    if (!*slot || (*slot)->size() <= 1) continue;
    Comm* wrapped = nullptr;
    for (const auto& [from, to] : done)
      if (from == *slot) wrapped = to;
    if (wrapped) {
      *slot = wrapped;
      continue;
    }
    const std::vector<int> members = group_ranks(lay, group, me);
    std::vector<int> site_of;
    for (int w : members) site_of.push_back(ctx.sites.at(size_t(w)));
    std::string why;
    const std::optional<SiteSplit> split = split_by_site(site_of, &why);
    // A device group (DeviceComm): its host transport is split, and each
    // sub-group wrapped for the device as the group is.
    auto* dc = dynamic_cast<DeviceComm*>(*slot);
    Comm* host = dc ? &dc->host() : *slot;
    auto* em = dynamic_cast<emulate::EmulatedComm*>(host);
    auto* raw = dynamic_cast<MpiComm*>(em ? &em->inner() : host);
    if (split && !raw) why = "its transport is not MPI";
    if (split && dc && !be) why = "a device group without its backend";
    if (!split || !raw || (dc && !be)) {
      // One site needs no note; the others say why the group stays flat.
      if (notes && why != "the group's ranks are on one site")
        notes->push_back(std::string(group_name(group)) + " group: flat reduction: " + why);
      done.emplace_back(*slot, *slot);
      continue;
    }
    const int r = (*slot)->rank();
    const int site = split->site[size_t(r)], place = split->place[size_t(r)];
    // Both splits on every member, in this order (collective over the group).
    std::unique_ptr<Comm> local = raw->split(site, place, std::string(group_name(group)) + "-site");
    std::unique_ptr<Comm> cross = raw->split(place, site, std::string(group_name(group)) + "-wan");
    std::vector<std::unique_ptr<Comm>> keep;
    if (emulation && em) {
      const auto wrap = [&](std::unique_ptr<Comm>& sub, const std::vector<int>& sub_members) {
        auto e = emulate::emulated_group(*sub, *emulation, sub_members);
        keep.push_back(std::move(sub));
        sub = std::move(e);
        return static_cast<emulate::EmulatedComm*>(sub.get());
      };
      std::vector<int> local_members, cross_members;
      for (int i : split->rank_at[size_t(site)]) local_members.push_back(members[size_t(i)]);
      for (const auto& at_site : split->rank_at) cross_members.push_back(members[size_t(at_site[size_t(place)])]);
      wrap(local, local_members);
      // The cross group shares the WAN with every other place's (and every
      // device of the site's nodes holding the group): the cost model's
      // cross-site phase (parallel/cluster/collectives.hpp).
      std::vector<int64_t> site_nodes;
      for (int w : local_members) {
        const int64_t n = emulation->cluster.node_of(emulation->state->device(w));
        if (std::find(site_nodes.begin(), site_nodes.end(), n) == site_nodes.end()) site_nodes.push_back(n);
      }
      wrap(cross, cross_members)
          ->set_timer([nodes = int64_t(site_nodes.size())](const cluster::Cluster& cl,
                                                           cluster::Collective c,
                                                           const std::vector<int>& devices, double bytes) {
            return cluster::cross_site_time(cl, c, devices, bytes, nodes);
          });
    }
    if (dc) {
      // The sub-groups as the group: device tensors staged through them, or
      // on NCCL communicators of their own (made collectively, local then
      // cross, on every member; the emulated transports stay staged).
      const auto device_wrap = [&](std::unique_ptr<Comm>& sub, MpiComm* sub_mpi) {
        std::unique_ptr<Comm> transport =
            nccl && dc->has_device_transport() && !em && sub_mpi && sub->size() > 1
                ? make_nccl_comm(*sub_mpi, *be)
                : nullptr;
        auto wrapped = std::make_unique<DeviceComm>(*sub, *be, std::move(transport));
        keep.push_back(std::move(sub));
        sub = std::move(wrapped);
      };
      MpiComm* local_mpi = em ? nullptr : dynamic_cast<MpiComm*>(local.get());
      MpiComm* cross_mpi = em ? nullptr : dynamic_cast<MpiComm*>(cross.get());
      device_wrap(local, local_mpi);
      device_wrap(cross, cross_mpi);
    }
    owned.push_back(std::make_unique<SiteComm>(**slot, *split, std::move(local), std::move(cross),
                                               std::move(keep), dc ? be : nullptr));
    done.emplace_back(*slot, owned.back().get());
    *slot = owned.back().get();
  }
  return owned;
}

std::vector<std::unique_ptr<Comm>> wrap_traced_groups(ParallelContext& ctx) {
  return wrap_groups(ctx, [](Group, Comm& c) { return std::make_unique<TracedComm>(c); });
}

}  // namespace adgt
