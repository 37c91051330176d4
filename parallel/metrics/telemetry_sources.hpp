// The telemetry sources (docs/telemetry.md) and the run's sampler made from
// them. Each opener returns nullptr and says why where its source cannot be
// read on this machine: the run then goes on with those fields absent.
#pragma once
#include <memory>
#include <string>

#include "parallel/mesh/device_plan.hpp"
#include "parallel/metrics/telemetry.hpp"

namespace adgt {

// NVML, loaded at run time with dlopen (nvml_source.cpp): `library` (a path or
// a soname; "" = $ADGT_NVML_LIBRARY, else libnvidia-ml.so.1), the GPU with
// `uuid` ("GPU-..."), else with NVML index `index` where uuid is empty. A
// function the library lacks leaves its fields absent (describe() names it).
std::unique_ptr<TelemetrySource> open_nvml_source(const std::string& library, const std::string& uuid,
                                                  int index, std::string* why);

// The host's powercap/RAPL package energy counters (rapl_source.cpp) under
// `root` ("" = $ADGT_POWERCAP_ROOT, else /sys/class/powercap): the top-level
// zones <type>:<n> (their sub-zones are parts of them: not added again; the
// MMIO twins of the packages are skipped), the package zones alone where
// there are any (psys would count them twice).
std::unique_ptr<TelemetrySource> open_rapl_source(const std::string& root, std::string* why);

// The run's sampler on this rank, started; nullptr when interval_s <= 0 or
// nothing is readable here. `source` (log.telemetry_source): auto = a CUDA
// rank reads its GPU through NVML, a CPU rank (cpu, emulated) reads RAPL when
// it is the first rank of its host (the counters are the host's: read once);
// nvml = every rank NVML (a CPU rank the GPU of NVML index = its local rank);
// rapl = every rank RAPL as a CPU rank does. `lead` prints one line saying
// what this rank reads, or why not.
std::unique_ptr<TelemetrySampler> make_telemetry_sampler(double interval_s, const DevicePlan& plan,
                                                         bool lead, const std::string& source = "auto");

}  // namespace adgt
