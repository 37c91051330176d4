#include "parallel/mesh/parallel_context.hpp"

#include <utility>

#include "kernels/check.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/traced_comm.hpp"
#include "parallel/emulate/emulation.hpp"

namespace adgt::emulate {

std::vector<std::unique_ptr<Comm>> wrap_emulated_groups(ParallelContext& ctx, Emulation& emu) {
  std::vector<std::unique_ptr<Comm>> owned;
  ctx.slowdown = &emu.slowdown;
  if (!ctx.world) return owned;  // a single process: no group to delay
  ADGT_CHECK(ctx.layout, "emulation: the process groups come without their layout");
  const std::pair<Comm**, Group> slots[] = {{&ctx.tp, Group::tp}, {&ctx.dp, Group::dp},
                                            {&ctx.pp, Group::pp}, {&ctx.ep, Group::ep},
                                            {&ctx.edp, Group::edp}, {&ctx.world, Group::world},
                                            {&ctx.cp, Group::cp},   {&ctx.dpcp, Group::dpcp},
                                            {&ctx.edpcp, Group::edpcp}};
  std::vector<std::pair<Comm*, Comm*>> done;
  for (const auto& [slot, group] : slots) {
    if (!*slot) continue;
    Comm* wrapped = nullptr;
    for (const auto& [from, to] : done)
      if (from == *slot) wrapped = to;
    if (!wrapped) {
      std::unique_ptr<Comm> control;
      if (auto* m = dynamic_cast<MpiComm*>(*slot); m && m->size() > 1)
        control = m->split(0, m->rank(), m->name());  // a private duplicate, same order
      owned.push_back(std::make_unique<EmulatedComm>(
          **slot, emu.state, group_ranks(*ctx.layout, group, ctx.world_rank), std::move(control)));
      wrapped = owned.back().get();
      done.emplace_back(*slot, wrapped);
    }
    *slot = wrapped;
  }
  return owned;
}

}  // namespace adgt::emulate

namespace adgt {

std::vector<std::unique_ptr<Comm>> wrap_traced_groups(ParallelContext& ctx) {
  std::vector<std::unique_ptr<Comm>> owned;
  std::vector<std::pair<Comm*, Comm*>> done;
  for (Comm** slot : {&ctx.tp, &ctx.dp, &ctx.pp, &ctx.ep, &ctx.edp, &ctx.world, &ctx.cp, &ctx.dpcp,
                      &ctx.edpcp}) {
    if (!*slot) continue;
    Comm* wrapped = nullptr;
    for (const auto& [from, to] : done)
      if (from == *slot) wrapped = to;
    if (!wrapped) {
      owned.push_back(std::make_unique<TracedComm>(**slot));
      wrapped = owned.back().get();
      done.emplace_back(*slot, wrapped);
    }
    *slot = wrapped;
  }
  return owned;
}

}  // namespace adgt
