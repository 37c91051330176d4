// Setting up the emulation of a run (emulation.hpp; docs/emulation.md).
#include "parallel/emulate/emulation.hpp"

#include <cstdlib>
#include <filesystem>

#include <sched.h>
#include <unistd.h>

#include <thread>

#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "core/layout.hpp"
#include "core/checkpoint/sharded.hpp"
#include "kernels/check.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/cluster/placement.hpp"

namespace adgt::emulate {

namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

std::string link_text(const cluster::Link& l) {
  return num(l.effective_bandwidth() / 1e9) + " GB/s " + num(l.latency * 1e6) + " us";
}

// FNV-1a of this host's name: equal on ranks of one host.
double host_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  uint32_t h = 2166136261u;
  for (const char* c = name; *c; ++c) h = (h ^ uint32_t(uint8_t(*c))) * 16777619u;
  return double(h);
}

}  // namespace

std::string Emulation::summary() const {
  std::ostringstream os;
  os << "emulation: cluster " << cluster.name << " (" << cluster.source << ") for " << world
     << " ranks: " << cluster.nodes << " nodes x " << cluster.devices_per_node
     << " devices; intra " << link_text(cluster.intra) << ", inter " << link_text(cluster.inter)
     << ", " << cluster.nics_per_node << " NIC(s) per node";
  if (cluster.sites.size() > 1) {
    os << "; " << cluster.sites.size() << " sites (";
    for (size_t i = 0; i < cluster.sites.size(); ++i) os << (i ? ", " : "") << cluster.sites[i];
    os << " nodes) joined by a WAN of " << link_text(cluster.wan);
  }
  if (rank_order != "block") os << "; launcher ranks handed out " << rank_order;
  bool slow = false;
  for (double f : factors) slow = slow || f != 1;
  if (slow) {
    os << "; compute slowdown";
    for (size_t r = 0; r < factors.size(); ++r) {
      if (factors[r] == 1) continue;
      os << " rank " << r;
      if (r < launcher_of.size() && launcher_of[r] != int(r))
        os << " (launcher rank " << launcher_of[r] << ")";
      os << " x" << num(factors[r]);
    }
  }
  for (size_t r = 0; r < onset_factor.size(); ++r)
    if (onset_factor[r] != 1)
      os << "; rank " << r << " x" << num(onset_factor[r]) << " more from step " << onset_step[r];
  for (const auto& [from, f] : link_schedule)
    os << "; links x" << num(f) << " bandwidth from step " << from;
  for (const SlowLinkW& l : slow_links)
    os << "; link " << l.a << "-" << l.b << " x" << num(l.factor) << " slower"
       << (l.from_step > 0 ? " from step " + std::to_string(l.from_step) : std::string());
  if (clock == ClockKind::Virtual)
    os << "; virtual clock (each rank's CPU time plus the emulated waits"
       << (cores > 0 ? ", " + std::to_string(cores) + " computing at once" : std::string()) << ")";
  if (clock == ClockKind::Model)
    os << "; model clock (each rank's matmul FLOPs at " << num(model_flops / 1e9)
       << " GFLOP/s plus the emulated waits)";
  os << " (docs/emulation.md)";
  return os.str();
}

std::string Emulation::cell(int world_rank) const {
  std::string s = "node " + std::to_string(nodes.at(size_t(world_rank)));
  const double f = factors.at(size_t(world_rank));
  if (f != 1) s += ", compute x" + num(f);
  return s;
}

cluster::Cluster load_emulated_cluster(const RunConfig& cfg, int W) {
  const std::string& spec = cfg.emulate.cluster;
  const std::string key = "emulate.cluster=\"" + spec + "\"";
  cluster::Cluster cl;
  try {
    cl = cluster::load_cluster(spec);
  } catch (const std::exception& e) {  // the same file on every rank: the same verdict
    throw CollectiveError(key + ": " + e.what());
  }
  if (cl.world() < W)
    throw CollectiveError(key + ": cluster " + cl.name + " has " + std::to_string(cl.world()) +
                          " devices (" + std::to_string(cl.nodes) + " nodes x " +
                          std::to_string(cl.devices_per_node) + ") but the run has " +
                          std::to_string(W) + " ranks; use a cluster with at least " +
                          std::to_string(W) + " devices (more nodes or devices_per_node)");
  return cl;
}

