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
//
// With a limiter (limiter_window_s > 0) the clock is not set kernel by kernel:
// the device watches its power averaged over an exponential window of
// limiter_window_s seconds and, while that average is above the cap and for
// limiter_hold_s after it falls back, runs at limiter_brake_clock. A burst
// shorter than the window hardly moves the average; a longer one trips the
// brake, and the brake's hold costs more than the burst's excess: the
// transient behaviour (large micro-batches' long GEMMs tripping the power
// limit, shorter ones riding under it) that the kernel-by-kernel model cannot
// show (docs/power.md). limiter_walk runs a step's kernels, in order, through
// it.
#pragma once
#include <string>
#include <vector>

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
  // The limiter (0: none, the clock set kernel by kernel): averaging window,
  // the clock while braked (a fraction of the sustained one), the hold.
  double limiter_window_s = 0, limiter_brake_clock = 0.5, limiter_hold_s = 0;
  bool on() const { return limit_w > 0; }
  bool limiter() const { return limiter_window_s > 0; }
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

// One kernel of a step, at the sustained clock: the roofline's two sides and
// the launch overhead (seconds), the dynamic energy of its FLOPs and of its
// bytes (joules). At clock c it takes max(compute / c, memory) + overhead and
// its FLOPs cost flop_j c^(k-1).
struct PowerSegment {
  double compute_s = 0, memory_s = 0, overhead_s = 0, flop_j = 0, byte_j = 0;
};

// A step's kernels run back to back, step after step, through the limiter
// under the model's cap until the brake's pattern repeats: the step's time
// and dynamic energy without a cap and under it (the mean of the later
// steps), and the share of the capped step spent braked.
struct LimiterStep {
  double free_s = 0, capped_s = 0;
  double free_dyn_j = 0, capped_dyn_j = 0;
  double braked_share = 0;
  double slowdown() const { return free_s > 0 ? capped_s / free_s : 1.0; }
};
LimiterStep limiter_walk(const PowerModel& p, const std::vector<PowerSegment>& step);

}  // namespace adgt::cluster
