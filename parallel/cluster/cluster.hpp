// The cluster description (docs/cluster.md): what the simulator, the planner
// and the link emulation know about the machine a run is on — nodes, devices
// per node, the device's peaks, the links inside a node and between nodes,
// and optional per-node speed factors, link overrides and sites joined by a
// wide-area link. One YAML file (or a built-in preset, `dgx-h100`, ...) read
// with the run file's rules: unknown keys, wrong types and bad values are
// ConfigErrors naming file:line and key.
//
// Ranks map to nodes in blocks: world rank r lives on node r / devices_per_node
// (mpirun --map-by node: the launcher's order; under emulation the cluster
// file's). Bandwidths are bytes per second per direction; latencies seconds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/cluster/power.hpp"

namespace adgt::cluster {

// One link class: the time to move b bytes is latency + b / (bandwidth * efficiency).
struct Link {
  double bandwidth = 0;   // bytes/s per direction (YAML: bandwidth_GBps, 1e9 bytes/s)
  double latency = 0;     // seconds (YAML: latency_us)
  double efficiency = 1;  // achieved / nominal bandwidth (NCCL bus bandwidth / link peak)
  double effective_bandwidth() const { return bandwidth * efficiency; }
  bool operator==(const Link&) const = default;
};

// One accelerator (or, for `cpu-here`, one CPU rank). The efficiency curves
// are documented with their sources in docs/cluster.md.
struct Device {
  std::string name = "device";
  double peak_bf16_flops = 0;  // FLOP/s, dense (YAML: peak_bf16_tflops)
  double peak_fp32_flops = 0;  // FLOP/s (YAML: peak_fp32_tflops)
  // FLOP/s, dense FP8 tensor cores (YAML: peak_fp8_tflops; 0: none, FP8
  // GEMMs are costed at the bf16 peak)
  double peak_fp8_flops = 0;
  double memory_bytes = 0;     // YAML: memory_gib
  double hbm_bandwidth = 0;    // bytes/s (YAML: hbm_GBps)
  // GEMM efficiency: eff(f) = gemm_efficiency * f / (f + gemm_half_flops) for a
  // GEMM of f = 2mnk FLOPs (small GEMMs cannot fill the device).
  double gemm_efficiency = 0.75;
  double gemm_half_flops = 2e9;
  // Attention core (flash kernels): the same curve over the core's FLOPs.
  double attention_efficiency = 0.4;
  double attention_half_flops = 2e9;
  double memory_efficiency = 0.8;  // achieved / hbm_bandwidth for memory-bound kernels
  // The clock the tensor cores hold under sustained training load, as a
  // fraction of the boost clock the peaks and the GEMM measurements assume
  // (power-limited parts throttle): scales the compute-bound side.
  double sustained_clock = 1.0;
  double kernel_overhead = 4e-6;   // seconds per kernel launch (or per CPU op)
  PowerModel power;                // YAML: power: {...} (power.hpp); none: no energy, no cap
  bool operator==(const Device&) const = default;
};

// A pair of nodes whose link differs from `inter` (a slow or congested link).
struct LinkOverride {
  int64_t node_a = 0, node_b = 0;
  Link link;
  bool operator==(const LinkOverride&) const = default;
};

struct Cluster {
  std::string name = "custom";
  std::string source;             // the file it came from, or "preset:<name>"
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  Device device;
  Link intra;                     // between two devices of one node (NVLink/NVSwitch), per device
  Link inter;                     // one NIC between two nodes
  int64_t nics_per_node = 1;      // NICs a node's devices share for inter-node traffic
  std::vector<double> node_speed; // (nodes) compute speed factors; empty: all 1 (0.5 = half speed)
  std::vector<LinkOverride> link_overrides;
  // Sites (datacenters): consecutive node counts summing to nodes; empty: one
  // site. Traffic between nodes of different sites crosses `wan`, one link
  // that the devices of a node crossing it share (collectives.hpp).
  std::vector<int64_t> sites;
  Link wan;
  // Cores each node's ranks share (CPU ranks: `cpu-here`); 0: every rank owns its device.
  int64_t cores_per_node = 0;
  // CPU ranks: the OpenMP/BLAS threads each rank runs its ops with, and so the
  // cores a computing rank wants (its ops are profiled at that count); 0:
  // auto, max(1, cores_per_node / devices_per_node), what adgt-train gives
  // each rank when OMP_NUM_THREADS is unset (kernels/cpu_threads.hpp).
  int64_t threads_per_rank = 0;

  int64_t world() const { return nodes * devices_per_node; }
  // threads_per_rank, or its automatic value (1 without cores_per_node).
  int64_t rank_threads() const;
  bool preset() const { return source.rfind("preset:", 0) == 0; }
  // CPU ranks, not GPUs: cores per node are given (cpu-here), or the device
  // is named cpu* (the emulation's cluster files: CPU ranks standing in for a
  // cluster's devices). Their ops are costed by a profile of this CPU.
  bool cpu_ranks() const { return cores_per_node > 0 || device.name.rfind("cpu", 0) == 0; }
  int64_t node_of(int64_t rank) const { return rank / devices_per_node; }
  int64_t site_of_node(int64_t node) const;
  double speed_of_node(int64_t node) const;  // 1 when node_speed is empty
  // The link one message between nodes a != b crosses (an override, the WAN
  // between sites, or inter); a == b: intra.
  const Link& link_between(int64_t node_a, int64_t node_b) const;
  bool operator==(const Cluster&) const = default;
};

// Parses a cluster file. Errors are adgt::ConfigErrors (core/config.hpp) "<path>:<line>: <key> ...".
Cluster load_cluster_file(const std::string& path);
Cluster parse_cluster(const std::string& yaml, const std::string& name);
// A preset name (cluster_presets()) or a file path.
Cluster load_cluster(const std::string& preset_or_path);
// dgx-a100-80gb, dgx-h100, dgx-h200, cpu-here, ...
std::vector<std::string> cluster_presets();
// The same cluster with enough nodes for `gpus` devices (gpus must be a
// multiple of devices_per_node, or smaller than it: one node holding gpus
// devices). node_speed and sites must be empty or already match.
Cluster with_gpus(Cluster c, int64_t gpus);
// The cluster as YAML (round-trips through parse_cluster).
std::string to_yaml(const Cluster& c);

}  // namespace adgt::cluster
