#include "parallel/mesh/process_groups.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "kernels/check.hpp"
#include "parallel/mesh/device_assign.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"

namespace adgt {

namespace {

std::string layout_str(const Layout& l) {
  std::ostringstream os;
  os << "tp=" << l.tp;
  if (l.cp > 1) os << " x cp=" << l.cp;
  os << " x dp=" << l.dp << " x pp=" << l.pp;
  return os.str();
}

std::string mismatch_message(const Layout& l, int world) {
  std::ostringstream os;
  os << "parallel: " << layout_str(l) << " = " << l.world() << " ranks but the launch has "
     << world << " (mpirun -np / srun -n); use -np " << l.world() << " / -n " << l.world();
  const int64_t fixed = l.tp * l.cp * l.pp;  // all but dp
  if (world % fixed == 0)
    os << ", or parallel.dp=" << world / fixed << " for " << world << " ranks";
  else
    os << ", or a layout whose tp x " << (l.cp > 1 ? "cp x " : "") << "dp x pp is " << world;
  return os.str();
}

MpiComm& as_mpi(const Comm& c) {
  auto* m = dynamic_cast<const MpiComm*>(&c);
  ADGT_CHECK(m, "process groups: group '" << c.name() << "' is not an MpiComm");
  return const_cast<MpiComm&>(*m);
}

// A placement covers the launch's ranks once each (the same verdict on every rank).
void check_placement(const Placement& p, int world) {
  if (p.layout_of.empty() && p.launcher_of.empty()) return;
  auto bad = [&](const std::string& what) {
    throw CollectiveError("parallel.placement=" + p.mode + ": " + what + " (launch of " +
                          std::to_string(world) + " ranks)");
  };
  if (int(p.layout_of.size()) != world || int(p.launcher_of.size()) != world)
    bad("the placement covers " + std::to_string(p.layout_of.size()) + " launcher ranks and " +
        std::to_string(p.launcher_of.size()) + " layout ranks");
  for (int r = 0; r < world; ++r) {
    const int l = p.layout_of[size_t(r)];
    if (l < 0 || l >= world || p.launcher_of[size_t(l)] != r)
      bad("launcher rank " + std::to_string(r) + " -> layout rank " + std::to_string(l) +
          " is not a one-to-one map");
  }
}

}  // namespace

namespace {

// The sites of the launcher ranks from ADGT_SITE (a site name per process;
// docs/sites.md): ids in order of first appearance, empty when no rank sets
// it or all name one site. Collective over `world`.
std::vector<int> sites_of_env(MpiComm& world) {
  const char* v = std::getenv("ADGT_SITE");
  const std::vector<std::string> all = world.all_gather_strings(v ? v : "");
  std::vector<int> unset;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].empty()) unset.push_back(int(r));
  if (unset.size() == all.size()) return {};
  if (!unset.empty()) {
    std::string list;
    for (size_t i = 0; i < unset.size() && i < 8; ++i) list += (i ? "," : "") + std::to_string(unset[i]);
    if (unset.size() > 8) list += ",...";
    throw CollectiveError("ADGT_SITE is set on some ranks but not on launcher ranks " + list +
                          " (" + std::to_string(unset.size()) + " of " + std::to_string(all.size()) +
                          "); set it on every rank (the site, i.e. datacenter, of its host) or on none");
  }
  std::vector<int> ids = nodes_of_hosts(all);  // site names -> ids by first appearance
  for (int s : ids)
    if (s != ids.front()) return ids;
  return {};
}

}  // namespace

Placement place_launch(const RunConfig& cfg) {
  int init = 0;
  ADGT_MPI(MPI_Initialized(&init));
  ADGT_CHECK(init, "place_launch: MPI is not running; create an adgt::MpiEnv first");
  auto launch_world = MpiComm::world("placement");
  const int W = launch_world->size();
  std::vector<int> nodes, sites;
  if (!cfg.emulate.cluster.empty()) {
    const cluster::Cluster cl = emulate::load_emulated_cluster(cfg, W);
    try {
      nodes = emulate::launcher_nodes(cl, W, cfg.emulate.rank_order);
      sites = emulate::launcher_sites(cl, W, cfg.emulate.rank_order);
    } catch (const std::exception& e) {  // the same on every rank
      throw CollectiveError(e.what());
    }
  } else {
    nodes = nodes_of_hosts(launch_world->all_gather_strings(host_name()));
    sites = sites_of_env(*launch_world);
  }
  try {
    return place_ranks(nodes, cfg.parallel.placement, int(cfg.parallel.tp), sites);
  } catch (const std::exception& e) {
    throw CollectiveError(e.what());
  }
}

