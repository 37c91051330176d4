// The simulator's line of `adgt-train --dry-run` (docs/simulator.md): the
// predicted step time of the run file on the given cluster (--cluster), or on
// this machine when the run would train on its CPU (the cpu-here preset with
// every rank sharing this host's cores, costed by a short profile of the CPU
// backend).
#pragma once
#include <string>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"

namespace adgt::sim {

// The text to print (lines ending in '\n'). Throws ConfigError for a bad
// cluster name or file. CPU ranks are costed by the profile of this machine
// and binary (profile.hpp default_profile_cache()): measured once, read after;
// before measuring, a line on stdout says how many ops and about how long.
std::string dry_run_prediction(const RunConfig& cfg, const std::string& cluster);

// The line before a profile measures: the ops a step of `cfg` on `cl` asks
// for that `pc` lacks, and about how long they take (kProfileSecondsPerOp
// each, measured on the 2-core VM: the rounds, the warm-up, the copies;
// 1.5 s more for the in-situ factor).
class ProfileCosts;
constexpr double kProfileSecondsPerOp = 0.12;
void announce_profiling(const RunConfig& cfg, const cluster::Cluster& cl, const ProfileCosts& pc);

// train.device=auto in an estimate (--dry-run, adgt-sim): the device a launch
// on that cluster would get. A GPU cluster (--cluster naming one) -> cuda; a
// CPU cluster (cores per node, or a device named cpu*, as the emulation's
// cluster files name theirs) -> cpu; no cluster: this machine's (cuda where a
// GPU is visible).
// Sets cfg.train.device and returns the line that says so ("" when the device
// was not auto). The memory model and the costs then follow that device.
std::string resolve_auto_device(RunConfig& cfg, const std::string& cluster);

// "bf16 on cuda (MFU against H100-SXM5-80GB's bf16 peak, 989 TFLOP/s per
// device)": what a plan, sweep or prediction assumed (each prints it as its
// "precision:" line; no newline).
std::string precision_line(const RunConfig& cfg, const cluster::Cluster& cl);

// With parallel.grad_compression=auto and dp > 1: the levels the controller
// is expected to choose for the dp buckets after warm-up on `cl`, one line
// ("" otherwise). Its rule (compress::choose_levels) on inputs the run would
// measure, taken from models instead: the dp group's links fitted to the
// cluster model's times of the controller's probes; the codecs' cost
// measured on this CPU (cpu_codecs) or, on a device cluster, a memory-bound
// estimate; the buckets of rank_work with their compressible tensors;
// compute_s, the step's compute (the simulator's). The gradient noise is
// only known while training: the error budget is taken to allow every
// level, so the line says "if the gradient noise allows".
struct ExpectedCompression {
  std::vector<std::string> levels;  // per dp bucket of world rank 0, start order
  double link_Bps = 0, link_latency_s = 0;  // the fitted all-reduce link (over sites: the cross-site one)
  std::string line;
};
ExpectedCompression expected_compression(const RunConfig& cfg, const cluster::Cluster& cl,
                                         double compute_s, bool cpu_codecs);

}  // namespace adgt::sim
