// The power model (parallel/cluster/power.hpp) and what the simulator makes
// of it: the capped clock and the dynamic energy against their formulas
// evaluated here, an op's capped time against its roofline recomputed by
// hand, the step's energy against the per-op energies summed over the rank's
// work (parallel/sim/work.hpp), the unsimulated replicas counted, and the
// cluster file's errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/power.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/power_slowdown.hpp"
#include "parallel/sim/step_sim.hpp"
#include "parallel/sim/sweep.hpp"
#include "parallel/sim/work.hpp"

using namespace adgt;
using namespace adgt::sim;
using Catch::Matchers::Contains;

namespace {

RunConfig run(const std::vector<std::string>& sets) {
  return load_config_text(R"(model: {vocab_size: 256, d_model: 256, n_layers: 4, n_heads: 8,
         n_kv_heads: 4, ffn_hidden: 512, seq_len: 256}
train: {micro_batch: 2, global_batch: 8, dtype: bf16}
)",
                          "power.yaml", sets);
}

// The dgx-h100 preset with its power model, `gpus` devices.
cluster::Cluster h100(int64_t gpus, double cap = 0) {
  cluster::Cluster c = cluster::with_gpus(cluster::load_cluster("dgx-h100"), gpus);
  c.device.power.cap_w = cap;
  return c;
}

}  // namespace

TEST_CASE("power: the capped clock and the dynamic energy are the model's formulas", "[sim][power]") {
  cluster::PowerModel p;
  p.idle_w = 75, p.limit_w = 700, p.pj_per_flop_bf16 = 0.75, p.pj_per_flop_fp8 = 0.4,
  p.pj_per_flop_fp32 = 9, p.pj_per_byte = 60, p.clock_exponent = 3;
  CHECK(cluster::capped_clock(p, 600) == 1.0);  // 75 + 600 fits 700
  p.cap_w = 500;
  CHECK(cluster::capped_clock(p, 400) == 1.0);
  CHECK(cluster::capped_clock(p, 610) == Approx(std::cbrt(425.0 / 610.0)).epsilon(1e-14));
  p.cap_w = 50;  // below idle: the slowest the model goes
  CHECK(cluster::capped_clock(p, 610) == 1e-3);
  cluster::PowerModel none;
  CHECK(cluster::capped_clock(none, 1e9) == 1.0);
  // 1 TFLOP of bf16 and 1 GB at clock 0.9: the FLOPs' energy x 0.9^2, HBM's unchanged.
  CHECK(cluster::dynamic_joules(p, 1e12, 2, 1e9, 0.9) == Approx(0.75 * 0.81 + 0.06).epsilon(1e-14));
  CHECK(cluster::dynamic_joules(p, 1e12, 1, 0, 1) == Approx(0.4).epsilon(1e-14));
  CHECK(cluster::dynamic_joules(p, 1e12, 4, 0, 1) == Approx(9.0).epsilon(1e-14));
}

