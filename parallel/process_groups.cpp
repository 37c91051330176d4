#include "parallel/process_groups.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "kernels/check.hpp"
#include "parallel/device_assign.hpp"
#include "parallel/mpi_comm.hpp"
#include "parallel/mpi_env.hpp"

namespace adgt {

namespace {

std::string layout_str(const ParallelDims& d) {
  std::ostringstream os;
  os << "tp=" << d.tp << " x dp=" << d.dp << " x pp=" << d.pp;
  return os.str();
}

std::string mismatch_message(const ParallelDims& d, int world) {
  std::ostringstream os;
  os << "parallel: " << layout_str(d) << " = " << d.world() << " ranks but the launch has "
     << world << " (mpirun -np / srun -n); use -np " << d.world() << " / -n " << d.world();
  if (world % (d.tp * d.pp) == 0)
    os << ", or parallel.dp=" << world / (d.tp * d.pp) << " for " << world << " ranks";
  else
    os << ", or a layout whose tp x dp x pp is " << world;
  return os.str();
}

MpiComm& as_mpi(const Comm& c) {
  auto* m = dynamic_cast<const MpiComm*>(&c);
  ADGT_CHECK(m, "process groups: group '" << c.name() << "' is not an MpiComm");
  return const_cast<MpiComm&>(*m);
}

}  // namespace

ProcessGroups make_process_groups(const ParallelDims& dims) {
  int init = 0;
  ADGT_MPI(MPI_Initialized(&init));
  ADGT_CHECK(init, "make_process_groups: MPI is not running; create an adgt::MpiEnv first");
  ADGT_CHECK(dims.tp >= 1 && dims.dp >= 1 && dims.pp >= 1,
             "parallel: " << layout_str(dims) << ": every size must be >= 1");
  ProcessGroups pg;
  pg.launch = detect_launch();
  pg.dims = dims;
  auto world = MpiComm::world("world");
  if (world->size() != dims.world())  // the same verdict on every rank
    throw CollectiveError(mismatch_message(dims, world->size()));
  pg.coords = coords_of(dims, world->rank());
  const RankCoords& c = pg.coords;
  auto tp = world->split(c.dp + dims.dp * c.pp, c.tp, "tp");
  auto dp = world->split(c.tp + dims.tp * c.pp, c.dp, "dp");
  auto pp = world->split(c.tp + dims.tp * c.dp, c.pp, "pp");
  ADGT_CHECK(tp->size() == dims.tp && tp->rank() == c.tp && dp->size() == dims.dp &&
                 dp->rank() == c.dp && pp->size() == dims.pp && pp->rank() == c.pp,
             "process groups: MPI_Comm_split gave sizes tp " << tp->size() << " dp " << dp->size()
                                                             << " pp " << pp->size());
  // Expert parallelism is carved out of dp: the ep group is ep consecutive dp
  // ranks (same tp and pp), the expert-data-parallel group (replicas of one
  // expert shard) the dp ranks with the same position in their ep group.
  const int ep_n = std::max(1, dims.ep);
  ADGT_CHECK(dims.dp % ep_n == 0, "parallel: ep=" << ep_n << " does not divide dp=" << dims.dp);
  const int dp_block = c.dp / ep_n, ep_rank = c.dp % ep_n;
  auto ep = world->split(c.tp + dims.tp * (c.pp + dims.pp * dp_block), ep_rank, "ep");
  auto edp = world->split(c.tp + dims.tp * (c.pp + dims.pp * ep_rank), dp_block, "edp");
  pg.ep = std::move(ep);
  pg.edp = std::move(edp);
  pg.world = std::move(world);
  pg.tp = std::move(tp);
  pg.dp = std::move(dp);
  pg.pp = std::move(pp);
  return pg;
}

std::string rank_table(const ProcessGroups& pg, const std::string& device) {
  std::ostringstream mine;
  mine << pg.world->rank() << '\t' << pg.launch.host << '\t' << pg.launch.local_rank << '/'
       << pg.launch.local_world << '\t' << pg.coords.tp << '\t' << pg.coords.dp << '\t'
       << pg.coords.pp << '\t' << device;
  std::vector<std::string> lines = as_mpi(*pg.world).gather_strings(mine.str(), 0);
  if (lines.empty()) return "";
  std::vector<std::vector<std::string>> rows = {{"rank", "host", "local", "tp", "dp", "pp", "device"}};
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
  os << "rank table: " << layout_str(pg.dims) << " = " << pg.dims.world() << " ranks, launcher "
     << pg.launch.launcher << "\n";
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
