/* A stand-in for libnvidia-ml.so.1 (docs/telemetry.md), loaded by the tests
 * through ADGT_NVML_LIBRARY or open_nvml_source's library argument. One GPU,
 * "GPU-fake-0" at index 0, whose readings are functions of each function's
 * own call count k (0, 1, 2, ... since fake_nvml_reset()):
 *   power       100 + 10 k W            energy   1000 k mJ (1 J a call)
 *   GPU temp    50 + k C                memory temp (field 82)  60 + k C
 *   SM clock    1000 + 100 k MHz        memory clock  2000 MHz
 *   reasons     k even: GPU idle (0x1, not a throttle); k odd: SW power cap
 *               (0x4), and k = 3 mod 4 also HW thermal slowdown (0x40).
 *   max SM clock 1980 MHz               power limit 700 W
 * Built with FAKE_NVML_MINIMAL: no energy counter, no field values, no power
 * limit and no clock-event reasons (an old driver): those fields must come out
 * absent.
 *
 * A steady capped GPU instead (the power controller's end-to-end test,
 * tests/power/check_power.py): FAKE_NVML_STATE="power_w=P,limit_w=L,sm_mhz=C,
 * reasons=R" (any of them; read at nvmlInit_v2) makes power P W, the limit
 * L W, the SM clock C MHz and the reasons R (e.g. 4: SW power cap) on every
 * call, and any index a GPU (ranks of one host each read "their" index). */
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
struct nvmlDevice_st { int index; };
static struct nvmlDevice_st the_gpu = {0};

static unsigned power_k, energy_k, temp_k, memtemp_k, sm_k, reasons_k;

void fake_nvml_reset(void) { power_k = energy_k = temp_k = memtemp_k = sm_k = reasons_k = 0; }

/* FAKE_NVML_STATE: each < 0 = not set (the call-count readings). */
static double st_power = -1, st_limit = -1, st_sm = -1, st_reasons = -1;
static int steady = 0;

static void read_state(void) {
  const char* e = getenv("FAKE_NVML_STATE");
  steady = e && *e;
  st_power = st_limit = st_sm = st_reasons = -1;
  for (const char* p = e; steady && p && *p;) {
    const char* eq = strchr(p, '=');
    if (!eq) break;
    const double v = strtod(eq + 1, NULL);
    if (!strncmp(p, "power_w=", 8)) st_power = v;
    else if (!strncmp(p, "limit_w=", 8)) st_limit = v;
    else if (!strncmp(p, "sm_mhz=", 7)) st_sm = v;
    else if (!strncmp(p, "reasons=", 8)) st_reasons = v;
    p = strchr(eq, ',');
    if (p) ++p;
  }
}

nvmlReturn_t nvmlInit_v2(void) {
  read_state();
  return 0;
}
nvmlReturn_t nvmlShutdown(void) { return 0; }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* dev) {
  if (strcmp(uuid, "GPU-fake-0") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
  *dev = &the_gpu;
  return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* dev) {
  if (index != 0 && !steady) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = &the_gpu;
  return 0;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned* mw) {
  (void)dev;
  *mw = st_power >= 0 ? (unsigned)(st_power * 1000) : 100000u + 10000u * power_k++;
  return 0;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned* c) {
  (void)dev;
  if (sensor != 0) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  *c = 50u + temp_k++;
  return 0;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned* mhz) {
  (void)dev;
  if (type == 1) *mhz = st_sm >= 0 ? (unsigned)st_sm : 1000u + 100u * sm_k++;
  else if (type == 2) *mhz = 2000u;
  else return 3;
  return 0;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned* mhz) {
  (void)dev;
  if (type == 1) *mhz = 1980u;
  else if (type == 2) *mhz = 2619u;
  else return 3;
  return 0;
}

#ifndef FAKE_NVML_MINIMAL
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long* mj) {
  (void)dev;
  *mj = 1000ull * energy_k++;
  return 0;
}

/* nvmlFieldValue_t as nvml.h lays it out. */
typedef struct {
  unsigned fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  union { double dVal; unsigned uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; } value;
} nvmlFieldValue_t;

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int n, nvmlFieldValue_t* v) {
  (void)dev;
  for (int i = 0; i < n; ++i) {
    if (v[i].fieldId == 82) {
      v[i].valueType = 1; /* unsigned int */
      v[i].value.uiVal = 60u + memtemp_k++;
      v[i].nvmlReturn = 0;
    } else {
      v[i].nvmlReturn = 3;
    }
  }
  return 0;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned* mw) {
  (void)dev;
  *mw = st_limit >= 0 ? (unsigned)(st_limit * 1000) : 700000u;
  return 0;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long* r) {
  (void)dev;
  const unsigned k = reasons_k++;
  if (st_reasons >= 0) {
    *r = (unsigned long long)st_reasons;
    return 0;
  }
  *r = k % 2 == 0 ? 0x1ull : (k % 4 == 3 ? 0x4ull | 0x40ull : 0x4ull);
  return 0;
}
#endif