TEST_CASE("power: an op under a cap runs its compute side at the capped clock", "[sim][power]") {
  const cluster::Device d = cluster::load_cluster("dgx-h100").device;
  REQUIRE(d.power.on());
  cluster::Device nopower = d;
  nopower.power = {};
  const Op gemm{OpKind::GemmForward, 8192, 8192, 8192};
  const Op norm{OpKind::RmsNormForward, 16384, 8192};
  DeviceModelCosts base(nopower), uncapped(d);
  // No cap given: the preset's limit is what its sustained clock already
  // holds (the big GEMM's draw fits 700 W), so times are the plain roofline's.
  CHECK(uncapped.seconds(gemm, 2) == base.seconds(gemm, 2));
  CHECK(uncapped.seconds(norm, 2) == base.seconds(norm, 2));
  CHECK(base.joules(gemm, 2) < 0);  // no model: not priced
  // At 400 W: the roofline recomputed here, the compute side / c.
  cluster::Device capped_d = d;
  capped_d.power.cap_w = 400;
  DeviceModelCosts capped(capped_d);
  const double f = gemm.flops(), bytes = DeviceModelCosts::bytes_moved(gemm, 2);
  const double peak = d.peak_bf16_flops * d.sustained_clock;
  const double compute = f / (peak * d.gemm_efficiency * f / (f + d.gemm_half_flops));
  const double memory = bytes / (d.hbm_bandwidth * d.memory_efficiency);
  const double t = std::max(compute, memory) + d.kernel_overhead;
  const double dyn_w = (0.75e-12 * f + 60e-12 * bytes) / t;
  const double c = std::cbrt((400.0 - 75.0) / dyn_w);
  REQUIRE(c < 0.9);  // the cap binds
  CHECK(capped.clock(gemm, 2) == Approx(c).epsilon(1e-12));
  CHECK(capped.seconds(gemm, 2) ==
        Approx(std::max(compute / c, memory) + d.kernel_overhead).epsilon(1e-12));
  CHECK(capped.joules(gemm, 2) == Approx(0.75e-12 * f * c * c + 60e-12 * bytes).epsilon(1e-12));
  // A memory-bound op draws little: its clock stays, its time too.
  CHECK(capped.clock(norm, 2) == 1.0);
  CHECK(capped.seconds(norm, 2) == base.seconds(norm, 2));
}

TEST_CASE("power: a step's energy is idle power over the step plus its ops' dynamic energy",
          "[sim][power]") {
  const RunConfig cfg = run({});
  const cluster::Cluster cl = h100(1);
  DeviceModelCosts costs(cl.device);
  const SimResult r = simulate_step(cfg, cl, costs);
  REQUIRE(r.energy_j > 0);
  // By hand: the rank's forward and backward per micro-batch, and the update.
  const RankWork w = rank_work(cfg, 0);
  double dyn = 0;
  auto add = [&](const std::vector<Op>& ops) {
    for (const Op& op : ops) dyn += costs.joules(op, 2);
  };
  for (int64_t mb = 0; mb < cfg.accum_steps(); ++mb) {
    for (const Piece& p : w.chunks[0].forward.pieces) add(p.ops);
    for (const Piece& p : w.chunks[0].backward.pieces) add(p.ops);
  }
  add(w.optimizer);
  CHECK(r.energy_j == Approx(dyn + 75.0 * r.step_time_s).epsilon(1e-9));
  const double tokens = double(cfg.train.global_batch * cfg.model.seq_len);
  CHECK(r.energy_per_token_j == Approx(r.energy_j / tokens).epsilon(1e-12));
  CHECK(r.mean_power_w == Approx(r.energy_j / r.step_time_s).epsilon(1e-12));

  // dp 4 with 4x the batch: the simulator runs one replica (all alike) and
  // counts the other three; each device's compute energy is the single one's.
  const RunConfig cfg4 = run({"parallel.dp=4", "train.global_batch=32"});
  const cluster::Cluster cl4 = h100(4);
  DeviceModelCosts costs4(cl4.device);
  const SimResult r4 = simulate_step(cfg4, cl4, costs4);
  REQUIRE(r4.units_simulated == 1);
  CHECK(r4.energy_j - 4 * 75.0 * r4.step_time_s == Approx(4 * dyn).epsilon(1e-9));
  // Simulating every replica gives the same energy.
  SimOptions all;
  all.all_replicas = true;
  const SimResult r4all = simulate_step(cfg4, cl4, costs4, all);
  CHECK(r4all.units_simulated == 4);
  CHECK(r4all.energy_j == Approx(r4.energy_j).epsilon(1e-12));

  // A cap below what this small model's GEMMs draw (the step averages ~97 W):
  // a longer step at a lower mean power.
  const cluster::Cluster capped = h100(1, 85);
  DeviceModelCosts ccosts(capped.device);
  const SimResult rc = simulate_step(cfg, capped, ccosts);
  CHECK(rc.step_time_s > r.step_time_s);
  CHECK(rc.mean_power_w < r.mean_power_w);
}

