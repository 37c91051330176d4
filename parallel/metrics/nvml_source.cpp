// NVML as a telemetry source, loaded with dlopen: the binary needs no NVML at
// link time and runs where the driver library is missing (the GPU fields are
// then absent). The few declarations used are written out below from NVML's
// C ABI (nvml.h of CUDA 12: the function names, the enum values and the
// layout of nvmlFieldValue_t); no NVML header is included.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "parallel/metrics/telemetry_sources.hpp"

namespace adgt {
namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;

constexpr int kNvmlTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;           // NVML_CLOCK_SM
constexpr int kNvmlClockMem = 2;          // NVML_CLOCK_MEM
constexpr unsigned kNvmlFiMemoryTemp = 82;  // NVML_FI_DEV_MEMORY_TEMP

// nvmlClocksEventReasons (formerly ...ThrottleReasons) bits, folded into ours.
constexpr unsigned long long kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20,
                             kHwThermal = 0x40, kHwPowerBrake = 0x80;

// nvmlFieldValue_t (40 bytes).
struct NvmlFieldValue {
  unsigned fieldId;
  unsigned scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t: 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint, 6 ushort
  nvmlReturn_t nvmlReturn;
  union {
    double dVal;
    unsigned uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
  } value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t's layout");

double field_number(const NvmlFieldValue& f) {
  switch (f.valueType) {
    case 0: return f.value.dVal;
    case 1: return f.value.uiVal;
    case 2: return double(f.value.ulVal);
    case 3: return double(f.value.ullVal);
    case 4: return double(f.value.sllVal);
    case 5: return f.value.siVal;
    case 6: return f.value.usVal;
    default: return -1;
  }
}

struct NvmlApi {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;                 // mW
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;      // mJ since the driver loaded
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;      // C
  nvmlReturn_t (*field_values)(nvmlDevice_t, int, NvmlFieldValue*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;            // MHz
  nvmlReturn_t (*max_clock)(nvmlDevice_t, int, unsigned*) = nullptr;        // MHz, the most it reaches
  nvmlReturn_t (*reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*limit)(nvmlDevice_t, unsigned*) = nullptr;                 // mW, the power limit in force
};

template <class F>
bool load(void* lib, const char* name, F& f, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) missing += std::string(missing.empty() ? "" : ", ") + name;
  return f != nullptr;
}

class NvmlSource final : public TelemetrySource {
 public:
  NvmlSource(void* lib, const NvmlApi& api, nvmlDevice_t dev, std::string what)
      : lib_(lib), api_(api), dev_(dev), what_(std::move(what)) {}
  ~NvmlSource() override {
    api_.shutdown();
    dlclose(lib_);
  }
  std::string describe() const override { return what_; }

  TelemetryReading read() override {
    TelemetryReading r;
    unsigned u = 0;
    unsigned long long ull = 0;
    if (api_.power && api_.power(dev_, &u) == 0) r.gauge[kPowerW] = u / 1e3;
    if (api_.limit && api_.limit(dev_, &u) == 0) r.gauge[kPowerLimitW] = u / 1e3;
    if (api_.energy && api_.energy(dev_, &ull) == 0) r.energy_j = double(ull) / 1e3;
    if (api_.temperature && api_.temperature(dev_, kNvmlTemperatureGpu, &u) == 0) r.gauge[kGpuTempC] = u;
    if (api_.field_values) {
      NvmlFieldValue f{};
      f.fieldId = kNvmlFiMemoryTemp;
      // A GPU without a memory sensor reports an error or 0 (never a real reading).
      if (api_.field_values(dev_, 1, &f) == 0 && f.nvmlReturn == 0 && field_number(f) > 0)
        r.gauge[kMemTempC] = field_number(f);
    }
    if (api_.clock && api_.clock(dev_, kNvmlClockSm, &u) == 0) r.gauge[kSmClockMhz] = u;
    if (api_.clock && api_.clock(dev_, kNvmlClockMem, &u) == 0) r.gauge[kMemClockMhz] = u;
    if (api_.max_clock && api_.max_clock(dev_, kNvmlClockSm, &u) == 0) r.gauge[kSmClockMaxMhz] = u;
    if (api_.reasons && api_.reasons(dev_, &ull) == 0) {
      uint32_t b = 0;
      if (ull & kSwPowerCap) b |= kThrottlePowerCap;
      if (ull & (kSwThermal | kHwThermal)) b |= kThrottleThermal;
      if (ull & (kHwSlowdown | kHwPowerBrake)) b |= kThrottleHwSlowdown;
      r.throttle = b;
    }
    return r;
  }

 private:
  void* lib_;
  NvmlApi api_;
  nvmlDevice_t dev_;
  std::string what_;
};

}  // namespace

std::unique_ptr<TelemetrySource> open_nvml_source(const std::string& library, const std::string& uuid,
                                                  int index, std::string* why) {
  std::string path = library;
  if (path.empty()) {
    const char* env = std::getenv("ADGT_NVML_LIBRARY");
    path = env && *env ? env : "libnvidia-ml.so.1";
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    *why = "NVML not loaded (" + std::string(e ? e : path) + "; ADGT_NVML_LIBRARY names another)";
    return nullptr;
  }
  NvmlApi api;
  std::string missing;  // required ones
  load(lib, "nvmlInit_v2", api.init, missing);
  load(lib, "nvmlShutdown", api.shutdown, missing);
  if (uuid.empty()) load(lib, "nvmlDeviceGetHandleByIndex_v2", api.by_index, missing);
  else load(lib, "nvmlDeviceGetHandleByUUID", api.by_uuid, missing);
  if (!missing.empty()) {
    dlclose(lib);
    *why = "NVML in " + path + " lacks " + missing;
    return nullptr;
  }
  std::string absent;  // optional ones: their fields absent
  load(lib, "nvmlDeviceGetPowerUsage", api.power, absent);
  load(lib, "nvmlDeviceGetTotalEnergyConsumption", api.energy, absent);
  load(lib, "nvmlDeviceGetTemperature", api.temperature, absent);
  load(lib, "nvmlDeviceGetFieldValues", api.field_values, absent);
  load(lib, "nvmlDeviceGetClockInfo", api.clock, absent);
  load(lib, "nvmlDeviceGetMaxClockInfo", api.max_clock, absent);
  load(lib, "nvmlDeviceGetEnforcedPowerLimit", api.limit, absent);
  // The newer name (driver 535 on), else the older one.
  api.reasons = reinterpret_cast<decltype(api.reasons)>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (!api.reasons) load(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", api.reasons, absent);
  if (const nvmlReturn_t rc = api.init(); rc != 0) {
    dlclose(lib);
    *why = "nvmlInit_v2 failed (NVML error " + std::to_string(rc) + ")";
    return nullptr;
  }
  nvmlDevice_t dev = nullptr;
  const nvmlReturn_t rc = uuid.empty() ? api.by_index(unsigned(index), &dev) : api.by_uuid(uuid.c_str(), &dev);
  const std::string which = uuid.empty() ? "index " + std::to_string(index) : uuid;
  if (rc != 0) {
    api.shutdown();
    dlclose(lib);
    *why = "NVML has no GPU " + which + " (NVML error " + std::to_string(rc) + ")";
    return nullptr;
  }
  std::string what = "NVML GPU " + which;
  if (!absent.empty()) what += " (the library lacks " + absent + ": those fields absent)";
  return std::make_unique<NvmlSource>(lib, api, dev, what);
}

}  // namespace adgt
