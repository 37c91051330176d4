#include "parallel/mesh/parallel_context.hpp"

#include <utility>

#include "kernels/check.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/traced_comm.hpp"
#include "parallel/emulate/emulation.hpp"

namespace adgt::emulate {

std::vector<std::unique_ptr<Comm>> wrap_emulated_groups(ParallelContext& ctx, Emulation& emu) {
  ctx.slowdown = &emu.slowdown;
  if (!ctx.world) return {};  // a single process: no group to delay
  ADGT_CHECK(ctx.layout, "emulation: the process groups come without their layout");
  const Layout lay = *ctx.layout;
  const int me = ctx.world_rank;
  return wrap_groups(ctx, [&](Group group, Comm& c) -> std::unique_ptr<Comm> {
    std::unique_ptr<Comm> control;
    if (auto* m = dynamic_cast<MpiComm*>(&c); m && m->size() > 1)
      control = m->split(0, m->rank(), m->name());  // a private duplicate, same order
    return std::make_unique<EmulatedComm>(c, emu.state, group_ranks(lay, group, me), std::move(control));
  });
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

std::vector<std::unique_ptr<Comm>> wrap_traced_groups(ParallelContext& ctx) {
  return wrap_groups(ctx, [](Group, Comm& c) { return std::make_unique<TracedComm>(c); });
}

}  // namespace adgt