ProcessGroups make_process_groups(const Layout& layout, const Placement& placement) {
  int init = 0;
  ADGT_MPI(MPI_Initialized(&init));
  ADGT_CHECK(init, "make_process_groups: MPI is not running; create an adgt::MpiEnv first");
  ADGT_CHECK(layout.tp >= 1 && layout.dp >= 1 && layout.pp >= 1 && layout.ep >= 1,
             "parallel: " << layout_str(layout) << " ep=" << layout.ep
                          << ": every size must be >= 1");
  ProcessGroups pg;
  pg.launch = detect_launch();
  pg.layout = layout;
  pg.placement = placement;
  auto world = MpiComm::world("world");
  if (world->size() != layout.world())  // the same verdict on every rank
    throw CollectiveError(mismatch_message(layout, world->size()));
  check_placement(placement, world->size());
  // The world in layout order: one MPI_Comm_split, color 0, key = layout rank.
  if (!placement.identity()) {
    const int layout_rank = placement.layout_rank(world->rank());
    world = world->split(0, layout_rank, "world");
    ADGT_CHECK(world->rank() == layout_rank,
               "process groups: MPI_Comm_split of the world gave rank " << world->rank()
                   << ", want layout rank " << layout_rank << " (launcher rank "
                   << placement.launcher_rank(layout_rank) << ")");
  }
  const int me = world->rank();
  pg.coords = coords_of(layout, me);
  // Each group is split off with its first member as the color and this
  // rank's place in it as the key, so MPI's group rank k is entry k of
  // group_ranks().
  auto split = [&](Group g) {
    const std::vector<int> members = group_ranks(layout, g, me);
    const int mine = group_rank(layout, g, me);
    auto c = world->split(members.front(), mine, group_name(g));
    ADGT_CHECK(c->size() == int(members.size()) && c->rank() == mine,
               "process groups: MPI_Comm_split gave " << group_name(g) << " size " << c->size()
                                                      << " rank " << c->rank() << ", want size "
                                                      << members.size() << " rank " << mine);
    return c;
  };
  pg.tp = split(Group::tp);
  pg.dp = split(Group::dp);
  pg.pp = split(Group::pp);
  pg.ep = split(Group::ep);
  pg.edp = split(Group::edp);
  pg.cp = split(Group::cp);
  pg.dpcp = split(Group::dpcp);
  pg.edpcp = split(Group::edpcp);
  pg.world = std::move(world);
  return pg;
}

std::string rank_table(const ProcessGroups& pg, const std::string& device,
                       const std::string& collectives, const emulate::Emulation* emulation) {
  const Placement& pl = pg.placement;
  const bool launcher_col = !pl.identity(), node_col = !pl.node_of.empty();
  const bool site_col = !pl.layout_sites().empty();
  const int me = pg.world->rank();
  std::ostringstream mine;
  mine << me;
  if (launcher_col) mine << '\t' << pl.launcher_rank(me);
  mine << '\t' << pg.launch.host << '\t' << pg.launch.local_rank << '/' << pg.launch.local_world;
  if (node_col) mine << '\t' << pl.node_of_layout(me);
  if (site_col) mine << '\t' << pl.site_of_layout(me);
  const bool cp_col = pg.layout.cp > 1;
  mine << '\t' << pg.coords.tp;
  if (cp_col) mine << '\t' << pg.coords.cp;
  mine << '\t' << pg.coords.dp << '\t' << pg.coords.pp << '\t' << device
       << '\t' << collectives;
  if (emulation) mine << '\t' << emulation->cell(me);
  std::vector<std::string> lines = as_mpi(*pg.world).gather_strings(mine.str(), 0);
  if (lines.empty()) return "";
  std::vector<std::vector<std::string>> rows(1);
  rows[0].push_back("rank");
  if (launcher_col) rows[0].push_back("launcher");
  rows[0].insert(rows[0].end(), {"host", "local"});
  if (node_col) rows[0].push_back("node");
  if (site_col) rows[0].push_back("site");
  rows[0].push_back("tp");
  if (cp_col) rows[0].push_back("cp");
  rows[0].insert(rows[0].end(), {"dp", "pp", "device", "collectives"});
  if (emulation) rows[0].push_back("emulated");
  for (const std::string& l : lines) {
    std::vector<std::string> f;
    std::stringstream ss(l);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    rows.push_back(f);
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::ostringstream os;
  os << "rank table: " << layout_str(pg.layout) << " = " << pg.layout.world() << " ranks, launcher "
     << pg.launch.launcher << "\n";
  if (!pl.why.empty()) os << "  " << pl.why << "\n";
  if (!pl.warning.empty()) os << "  warning: " << pl.warning << "\n";
  if (emulation) os << "  " << emulation->summary() << "\n";
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      os << "  " << r[i];
      if (i + 1 < r.size()) os << std::string(w[i] - r[i].size(), ' ');
    }
    os << "\n";
  }
  return os.str();
}

void verify_device_assignment(const ProcessGroups& pg, const std::string& device,
                              bool allow_shared) {
  std::vector<std::string> all = as_mpi(*pg.world).all_gather_strings(pg.launch.host + '\n' + device);
  std::vector<DeviceSlot> slots;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto nl = all[r].find('\n');
    slots.push_back({int(r), all[r].substr(0, nl), all[r].substr(nl + 1)});
  }
  try {
    check_device_assignment(slots, allow_shared);
  } catch (const std::exception& e) {
    throw CollectiveError(e.what());  // every rank checked the same slots
  }
}

}  // namespace adgt
