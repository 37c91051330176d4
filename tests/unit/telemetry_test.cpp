// Hardware telemetry (docs/telemetry.md): the sampler's aggregate from a fake
// NVML (tests/telemetry/fake_nvml.c: readings that are functions of the call
// count) and from fake powercap trees, with sample times given by the test
// (sample_at), never the clock; absent sources give absent fields; the
// reduction and the step line.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/comm.hpp"
#include "core/metrics.hpp"
#include "parallel/metrics/telemetry.hpp"
#include "parallel/metrics/telemetry_reduce.hpp"
#include "parallel/metrics/telemetry_sources.hpp"

using namespace adgt;
namespace fs = std::filesystem;

namespace {

// The fake's call counters back to 0 (it stays loaded between test cases).
void reset_fake(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib);
  auto reset = reinterpret_cast<void (*)()>(dlsym(lib, "fake_nvml_reset"));
  REQUIRE(reset);
  reset();
  dlclose(lib);
}

std::unique_ptr<TelemetrySampler> sampler_of(std::unique_ptr<TelemetrySource> s) {
  REQUIRE(s);
  std::vector<std::unique_ptr<TelemetrySource>> v;
  v.push_back(std::move(s));
  return std::make_unique<TelemetrySampler>(std::move(v), 1.0);
}

