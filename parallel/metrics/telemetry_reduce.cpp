#include "parallel/metrics/telemetry_reduce.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace adgt {

namespace {
// The reduced fields: the gauges, energy_j, then the throttled shares.
constexpr int kEnergy = kGauges;
constexpr int kFields = kGauges + 1 + kThrottleKinds;
}  // namespace

std::vector<TelemetryStat> reduce_telemetry(const TelemetryInterval& mine, Comm& world) {
  std::array<TelemetryStatAcc, kFields> f;
  for (int g = 0; g < kGauges; ++g) f[g] = mine.gauge[g];
  if (mine.has_energy) f[kEnergy].add(mine.energy_j);
  if (mine.has_throttle && mine.observed_s > 0)
    for (int k = 0; k < kThrottleKinds; ++k) f[kEnergy + 1 + k].add(mine.throttled_s[k] / mine.observed_s);
  // Sums of (count, sum) and maxima of (max, -min): two calls.
  double sums[2 * kFields], maxs[2 * kFields];
  for (int i = 0; i < kFields; ++i) {
    sums[2 * i] = double(f[i].n), sums[2 * i + 1] = f[i].sum;
    maxs[2 * i] = f[i].max, maxs[2 * i + 1] = -f[i].min;
  }
  if (world.size() > 1) {
    world.all_reduce(Tensor(sums, DType::F64, {2 * kFields}));
    world.all_reduce(Tensor(maxs, DType::F64, {2 * kFields}), ReduceOp::Max);
  }
  std::vector<TelemetryStat> out;
  for (int i = 0; i < kFields; ++i) {
    if (sums[2 * i] <= 0) continue;  // nobody measured it: absent
    TelemetryStat s;
    s.name = i < kGauges ? telemetry_gauge_name(i) : i == kEnergy ? "energy_j" : throttle_kind_name(i - kEnergy - 1);
    s.per_rank = i >= kGauges;
    s.count = int64_t(sums[2 * i]);
    s.mean = sums[2 * i + 1] / sums[2 * i];
    s.max = maxs[2 * i];
    s.min = -maxs[2 * i + 1];
    if (i == kEnergy) s.total = sums[2 * i + 1];
    out.push_back(std::move(s));
  }
  return out;
}

RunEnergy reduce_run_energy(const TelemetryTotals& mine, double tokens, Comm& world) {
  double v[5] = {mine.has_energy ? 1.0 : 0.0, mine.has_energy ? mine.energy_j : 0.0,
                 mine.has_throttle ? 1.0 : 0.0, mine.has_throttle ? mine.observed_s : 0.0,
                 mine.has_throttle ? mine.throttled_s : 0.0};
  if (world.size() > 1) world.all_reduce(Tensor(v, DType::F64, {5}));
  RunEnergy e;
  e.energy_ranks = int(v[0]);
  e.energy_j = v[1];
  e.tokens = tokens;
  e.throttle_ranks = int(v[2]);
  e.observed_s = v[3];
  e.throttled_s = v[4];
  return e;
}

std::string format_run_energy(const RunEnergy& e) {
  std::string out;
  char buf[200];
  if (e.has_energy()) {
    std::snprintf(buf, sizeof buf, "energy:           %.4g J/token (%.4g J over %.0f tokens, %d rank%s measured; docs/telemetry.md)\n",
                  e.j_per_token(), e.energy_j, e.tokens, e.energy_ranks, e.energy_ranks == 1 ? "" : "s");
    out += buf;
  }
  if (e.has_throttle()) {
    std::snprintf(buf, sizeof buf, "throttled:        %.1f%% of the time (clock-throttle reasons, %d rank%s)\n",
                  100.0 * e.throttled_share(), e.throttle_ranks, e.throttle_ranks == 1 ? "" : "s");
    out += buf;
  }
  return out;
}

nlohmann::json run_energy_json(const RunEnergy& e) {
  nlohmann::json j = nlohmann::json::object();
  if (e.has_energy()) {
    j["energy_j"] = e.energy_j;
    j["tokens"] = int64_t(e.tokens);
    j["j_per_token"] = e.j_per_token();
    j["ranks"] = e.energy_ranks;
  }
  if (e.has_throttle()) {
    j["throttled_share"] = e.throttled_share();
    j["throttle_ranks"] = e.throttle_ranks;
  }
  return j;
}

}  // namespace adgt