TEST_CASE("power: the cluster file's power block and its errors", "[sim][power]") {
  const std::string base =
      "nodes: 1\ndevices_per_node: 2\ndevice: {peak_bf16_tflops: 100, peak_fp32_tflops: 10, "
      "memory_gib: 16, hbm_GBps: 1000";
  const cluster::Cluster c = cluster::parse_cluster(
      base + ", power: {idle_w: 50, limit_w: 300, pj_per_flop_bf16: 1.5, pj_per_byte: 40, "
             "source: \"measured\"}}\nintra: {bandwidth_GBps: 100, latency_us: 1}\n",
      "p.yaml");
  CHECK(c.device.power.idle_w == 50);
  CHECK(c.device.power.limit_w == 300);
  CHECK(c.device.power.pj_per_flop_bf16 == 1.5);
  CHECK(c.device.power.clock_exponent == 3);
  CHECK(c.device.power.source == "measured");
  // The YAML writer and the parser agree.
  CHECK(cluster::parse_cluster(cluster::to_yaml(c), "round.yaml").device.power == c.device.power);
  CHECK_THROWS_WITH(cluster::parse_cluster(base + ", power: {idle_w: 50}}\nintra: {bandwidth_GBps: 100, "
                                                  "latency_us: 1}\n",
                                           "p.yaml"),
                    Contains("device.power: idle_w and limit_w are required"));
  CHECK_THROWS_WITH(cluster::parse_cluster(base + ", power: {idle_w: 400, limit_w: 300}}\nintra: "
                                                  "{bandwidth_GBps: 100, latency_us: 1}\n",
                                           "p.yaml"),
                    Contains("must be below limit_w"));
  CHECK_THROWS_WITH(cluster::parse_cluster(base + ", power: {idle_w: 40, limit_w: 300, watts: 3}}\n"
                                                  "intra: {bandwidth_GBps: 100, latency_us: 1}\n",
                                           "p.yaml"),
                    Contains("device.power.watts: unknown key"));
  // The limiter's keys, written back and read again.
  const cluster::Cluster l = cluster::parse_cluster(
      base + ", power: {idle_w: 50, limit_w: 300, limiter_window_s: 0.002, limiter_brake_clock: 0.4, "
             "limiter_hold_s: 0.01}}\nintra: {bandwidth_GBps: 100, latency_us: 1}\n",
      "p.yaml");
  CHECK(l.device.power.limiter());
  CHECK(l.device.power.limiter_window_s == 0.002);
  CHECK(l.device.power.limiter_brake_clock == 0.4);
  CHECK(l.device.power.limiter_hold_s == 0.01);
  CHECK(cluster::parse_cluster(cluster::to_yaml(l), "round.yaml").device.power == l.device.power);
  CHECK_FALSE(c.device.power.limiter());
  CHECK_THROWS_WITH(cluster::parse_cluster(base + ", power: {idle_w: 40, limit_w: 300, limiter_window_s: 1, "
                                                  "limiter_brake_clock: 1.5}}\nintra: {bandwidth_GBps: 100, "
                                                  "latency_us: 1}\n",
                                           "p.yaml"),
                    Contains("device.power.limiter_brake_clock: a fraction of the sustained clock"));
}