void check_emulation_inputs(const RunConfig& cfg, int world) {
  if (cfg.emulate.cluster.empty()) return;
  const std::string src = (cfg.source.empty() ? std::string("config") : cfg.source) + ": ";
  try {
    (void)load_emulated_cluster(cfg, world);
  } catch (const std::exception& e) {
    throw ConfigError(src + e.what());
  }
  for (const SlowRank& s : parse_slow_rank_entries(cfg.emulate.slow_ranks))
    if (s.rank >= world)
      throw ConfigError(src + "emulate.slow_ranks: rank " + std::to_string(s.rank) +
                        " is outside the run's " + std::to_string(world) + " ranks (0.." +
                        std::to_string(world - 1) + ")");
  for (const SlowLink& l : parse_slow_links(cfg.emulate.slow_links))
    if (l.a >= world || l.b >= world)
      throw ConfigError(src + "emulate.slow_links: link " + std::to_string(l.a) + "-" +
                        std::to_string(l.b) + " names a rank outside the run's " +
                        std::to_string(world) + " ranks (0.." + std::to_string(world - 1) + ")");
}

std::vector<int> launcher_devices(const cluster::Cluster& cl, int world,
                                  const std::string& rank_order) {
  if (rank_order != "block" && rank_order != "round-robin" && rank_order != "interleave-sites")
    throw std::invalid_argument("emulate.rank_order=\"" + rank_order +
                                "\": unknown order; use block, round-robin or interleave-sites");
  if (world > cl.world())
    throw std::invalid_argument("emulate.rank_order: " + std::to_string(world) +
                                " ranks on the " + std::to_string(cl.world()) +
                                " devices of cluster " + cl.name);
  // interleave-sites: the launcher's nodes, taking one from each site in turn.
  std::vector<int64_t> node_order;
  if (rank_order == "interleave-sites") {
    std::vector<std::vector<int64_t>> by_site(std::max<size_t>(1, cl.sites.size()));
    for (int64_t n = 0; n < cl.nodes; ++n) by_site[size_t(cl.site_of_node(n))].push_back(n);
    for (size_t i = 0; int64_t(node_order.size()) < cl.nodes; ++i)
      for (const auto& s : by_site)
        if (i < s.size()) node_order.push_back(s[i]);
  }
  std::vector<int> dev(static_cast<size_t>(world));
  const int64_t dpn = cl.devices_per_node;
  for (int r = 0; r < world; ++r)
    dev[size_t(r)] = rank_order == "block" ? r
                     : rank_order == "round-robin"
                         ? int((r % cl.nodes) * dpn + r / cl.nodes)
                         : int(node_order[size_t(r / dpn)] * dpn + r % dpn);
  return dev;
}

std::vector<int> launcher_nodes(const cluster::Cluster& cl, int world,
                                const std::string& rank_order) {
  std::vector<int> nodes;
  for (int d : launcher_devices(cl, world, rank_order)) nodes.push_back(int(cl.node_of(d)));
  return nodes;
}

std::vector<int> layout_devices(const RunConfig& cfg, const cluster::Cluster& cl, int world) {
  const std::vector<int> dev = launcher_devices(cl, world, cfg.emulate.rank_order);
  const Placement p = place_ranks(launcher_nodes(cl, world, cfg.emulate.rank_order),
                                  cfg.parallel.placement, int(cfg.parallel.tp),
                                  launcher_sites(cl, world, cfg.emulate.rank_order));
  std::vector<int> out;
  bool identity = true;
  for (int l = 0; l < world; ++l) {
    out.push_back(dev.at(size_t(p.launcher_rank(l))));
    identity = identity && out.back() == l;
  }
  return identity ? std::vector<int>{} : out;
}

std::vector<int> launcher_sites(const cluster::Cluster& cl, int world,
                                const std::string& rank_order) {
  if (cl.sites.size() <= 1) return {};
  std::vector<int> sites;
  for (int n : launcher_nodes(cl, world, rank_order)) sites.push_back(int(cl.site_of_node(n)));
  return sites;
}

// A virtual clock's ranks poll their transports this rarely while they wait
// (MpiComm; 50 us otherwise): waiting costs no virtual time.
constexpr int kVirtualPollUs = 200;

