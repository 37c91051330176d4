// The power controller's telemetry signal and its decisions (docs/power.md,
// "The controller"): a rank's throttling read from a window of telemetry
// (a scripted source's readings through the sampler, times given by the
// test), and decide() on the inputs the observations make, against the
// simulator's predictions recomputed here under the same cap.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/control/power_controller.hpp"
#include "parallel/metrics/power_signal.hpp"
#include "parallel/metrics/telemetry.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/step_sim.hpp"

using namespace adgt;

namespace {

const std::string kSrc = ADGT_SOURCE_DIR;

// Readings given by the test, one per read(); nothing read after them (the
// sampler's last reading when it stops).
class ScriptedSource final : public TelemetrySource {
 public:
  explicit ScriptedSource(std::vector<TelemetryReading> r) : r_(std::move(r)) {}
  std::string describe() const override { return "scripted"; }
  TelemetryReading read() override { return k_ < r_.size() ? r_[k_++] : TelemetryReading{}; }

 private:
  std::vector<TelemetryReading> r_;
  size_t k_ = 0;
};

TelemetryReading reading(double sm_mhz, uint32_t reasons, double power_w, double limit_w) {
  TelemetryReading r;
  r.gauge[kSmClockMhz] = sm_mhz;
  r.gauge[kSmClockMaxMhz] = 1980;
  r.gauge[kPowerW] = power_w;
  r.gauge[kPowerLimitW] = limit_w;
  r.throttle = reasons;
  return r;
}

// The signal of the window of `rs`, read one second apart (the first opens it).
PowerSignal signal_of(std::vector<TelemetryReading> rs) {
  const size_t n = rs.size();
  std::vector<std::unique_ptr<TelemetrySource>> v;
  v.push_back(std::make_unique<ScriptedSource>(std::move(rs)));
  TelemetrySampler s(std::move(v), 1.0);
  for (size_t k = 0; k < n; ++k) s.sample_at(double(k));
  return power_signal(s.take(kControlReader));
}

}  // namespace

TEST_CASE("power controller: a rank's throttling from its telemetry window", "[power]") {
  // Power-capped for the periods closed by readings 1 and 2 (of 3): the
  // clock's slowdown is the maximum over the mean of every reading.
  {
    const PowerSignal s = signal_of({reading(1980, 0, 300, 700), reading(1100, kThrottlePowerCap, 690, 700),
                                     reading(1200, kThrottlePowerCap, 700, 650), reading(1980, 0, 400, 700)});
    CHECK(s.read);
    CHECK(s.throttled_share == Approx(2.0 / 3.0).epsilon(1e-15));
    CHECK_FALSE(s.thermal_only);
    CHECK(s.clock_slowdown == Approx(1980.0 / ((1980 + 1100 + 1200 + 1980) / 4.0)).epsilon(1e-15));
    REQUIRE(s.limit_w);
    CHECK(*s.limit_w == 650.0);
    REQUIRE(s.power_w);
    CHECK(*s.power_w == Approx((300 + 690 + 700 + 400) / 4.0).epsilon(1e-15));
  }
  // A lower clock without a reason (idle, a host gap) is not throttling.
  {
    const PowerSignal s = signal_of({reading(800, 0, 100, 700), reading(900, 0, 100, 700)});
    CHECK(s.read);
    CHECK(s.throttled_share == 0.0);
    CHECK(s.clock_slowdown == 1.0);
  }
  // Thermal reasons only, and a hardware slowdown (counted as power).
  {
    const PowerSignal t = signal_of({reading(1500, kThrottleThermal, 500, 700), reading(1500, kThrottleThermal, 500, 700)});
    CHECK(t.thermal_only);
    CHECK(t.throttled_share == 1.0);
    CHECK(t.clock_slowdown == Approx(1980.0 / 1500.0).epsilon(1e-15));
    const PowerSignal h = signal_of({reading(1500, kThrottleHwSlowdown, 500, 700),
                                     reading(1500, kThrottleHwSlowdown | kThrottleThermal, 500, 700)});
    CHECK_FALSE(h.thermal_only);
    CHECK(h.throttled_share == 1.0);
  }
  // No throttle reasons read (an old driver): nothing to go on.
  {
    TelemetryReading r = reading(1100, 0, 500, 700);
    r.throttle.reset();
    const PowerSignal s = signal_of({r, r});
    CHECK_FALSE(s.read);
    CHECK(s.clock_slowdown == 1.0);
    CHECK(s.throttled_share == 0.0);
  }
  // No maximum clock read: throttled, but the slowdown unknown (1).
  {
    TelemetryReading r = reading(1100, kThrottlePowerCap, 500, 700);
    r.gauge[kSmClockMaxMhz].reset();
    const PowerSignal s = signal_of({r, r});
    CHECK(s.throttled_share == 1.0);
    CHECK(s.clock_slowdown == 1.0);
  }
}