std::map<std::string, TelemetryStat> by_name(const std::vector<TelemetryStat>& v) {
  std::map<std::string, TelemetryStat> m;
  for (const TelemetryStat& s : v) m[s.name] = s;
  return m;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("adgt_telemetry_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("telemetry: a fake NVML's readings aggregate exactly", "[telemetry]") {
  reset_fake(ADGT_FAKE_NVML);
  std::string why;
  auto sampler = sampler_of(open_nvml_source(ADGT_FAKE_NVML, "GPU-fake-0", -1, &why));
  CHECK(sampler->sources()[0]->describe() == "NVML GPU GPU-fake-0");
  for (int k = 0; k < 5; ++k) sampler->sample_at(10.0 + k);  // call counts k = 0..4, one second apart
  const TelemetryInterval x = sampler->take();
  const TelemetryStatAcc& p = x.gauge[kPowerW];
  CHECK(p.n == 5);
  CHECK(p.min == 100.0);
  CHECK(p.max == 140.0);
  CHECK(p.sum == 600.0);
  CHECK(x.gauge[kGpuTempC].min == 50.0);
  CHECK(x.gauge[kGpuTempC].max == 54.0);
  CHECK(x.gauge[kMemTempC].sum == 60.0 + 61 + 62 + 63 + 64);
  CHECK(x.gauge[kSmClockMhz].max == 1400.0);
  CHECK(x.gauge[kMemClockMhz].min == 2000.0);
  CHECK(x.gauge[kMemClockMhz].max == 2000.0);
  CHECK(x.gauge[kPowerLimitW].n == 5);
  CHECK(x.gauge[kPowerLimitW].min == 700.0);
  CHECK(x.gauge[kPowerLimitW].max == 700.0);
  CHECK(x.gauge[kSmClockMaxMhz].n == 5);
  CHECK(x.gauge[kSmClockMaxMhz].min == 1980.0);
  // Energy 0, 1, 2, 3, 4 J: 4 J over the interval (the first reading is the baseline).
  CHECK(x.has_energy);
  CHECK(x.energy_j == 4.0);
  // Reasons k = 1 (power cap) and k = 3 (power cap + HW thermal) each close a
  // 1 s period; k = 2, 4 are "GPU idle", not a throttle.
  CHECK(x.has_throttle);
  CHECK(x.observed_s == 4.0);
  CHECK(x.throttled_s[kThrottleAny] == 2.0);
  CHECK(x.throttled_s[kThrottlePower] == 2.0);
  CHECK(x.throttled_s[kThrottleTherm] == 1.0);
  CHECK(x.throttled_s[kThrottleHw] == 0.0);

  // Through the reduction (one rank): per-sample and per-rank fields.
  sampler->sample_at(15.0);  // k = 5: 5 J, power cap, 150 W
  SelfComm self;
  const auto m = by_name(reduce_telemetry(sampler->take(), self));
  REQUIRE(m.count("power_w"));
  CHECK(m.at("power_w").count == 1);
  CHECK(m.at("power_w").mean == 150.0);
  CHECK_FALSE(m.at("power_w").per_rank);
  REQUIRE(m.count("energy_j"));
  CHECK(m.at("energy_j").per_rank);
  CHECK(m.at("energy_j").mean == 1.0);
  CHECK(m.at("energy_j").total == 1.0);
  CHECK(m.at("throttled").mean == 1.0);
  CHECK(m.at("throttled_power_cap").mean == 1.0);
  CHECK(m.at("throttled_thermal").mean == 0.0);
  CHECK(m.at("mem_temp_c").mean == 65.0);

  // The run's totals: 5 J, 3 of 5 s throttled.
  const TelemetryTotals t = sampler->totals();
  CHECK(t.energy_j == 5.0);
  CHECK(t.observed_s == 5.0);
  CHECK(t.throttled_s == 3.0);
  const RunEnergy e = reduce_run_energy(t, 1000.0, self);
  CHECK(e.has_energy());
  CHECK(e.j_per_token() == 0.005);
  CHECK(e.throttled_share() == 0.6);
  CHECK(format_run_energy(e).find("0.005 J/token") != std::string::npos);
  CHECK(run_energy_json(e).at("j_per_token").get<double>() == 0.005);
}

TEST_CASE("telemetry: each reader has its own interval of the same readings", "[telemetry]") {
  reset_fake(ADGT_FAKE_NVML);
  std::string why;
  auto sampler = sampler_of(open_nvml_source(ADGT_FAKE_NVML, "GPU-fake-0", -1, &why));
  for (int k = 0; k < 3; ++k) sampler->sample_at(k);  // power 100, 110, 120 W
  const TelemetryInterval log1 = sampler->take(kLogReader);
  sampler->sample_at(3);  // 130 W
  const TelemetryInterval log2 = sampler->take(kLogReader);
  const TelemetryInterval ctl = sampler->take(kControlReader);  // all four readings
  CHECK(log1.gauge[kPowerW].n == 3);
  CHECK(log1.gauge[kPowerW].sum == 330.0);
  CHECK(log2.gauge[kPowerW].n == 1);
  CHECK(log2.gauge[kPowerW].sum == 130.0);
  CHECK(ctl.gauge[kPowerW].n == 4);
  CHECK(ctl.gauge[kPowerW].sum == 460.0);
  CHECK(ctl.observed_s == 3.0);
  CHECK(ctl.throttled_s[kThrottleAny] == log1.throttled_s[kThrottleAny] + log2.throttled_s[kThrottleAny]);
  CHECK(ctl.energy_j == log1.energy_j + log2.energy_j);
  CHECK(sampler->take(kControlReader).gauge[kPowerW].n == 0);  // taken: a fresh one
  sampler->sample_now();  // a reading now (the clock's time: after the test's 3 s)
  CHECK(sampler->take(kControlReader).gauge[kPowerW].n == 1);
  CHECK(sampler->take(kLogReader).gauge[kPowerW].n == 1);
}

TEST_CASE("telemetry: the fake NVML's steady capped state (FAKE_NVML_STATE)", "[telemetry]") {
  reset_fake(ADGT_FAKE_NVML);
  setenv("FAKE_NVML_STATE", "power_w=86,limit_w=90,sm_mhz=1100,reasons=4", 1);
  std::string why;
  auto src = open_nvml_source(ADGT_FAKE_NVML, "", 5, &why);  // any index in this state
  unsetenv("FAKE_NVML_STATE");
  REQUIRE(src);
  auto sampler = sampler_of(std::move(src));
  for (int k = 0; k < 4; ++k) sampler->sample_at(k);
  const TelemetryInterval x = sampler->take();
  CHECK(x.gauge[kPowerW].min == 86.0);
  CHECK(x.gauge[kPowerW].max == 86.0);
  CHECK(x.gauge[kPowerLimitW].max == 90.0);
  CHECK(x.gauge[kSmClockMhz].min == 1100.0);
  CHECK(x.gauge[kSmClockMhz].max == 1100.0);
  CHECK(x.gauge[kSmClockMaxMhz].max == 1980.0);
  CHECK(x.observed_s == 3.0);
  CHECK(x.throttled_s[kThrottlePower] == 3.0);
  CHECK(x.throttled_s[kThrottleTherm] == 0.0);
}

TEST_CASE("telemetry: an old NVML without the energy counter leaves those fields absent", "[telemetry]") {
  reset_fake(ADGT_FAKE_NVML_MINIMAL);
  std::string why;
  auto sampler = sampler_of(open_nvml_source(ADGT_FAKE_NVML_MINIMAL, "", 0, &why));
  const std::string d = sampler->sources()[0]->describe();
  CHECK(d.find("index 0") != std::string::npos);
  CHECK(d.find("nvmlDeviceGetTotalEnergyConsumption") != std::string::npos);
  CHECK(d.find("nvmlDeviceGetCurrentClocksThrottleReasons") != std::string::npos);
  sampler->sample_at(0);
  sampler->sample_at(1);
  SelfComm self;
  const auto m = by_name(reduce_telemetry(sampler->take(), self));
  CHECK(m.count("power_w"));
  CHECK(m.count("sm_clock_mhz"));
  CHECK_FALSE(m.count("energy_j"));
  CHECK_FALSE(m.count("mem_temp_c"));
  CHECK_FALSE(m.count("throttled"));
  CHECK_FALSE(m.count("power_limit_w"));
  CHECK(d.find("nvmlDeviceGetEnforcedPowerLimit") != std::string::npos);
  const RunEnergy e = reduce_run_energy(sampler->totals(), 1000.0, self);
  CHECK_FALSE(e.has_energy());
  CHECK_FALSE(e.has_throttle());
  CHECK(format_run_energy(e).empty());
  CHECK(run_energy_json(e).empty());
}

TEST_CASE("telemetry: NVML missing or without the GPU is no source, with the reason", "[telemetry]") {
  std::string why;
  CHECK_FALSE(open_nvml_source("/nonexistent/libnvidia-ml.so.1", "GPU-fake-0", 0, &why));
  CHECK(why.find("NVML not loaded") != std::string::npos);
  CHECK_FALSE(open_nvml_source(ADGT_FAKE_NVML, "GPU-other", 0, &why));
  CHECK(why == "NVML has no GPU GPU-other (NVML error 6)");
  CHECK_FALSE(open_nvml_source(ADGT_FAKE_NVML, "", 3, &why));
  CHECK(why == "NVML has no GPU index 3 (NVML error 2)");
}

TEST_CASE("telemetry: RAPL packages summed, sub-zones and twins skipped, wraparound undone", "[telemetry]") {
  const fs::path root = temp_dir("rapl");
  write(root / "intel-rapl:0/name", "package-0");
  write(root / "intel-rapl:0/max_energy_range_uj", "1000000");
  write(root / "intel-rapl:0/energy_uj", "900000");
  write(root / "intel-rapl:0/intel-rapl:0:0/name", "core");  // nested, as in sysfs
  write(root / "intel-rapl:0/intel-rapl:0:0/energy_uj", "5");
  write(root / "intel-rapl:0:0/name", "core");  // the flat link sysfs also has
  write(root / "intel-rapl:0:0/energy_uj", "5");
  write(root / "intel-rapl:1/name", "package-1");
  write(root / "intel-rapl:1/max_energy_range_uj", "1000000");
  write(root / "intel-rapl:1/energy_uj", "10");
  write(root / "intel-rapl:2/name", "psys");  // the platform: would count the packages again
  write(root / "intel-rapl:2/energy_uj", "7");
  write(root / "intel-rapl-mmio:0/name", "package-0");  // the MMIO copy of package 0
  write(root / "intel-rapl-mmio:0/energy_uj", "3");
  std::string why;
  auto sampler = sampler_of(open_rapl_source(root.string(), &why));
  CHECK(sampler->sources()[0]->describe() == "RAPL intel-rapl:0 (package-0), intel-rapl:1 (package-1)");
  sampler->sample_at(0);  // baseline
  write(root / "intel-rapl:0/energy_uj", "950000");  // +50000
  write(root / "intel-rapl:1/energy_uj", "20");      // +10
  write(root / "intel-rapl:0:0/energy_uj", "99999");  // never added
  write(root / "intel-rapl:2/energy_uj", "99999");
  sampler->sample_at(1);
  write(root / "intel-rapl:0/energy_uj", "50000");  // wrapped past 1000000: +100000
  write(root / "intel-rapl:1/energy_uj", "30");     // +10
  sampler->sample_at(3);
  const TelemetryInterval x = sampler->take();
  CHECK(x.has_energy);
  CHECK(x.energy_j == Approx(0.15002).epsilon(1e-12));
  // No power gauge: the counter's rate over each period.
  CHECK(x.gauge[kPowerW].n == 2);
  CHECK(x.gauge[kPowerW].max == Approx(0.05001).epsilon(1e-12));
  CHECK(x.gauge[kPowerW].min == Approx(0.100010 / 2).epsilon(1e-12));
  for (int g = kGpuTempC; g < kGauges; ++g) CHECK(x.gauge[g].n == 0);
  CHECK_FALSE(x.has_throttle);
  CHECK(sampler->totals().energy_j == Approx(0.15002).epsilon(1e-12));
  fs::remove_all(root);
}

TEST_CASE("telemetry: no readable powercap is no source, with the reason", "[telemetry]") {
  std::string why;
  CHECK_FALSE(open_rapl_source("/nonexistent/powercap", &why));
  CHECK(why == "no powercap at /nonexistent/powercap");
  const fs::path root = temp_dir("rapl_empty");
  CHECK_FALSE(open_rapl_source(root.string(), &why));
  CHECK(why.find("no RAPL energy counters under") == 0);
  // A counter that cannot be read (here a directory; on a real host a root-only file).
  fs::create_directories(root / "intel-rapl:0/energy_uj");
  write(root / "intel-rapl:0/name", "package-0");
  CHECK_FALSE(open_rapl_source(root.string(), &why));
  CHECK(why.find("RAPL counters not readable") == 0);
  fs::remove_all(root);
}

TEST_CASE("telemetry: nothing measured is absent, not zero", "[telemetry]") {
  TelemetrySampler none({}, 1.0);
  none.start();
  none.sample_at(5);
  SelfComm self;
  CHECK(reduce_telemetry(none.take(), self).empty());
  CHECK(reduce_telemetry(TelemetryInterval{}, self).empty());
  none.stop();
  const RunEnergy e = reduce_run_energy(none.totals(), 1000.0, self);
  CHECK(e.energy_ranks == 0);
  CHECK_FALSE(e.has_energy());
  CHECK(format_run_energy(e).empty());
  // The step line shows power and SM clock only where measured.
  StepMetrics m;
  m.step = 1, m.total_steps = 1;
  CHECK(format_step_line(m).find("power") == std::string::npos);
  m.telemetry.push_back({"power_w", false, 4, 290, 312.4, 330, -1});
  m.telemetry.push_back({"sm_clock_mhz", false, 4, 1900, 1980, 1990, -1});
  CHECK(format_step_line(m).find(" | power 312 W sm 1980 MHz") != std::string::npos);
}

TEST_CASE("telemetry: off, or a CPU rank with nothing readable, makes no sampler", "[telemetry]") {
  DevicePlan cpu;
  CHECK_FALSE(make_telemetry_sampler(0, cpu, false));
  setenv("ADGT_POWERCAP_ROOT", "/nonexistent/powercap", 1);
  CHECK_FALSE(make_telemetry_sampler(1, cpu, false));
  unsetenv("ADGT_POWERCAP_ROOT");
}

TEST_CASE("telemetry: a CUDA rank reads its own GPU through the NVML that ADGT_NVML_LIBRARY names", "[telemetry]") {
  DevicePlan gpu;
  gpu.device = "cuda";
  gpu.cuda_device = 5;  // CUDA's index: not NVML's, so the UUID decides
  gpu.device_id = "GPU-fake-0";
  setenv("ADGT_NVML_LIBRARY", ADGT_FAKE_NVML, 1);
  {
    // A long period: the thread only waits; stop() (the destructor) wakes it.
    std::unique_ptr<TelemetrySampler> s = make_telemetry_sampler(1000, gpu, false);
    REQUIRE(s);
    REQUIRE(s->sources().size() == 1);
    CHECK(s->sources()[0]->describe() == "NVML GPU GPU-fake-0");
    s->stop();
    // The start's baseline reading and the stop's closing one.
    CHECK(s->take().gauge[kPowerW].n == 2);
    CHECK(s->totals().has_energy);
  }
  gpu.device_id = "GPU-elsewhere";
  CHECK_FALSE(make_telemetry_sampler(1000, gpu, false));
  setenv("ADGT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  gpu.device_id = "GPU-fake-0";
  CHECK_FALSE(make_telemetry_sampler(1000, gpu, false));
  unsetenv("ADGT_NVML_LIBRARY");
}