namespace {

// The host's cores as tokens (clock.hpp) for a virtual clock: rank 0 makes
// the semaphore, the others open it, and its name goes once all have it open.
void share_core_tokens(Emulation& emu, Comm& world) {
  cpu_set_t set;
  CPU_ZERO(&set);
  emu.cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                            : int(std::thread::hardware_concurrency());
  if (const char* v = std::getenv("ADGT_EMULATE_CORES"); v && *v) emu.cores = std::max(1, std::atoi(v));
  static int serial = 0;
  double id[2] = {double(getpid()), double(++serial)};
  world.broadcast(Tensor(id, DType::F64, {2}), 0);
  const std::string name = "/adgt-emu-" + std::to_string(int64_t(id[0])) + "-" +
                           std::to_string(int64_t(id[1]));
  std::shared_ptr<CoreTokens> tokens;
  std::string err;
  if (emu.world_rank == 0) {
    try {
      tokens = std::make_shared<CoreTokens>(name, emu.cores, true);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = agree_error(world, err);
  if (err.empty() && emu.world_rank != 0) {
    try {
      tokens = std::make_shared<CoreTokens>(name, emu.cores, false);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = agree_error(world, err);
  if (tokens && emu.world_rank == 0) tokens->unlink();
  if (!err.empty()) throw CollectiveError(err);
  emu.state->clock.set_tokens(std::move(tokens));
}

}  // namespace

std::unique_ptr<Emulation> setup_emulation(const RunConfig& cfg, Comm* world, int world_rank,
                                           const Placement* placement) {
  const std::string& spec = cfg.emulate.cluster;
  if (spec.empty()) return nullptr;
  const int W = world ? world->size() : 1;
  const std::string key = "emulate.cluster=\"" + spec + "\"";
  const cluster::Cluster cl = load_emulated_cluster(cfg, W);
  // Which launcher rank each world (layout) rank is, and so its device.
  std::vector<int> launcher_of(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) launcher_of[size_t(r)] = r;
  if (placement && !placement->launcher_of.empty()) {
    if (int(placement->launcher_of.size()) != W)
      throw CollectiveError(key + ": the rank placement covers " +
                            std::to_string(placement->launcher_of.size()) +
                            " ranks but the run has " + std::to_string(W));
    launcher_of = placement->launcher_of;
  }
  std::vector<int> by_launcher;
  try {
    by_launcher = launcher_devices(cl, W, cfg.emulate.rank_order);
  } catch (const std::exception& e) {
    throw CollectiveError(e.what());
  }
  auto emu = std::make_unique<Emulation>();
  emu->spec = spec;
  emu->cluster = cl;
  emu->rank_order = cfg.emulate.rank_order;
  emu->world = W;
  emu->launcher_of = launcher_of;
  for (int r = 0; r < W; ++r) {
    emu->devices.push_back(by_launcher.at(size_t(launcher_of[size_t(r)])));
    emu->nodes.push_back(int(cl.node_of(emu->devices.back())));
  }
  for (int r = 0; r < W; ++r) {
    const int64_t n = emu->nodes[size_t(r)];
    if (cl.speed_of_node(n) > 1)
      throw CollectiveError(key + ": node_speed[" + std::to_string(n) + "]=" +
                            num(cl.speed_of_node(n)) + " > 1 (node of rank " + std::to_string(r) +
                            "); the emulation can only slow a rank down: scale node_speed so "
                            "the fastest node is 1");
  }
  if (world && W > 1) {
    const double h = host_hash();
    double b[2] = {h, -h};
    world->all_reduce(Tensor(b, DType::F64, {2}), ReduceOp::Max);
    if (b[0] != -b[1])
      throw CollectiveError(key + ": the emulation needs every rank on one host (its delays are "
                                  "times of CLOCK_MONOTONIC, which only the processes of one host "
                                  "share), but the ranks of this run are on several hosts");
  }
  std::vector<int> layout_of(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) layout_of[size_t(launcher_of[size_t(r)])] = r;
  emu->factors.assign(size_t(W), 1.0);
  for (int r = 0; r < W; ++r)
    emu->factors[size_t(r)] = 1.0 / cl.speed_of_node(emu->nodes[size_t(r)]);
  // emulate.slow_ranks names launcher (MPI) ranks: the process it slows is the
  // same whatever the placement.
  emu->onset_factor.assign(size_t(W), 1.0);
  emu->onset_step.assign(size_t(W), 0);
  for (const SlowRank& s : parse_slow_rank_entries(cfg.emulate.slow_ranks)) {
    ADGT_CHECK(s.rank < W, "emulate.slow_ranks: rank " << s.rank << " is outside the run's " << W
                                                       << " ranks");
    const size_t l = size_t(layout_of[size_t(s.rank)]);
    if (s.from_step > 0) {
      emu->onset_factor[l] = s.factor;
      emu->onset_step[l] = s.from_step;
    } else {
      emu->factors[l] *= s.factor;
    }
  }
  emu->link_schedule = parse_link_bandwidth(cfg.emulate.link_bandwidth);
  for (const SlowLink& l : parse_slow_links(cfg.emulate.slow_links)) {
    ADGT_CHECK(l.a < W && l.b < W, "emulate.slow_links: link " << l.a << "-" << l.b
                                       << " names a rank outside the run's " << W << " ranks");
    emu->slow_links.push_back({layout_of[size_t(l.a)], layout_of[size_t(l.b)], l.factor, l.from_step});
  }
  emu->base = cl;
  emu->world_rank = world_rank;
  emu->clock = cfg.emulate.clock == "virtual" ? ClockKind::Virtual
               : cfg.emulate.clock == "model"   ? ClockKind::Model
                                                : ClockKind::Wall;
  emu->model_flops = cfg.emulate.model_flops;
  emu->state = std::make_shared<EmulatedRank>(cl, world_rank, emu->devices, emu->clock, emu->model_flops);
  if (emu->clock != ClockKind::Wall && world && W > 1) {
    if (const char* v = std::getenv("ADGT_EMULATE_POLL_US"); v && *v)
      set_mpi_poll_interval_us(std::atoi(v));
    else
      set_mpi_poll_interval_us(kVirtualPollUs);
    // The model clock counts FLOPs, not CPU time: who computes when does not
    // change its readings, so it needs no core tokens.
    if (emu->clock == ClockKind::Virtual) share_core_tokens(*emu, *world);
  }
  if (const char* dir = std::getenv("ADGT_EMULATE_TRACE"); dir && *dir) {
    std::filesystem::create_directories(dir);
    const std::string path =
        std::string(dir) + "/emulate_rank_" + std::to_string(world_rank) + ".jsonl";
    emu->state->trace = std::fopen(path.c_str(), "a");
    ADGT_CHECK(emu->state->trace, "ADGT_EMULATE_TRACE: cannot append to " << path);
  }
  emu->slowdown = ComputeSlowdown(emu->factors.at(size_t(world_rank)), emu->state);
  return emu;
}

void Emulation::set_power_factor(double f) {
  power_factor = f;
  const size_t me = size_t(world_rank);
  const double onset = onset_on && me < onset_factor.size() ? onset_factor[me] : 1.0;
  slowdown.set_factor((me < factors.size() ? factors[me] : 1.0) * onset * f);
}

void Emulation::at_step(int64_t step) {
  if (state && state->trace)
    std::fprintf(state->trace, "{\"op\": \"step\", \"step\": %ld, \"now\": %.9f}\n",
                 long(step + 1), state->clock.now());
  const size_t me = size_t(world_rank);
  if (me < onset_factor.size() && onset_factor[me] != 1 && step >= onset_step[me] && !onset_on) {
    onset_on = true;
    slowdown.set_factor(factors[me] * onset_factor[me] * power_factor);
  }
  if (state)
    for (const SlowLinkW& l : slow_links) {
      if (l.a != world_rank && l.b != world_rank) continue;
      const int peer = l.a == world_rank ? l.b : l.a;
      if (step >= l.from_step)
        state->link_slowdown[peer] = l.factor;
      else
        state->link_slowdown.erase(peer);
    }
  double f = 1;
  for (const auto& [from, factor] : link_schedule)
    if (step >= from) f = factor;
  if (f != link_factor && state) {
    link_factor = f;
    state->cluster = scale_link_bandwidth(base, f);
  }
}

std::map<int, EmulatedRank::LinkTime> Emulation::link_totals(const std::string& group) const {
  std::map<int, EmulatedRank::LinkTime> out;
  if (!state) return out;
  for (const auto& [key, lt] : state->link_in)
    if (key.first == group) out[key.second] = lt;
  return out;
}

std::map<int, EmulatedRank::LinkTime> Emulation::take_link_times(const std::string& group) {
  std::map<int, EmulatedRank::LinkTime> out;
  for (const auto& [peer, lt] : link_totals(group)) {
    EmulatedRank::LinkTime& was = taken[{group, peer}];
    if (lt.messages > was.messages)
      out[peer] = {lt.seconds - was.seconds, lt.messages - was.messages, lt.bytes - was.bytes};
    was = lt;
  }
  return out;
}

cluster::Cluster scale_link_bandwidth(const cluster::Cluster& c, double f) {
  cluster::Cluster s = c;
  s.intra.bandwidth *= f;
  s.inter.bandwidth *= f;
  s.wan.bandwidth *= f;
  for (cluster::LinkOverride& o : s.link_overrides) o.link.bandwidth *= f;
  return s;
}

}  // namespace adgt::emulate