TEST_CASE("power controller: decisions under a cap read from telemetry", "[power]") {
  // The acceptance's run (tests/power/check_power.py): the layout model, dp2,
  // f64, on the limiter's made-up device.
  const RunConfig cfg = load_config(kSrc + "/tests/layouts/model.yaml",
                                    {"parallel.dp=2", "train.dtype=f64", "train.micro_batch=8"});
  PowerInputs pin;
  pin.cluster = cluster::load_cluster(kSrc + "/tests/power/capped-spiky.yaml");
  auto c = make_power_controller(cfg, pin);
  const nlohmann::json base = {{"source", "telemetry"}, {"step_s", 0.1}, {"throttled_ranks", 2},
                               {"micro_batch", 8}, {"telemetry_ranks", 2}};
  // Below parallel.adapt_threshold: quiet (nothing logged).
  nlohmann::json in = base;
  in["clock_slowdown"] = 1.0 + 0.5 * cfg.parallel.adapt_threshold;
  in["power_cap_w"] = 86.0;
  CHECK(c->decide(in).value("quiet", false));
  // Throttled, but no limit or power read: nothing to plan under.
  in = base;
  in["clock_slowdown"] = 1.8;
  nlohmann::json d = c->decide(in);
  CHECK(d.at("action") == "none");
  CHECK(d.at("why").get<std::string>().find("nothing to plan under") != std::string::npos);
  // Under 86 W: the fastest micro-batch as the simulator predicts it with
  // every device capped at 86 W (recomputed here), asked for as a switch.
  in["power_cap_w"] = 86.0;
  d = c->decide(in);
  cluster::Cluster cl = pin.cluster;
  cl.device.power.cap_w = 86;
  int64_t best = -1;
  double best_s = 1e300, now_s = 0;
  for (int64_t m : {1, 2, 4, 8}) {
    RunConfig x = cfg;
    x.train.micro_batch = m;
    sim::DeviceModelCosts costs(cl.device);
    const double t = sim::simulate_step(x, cl, costs).step_time_s;
    if (m == 8) now_s = t;
    if (t < best_s) best_s = t, best = m;
  }
  INFO(d.dump());
  REQUIRE(best != 8);
  CHECK(best_s < 0.95 * now_s);
  CHECK(d.at("action") == "switch");
  CHECK(d.at("micro_batch") == best);
  CHECK(d.at("planned_under_w") == 86.0);
  CHECK(d.at("predicted_step_s").get<double>() == best_s);
  CHECK(d.at("predicted_now_s").get<double>() == now_s);
  CHECK(d.at("layout_request") == nlohmann::json::array({"train.micro_batch=" + std::to_string(best)}));
  // Under the device's own 200 W limit nothing brakes: every micro-batch is
  // predicted alike, no switch.
  in["power_cap_w"] = 200.0;
  d = c->decide(in);
  CHECK(d.at("action") == "none");
  // The emulation's signal decides by the same rule, and logs a calm window.
  nlohmann::json em = base;
  em["source"] = "emulation";
  em["clock_slowdown"] = 1.0;
  em["power_cap_w"] = 86.0;
  d = c->decide(em);
  CHECK(d.at("action") == "none");
  CHECK_FALSE(d.value("quiet", false));
}