TEST_CASE("power: the sweep's energy objective ranks by energy per token", "[sim][power]") {
  const RunConfig cfg = run({"model.n_layers=8"});
  const cluster::Cluster cl = h100(8, 400);
  DeviceModelCosts costs(cl.device);
  SweepOptions all;  // every layout, ranked by time
  const SweepResult by_time = sweep_layouts(cfg, 8, cl, costs, all);
  REQUIRE(by_time.rows.size() > 3);
  SweepOptions e;
  e.energy = true;
  e.keep = 3;
  const SweepResult by_energy = sweep_layouts(cfg, 8, cl, costs, e);
  REQUIRE(by_energy.rows.size() == 3);
  CHECK(by_energy.bounded == 0);  // no time bound prunes an energy ranking
  double least = 1e300;
  for (const SweepRow& r : by_time.rows) least = std::min(least, r.result.energy_per_token_j);
  CHECK(by_energy.rows[0].result.energy_per_token_j == least);
  CHECK(by_energy.rows[0].result.energy_per_token_j <= by_energy.rows[1].result.energy_per_token_j);
  CHECK(by_energy.rows[1].result.energy_per_token_j <= by_energy.rows[2].result.energy_per_token_j);
  // A device without a power model: refused by name.
  cluster::Cluster nopower = cl;
  nopower.device.power = {};
  DeviceModelCosts c2(nopower.device);
  CHECK_THROWS_WITH(sweep_layouts(cfg, 8, nopower, c2, e), Contains("has no device.power"));
}

// The limiter (power.hpp): a long kernel drawing more than the cap cycles
// between full clock, until the average reaches the cap, and the brake's
// clock for the hold; the cycle's times follow from the exponential average
// by hand: at the brake the average falls from the cap toward w_b over the
// hold to a = w_b + (cap - w_b) e^(-h/tau), then rises at full clock toward
// w_1 back to the cap in t_1 = tau ln((w_1 - a) / (w_1 - cap)).
TEST_CASE("power: the limiter's walk is its cycle computed by hand", "[sim][power]") {
  cluster::PowerModel p;
  p.idle_w = 10, p.limit_w = 100, p.clock_exponent = 3;
  p.limiter_window_s = 1e-3, p.limiter_brake_clock = 0.5, p.limiter_hold_s = 2e-3;
  cluster::PowerSegment s;
  s.compute_s = 1.0, s.flop_j = 140;  // 150 W at full clock
  const double tau = 1e-3, h = 2e-3, cap = 100, w1 = 150;
  const double wb = 10 + 140 * 0.25 / 2.0;  // 27.5 W: a quarter the energy over twice the time
  const double a = wb + (cap - wb) * std::exp(-h / tau);
  const double t1 = tau * std::log((w1 - a) / (w1 - cap));
  const cluster::LimiterStep r = cluster::limiter_walk(p, {s});
  CHECK(r.free_s == 1.0);
  CHECK(r.capped_s / r.free_s == Approx((t1 + h) / (t1 + 0.5 * h)).epsilon(2e-3));
  CHECK(r.braked_share == Approx(h / (t1 + h)).epsilon(2e-3));
  CHECK(r.capped_dyn_j / r.free_dyn_j == Approx((140 * t1 + (wb - 10) * h) / (t1 + 0.5 * h) / 140).epsilon(2e-3));
  // No limiter, or a cap above the kernel's draw: the free step.
  cluster::PowerModel q = p;
  q.limiter_window_s = 0;
  CHECK(cluster::limiter_walk(q, {s}).capped_s == 1.0);
  q = p;
  q.cap_w = 0, q.limit_w = 200;
  CHECK(cluster::limiter_walk(q, {s}).capped_s == 1.0);
  CHECK(cluster::limiter_walk(q, {s}).braked_share == 0);
}

TEST_CASE("power: a burst shorter than the limiter's window rides under the cap, a longer one trips it",
          "[sim][power]") {
  cluster::PowerModel p;
  p.idle_w = 10, p.limit_w = 100, p.clock_exponent = 3;
  p.limiter_window_s = 1e-3, p.limiter_brake_clock = 0.5, p.limiter_hold_s = 1e-3;
  // 150 W of FLOPs and 30 W of memory traffic in turn: 90 W on average.
  auto steps = [](double d) {
    cluster::PowerSegment hi, lo;
    hi.compute_s = d, hi.flop_j = 140 * d;
    lo.memory_s = d, lo.byte_j = 20 * d;
    return std::vector<cluster::PowerSegment>{hi, lo, hi, lo};
  };
  const cluster::LimiterStep quick = cluster::limiter_walk(p, steps(2e-5));
  CHECK(quick.capped_s == quick.free_s);
  CHECK(quick.braked_share == 0);
  const cluster::LimiterStep slow = cluster::limiter_walk(p, steps(1e-2));
  CHECK(slow.capped_s > 1.1 * slow.free_s);
  CHECK(slow.braked_share > 0.05);
  // The kernel-by-kernel model throttles both alike (150 W > 100 W).
  CHECK(cluster::capped_clock(p, 140) < 0.9);
}

