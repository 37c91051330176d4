// The device's power model (docs/cluster.md, "Power"; issue 48): what a
// kernel draws and how far its clock drops under a power cap. Per device, in
// the cluster file's device.power; the presets' figures come from spec sheets
// and public estimates, marked as such, not from measurement here.
//
// A kernel of F FLOPs moving B bytes of HBM that takes t seconds at the
// sustained clock draws idle_w + (e_flop F + e_byte B) / t. Above the cap the
// device lowers its clock to c < 1 so that the draw fits: the dynamic power
// scales as c^k (work per second x c, energy per operation x c^(k-1), the
// voltage following the clock), so idle + dyn c^k = cap, c =
// ((cap - idle) / dyn)^(1/k). The compute-bound side of the kernel's roofline
// takes 1/c times longer (HBM keeps its own clock), and its dynamic energy is
// E c^(k-1).
#pragma once
#include <string>

namespace adgt::cluster {

struct PowerModel {
  double idle_w = 0;   // board power with nothing running, W
  double limit_w = 0;  // the default power limit (TDP), W; 0: no power model
  // The cap in force (adgt-sim --power-cap, emulate.power_cap_w); 0: limit_w.
  double cap_w = 0;
  // Dynamic energy per FLOP at the sustained clock, picojoules: tensor-core
  // bf16, FP8, and fp32 (CUDA cores).
  double pj_per_flop_bf16 = 0, pj_per_flop_fp8 = 0, pj_per_flop_fp32 = 0;
  double pj_per_byte = 0;       // dynamic energy per HBM byte moved, picojoules
  double clock_exponent = 3;    // k: dynamic power ~ clock^k
  std::string source;           // where the figures come from ("spec sheet ...", "measured ...")
  bool on() const { return limit_w > 0; }
  double cap() const { return cap_w > 0 ? cap_w : limit_w; }
  bool operator==(const PowerModel&) const = default;
};

// The clock (a fraction of the sustained one, in (0, 1]) at which a kernel
// whose dynamic power at the sustained clock is dyn_w runs under the model's
// cap: 1 when idle + dyn fits (or no model).
double capped_clock(const PowerModel& p, double dyn_w);

// Dynamic energy, joules, of F FLOPs at `bytes_per_element` (1: FP8, 2: bf16,
// else fp32) and B bytes moved, at clock c.
double dynamic_joules(const PowerModel& p, double flops, int bytes_per_element, double bytes_moved,
                      double clock = 1);

}  // namespace adgt::cluster
