#include "parallel/metrics/telemetry_sources.hpp"

#include <cstdio>

#include "parallel/comm/launch.hpp"

namespace adgt {

std::unique_ptr<TelemetrySampler> make_telemetry_sampler(double interval_s, const DevicePlan& plan,
                                                         bool lead, const std::string& source) {
  if (interval_s <= 0) return nullptr;
  std::vector<std::unique_ptr<TelemetrySource>> sources;
  std::string why;
  int local_rank = 0;
  try {
    local_rank = detect_launch().local_rank;
  } catch (const std::exception&) {
  }  // the launch was checked at start; here only the rank's place on its host matters
  const bool cuda = plan.device == "cuda";
  if (source == "nvml" || (source == "auto" && cuda)) {
    // By UUID: CUDA's device index and NVML's differ under CUDA_VISIBLE_DEVICES.
    const bool uuid = cuda && plan.device_id.rfind("GPU-", 0) == 0;
    if (auto s = open_nvml_source("", uuid ? plan.device_id : "", cuda ? plan.cuda_device : local_rank, &why))
      sources.push_back(std::move(s));
  } else {
    // The host's counters, read by one rank of the host only (the first):
    // summed over the ranks they would count the host once per rank.
    if (local_rank != 0) why = "the host's RAPL counters are read by its first rank";
    else if (auto s = open_rapl_source("", &why)) sources.push_back(std::move(s));
  }
  if (lead) {
    std::string what;
    for (const auto& s : sources) what += (what.empty() ? "" : ", ") + s->describe();
    std::printf("telemetry: every %g s on each rank; rank 0 reads %s (docs/telemetry.md)\n", interval_s,
                what.empty() ? ("nothing: " + why + "; its fields are absent").c_str() : what.c_str());
    std::fflush(stdout);
  }
  if (sources.empty()) return nullptr;
  auto sampler = std::make_unique<TelemetrySampler>(std::move(sources), interval_s);
  sampler->start();
  return sampler;
}

}  // namespace adgt