TEST_CASE("power: the simulator and the emulation take the limiter's factor from one walk", "[sim][power]") {
  cluster::Cluster c = h100(8, 85);  // the small model's step averages 88 W uncapped
  c.device.power.limiter_window_s = 2e-3, c.device.power.limiter_hold_s = 5e-3,
  c.device.power.limiter_brake_clock = 0.6;
  for (const std::string pp : {"1", "2"}) {
    const RunConfig cfg = run({"parallel.pp=" + pp, "parallel.dp=2", "train.micro_batch=1"});
    const double f0 = power_cap_slowdown(cfg, c.device, 85, 0);
    CHECK(f0 == limiter_step(cfg, c.device, 0).slowdown());
    REQUIRE(f0 > 1.05);
    // The simulator under the cap = the free simulation with every rank
    // slowed by its pipeline rank's factor.
    cluster::Cluster free = c;
    free.device.power.cap_w = 0;
    DeviceModelCosts capped_costs(c.device), free_costs(free.device);
    SimOptions slowed;
    const Layout lay = layout_of(cfg);
    for (int r = 0; r < int(lay.world()); ++r)
      slowed.slow_ranks[r] = power_cap_slowdown(cfg, c.device, 85, int(coords_of(lay, r).pp));
    const double capped = simulate_step(cfg, c, capped_costs).step_time_s;
    CHECK(capped == Approx(simulate_step(cfg, free, free_costs, slowed).step_time_s).epsilon(1e-12));
    CHECK(capped > simulate_step(cfg, free, free_costs).step_time_s * 1.05);
  }
}

TEST_CASE("power: ranks costed apart from the device slow down by the emulation's factor", "[sim][power]") {
  // SimOptions::emulated_power_device (the planner on CPU ranks emulating a
  // capped device): each rank's compute slowed by power_cap_slowdown on that
  // device, whatever the costs, the cluster's own device left uncapped; = the
  // free simulation with every rank slowed by the same factors. Both the
  // kernel-by-kernel model and a limiter.
  for (const bool limiter : {false, true}) {
    cluster::Cluster dev = h100(8, limiter ? 85 : 80);
    if (limiter)
      dev.device.power.limiter_window_s = 2e-3, dev.device.power.limiter_hold_s = 5e-3,
      dev.device.power.limiter_brake_clock = 0.6;
    cluster::Cluster other = h100(8);  // the costs' device (a profile's stand-in): no cap
    other.device.peak_bf16_flops *= 0.5;
    for (const std::string pp : {"1", "2"}) {
      const RunConfig cfg = run({"parallel.pp=" + pp, "parallel.dp=2", "train.micro_batch=2"});
      DeviceModelCosts costs(other.device);
      SimOptions em, slowed;
      em.emulated_power_device = dev.device;
      const Layout lay = layout_of(cfg);
      for (int r = 0; r < int(lay.world()); ++r)
        slowed.slow_ranks[r] = power_cap_slowdown(cfg, dev.device, dev.device.power.cap_w,
                                                  int(coords_of(lay, r).pp));
      INFO("limiter " << limiter << " pp " << pp);
      REQUIRE(slowed.slow_ranks[0] > 1.05);
      const double t = simulate_step(cfg, other, costs, em).step_time_s;
      CHECK(t == Approx(simulate_step(cfg, other, costs, slowed).step_time_s).epsilon(1e-12));
      CHECK(t > 1.05 * simulate_step(cfg, other, costs).step_time_s);
    }
  }
}
