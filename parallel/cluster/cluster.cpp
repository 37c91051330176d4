// The cluster file's parser, its presets and the rank/link lookups
// (cluster.hpp; the key reference and the presets' sources: docs/cluster.md).
#include "parallel/cluster/cluster.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "core/config.hpp"

namespace adgt::cluster {
namespace {

// ---- presets: sources in docs/cluster.md ("Presets") ----------------------
// Efficiencies: intra = NCCL all-reduce bus bandwidth / NVLink peak per
// direction measured by nccl-tests on the DGX; inter = IB bus bandwidth / line
// rate. GEMM and attention curves: cuBLAS and FlashAttention-2 measurements.
const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> p = {
      {"dgx-a100-80gb", R"(name: dgx-a100-80gb
nodes: 1
devices_per_node: 8
device:
  name: A100-SXM4-80GB
  peak_bf16_tflops: 312
  peak_fp32_tflops: 19.5
  memory_gib: 80
  hbm_GBps: 2039
  gemm_efficiency: 0.86
  gemm_half_gflops: 0.6
  attention_efficiency: 0.62
  attention_half_gflops: 1.5
  memory_efficiency: 0.8
  kernel_overhead_us: 4
  sustained_clock: 0.8
  power: {idle_w: 55, limit_w: 400, pj_per_flop_bf16: 1.6, pj_per_flop_fp8: 0, pj_per_flop_fp32: 16,
          pj_per_byte: 60, clock_exponent: 3,
          source: "spec sheet (400 W TDP) and public estimates; not measured by adgt"}
intra: {bandwidth_GBps: 300, latency_us: 3, efficiency: 0.78}
inter: {bandwidth_GBps: 25, latency_us: 6, efficiency: 0.9}
nics_per_node: 8
)"},
      // sustained_clock 0.90: fitted to adgt's fourth GPU run (one H100 SXM,
      // 2026-12-05, docs/cuda.md), as the H200's below to its first: the
      // 1.3B bf16 step (batch 8 x 2048) measured 268.7 ms, predicted 246.4 ms
      // at 1.0 and 267.8 ms at 0.90 (set 2026-12-07; docs/scale.md's H100
      // rows moved with it).
      {"dgx-h100", R"(name: dgx-h100
nodes: 1
devices_per_node: 8
device:
  name: H100-SXM5-80GB
  peak_bf16_tflops: 989
  peak_fp32_tflops: 67
  peak_fp8_tflops: 1979
  memory_gib: 80
  hbm_GBps: 3350
  gemm_efficiency: 0.80
  gemm_half_gflops: 2
  attention_efficiency: 0.38
  attention_half_gflops: 4
  memory_efficiency: 0.8
  kernel_overhead_us: 4
  sustained_clock: 0.90
  power: {idle_w: 75, limit_w: 700, pj_per_flop_bf16: 0.75, pj_per_flop_fp8: 0.40, pj_per_flop_fp32: 9,
          pj_per_byte: 60, clock_exponent: 3,
          source: "spec sheet (700 W TDP) and public estimates; not measured by adgt"}
intra: {bandwidth_GBps: 450, latency_us: 3, efficiency: 0.8}
inter: {bandwidth_GBps: 50, latency_us: 6, efficiency: 0.9}
nics_per_node: 8
)"},
      // sustained_clock 0.84: fitted to adgt's first GPU run (one H200,
      // 2026-12-04, docs/cuda.md): the 1.3B bf16 step (batch 8 x 2048)
      // measured 263.3 ms, predicted 225.2 ms at 1.0 and 260.9 ms at 0.84;
      // LLaMA-7B (seq 4096, micro-batch 1, selective recompute) 390.5 ms,
      // predicted 332.8 and 380.9 ms. The whole gap, not only the clock: the
      // optimizer alone is predicted 12.1 ms against 17.8 ms measured.
      {"dgx-h200", R"(name: dgx-h200
nodes: 1
devices_per_node: 8
device:
  name: H200-SXM-141GB
  peak_bf16_tflops: 989
  peak_fp32_tflops: 67
  peak_fp8_tflops: 1979
  memory_gib: 140
  hbm_GBps: 4800
  gemm_efficiency: 0.83
  gemm_half_gflops: 2
  attention_efficiency: 0.38
  attention_half_gflops: 4
  memory_efficiency: 0.8
  kernel_overhead_us: 4
  sustained_clock: 0.84
  power: {idle_w: 75, limit_w: 700, pj_per_flop_bf16: 0.75, pj_per_flop_fp8: 0.40, pj_per_flop_fp32: 9,
          pj_per_byte: 60, clock_exponent: 3,
          source: "spec sheet (700 W TDP) and public estimates; not measured by adgt"}
intra: {bandwidth_GBps: 450, latency_us: 3, efficiency: 0.8}
inter: {bandwidth_GBps: 50, latency_us: 6, efficiency: 0.9}
nics_per_node: 8
)"},
      // This machine: CPU ranks in one node sharing its cores; compute times
      // come from a measured profile (costs.hpp), the link from shared memory.
      {"cpu-here", R"(name: cpu-here
nodes: 1
devices_per_node: 8
cores_per_node: 2
device:
  name: cpu-rank
  peak_bf16_tflops: 0.05
  peak_fp32_tflops: 0.05
  memory_gib: 24
  hbm_GBps: 10
  gemm_efficiency: 0.9
  gemm_half_gflops: 0.01
  attention_efficiency: 0.5
  attention_half_gflops: 0.01
  memory_efficiency: 0.5
  kernel_overhead_us: 2
intra: {bandwidth_GBps: 4, latency_us: 5, efficiency: 1}
inter: {bandwidth_GBps: 4, latency_us: 5, efficiency: 1}
nics_per_node: 1
)"},
  };
  return p;
}

std::string at(const std::string& name, const YAML::Node& n) {
  if (!n.IsDefined() || n.Mark().is_null()) return name;
  return name + ":" + std::to_string(n.Mark().line + 1);
}

[[noreturn]] void fail(const std::string& name, const YAML::Node& n, const std::string& msg) {
  throw ConfigError(at(name, n) + ": " + msg);
}

std::string kind(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing";
  return "'" + n.Scalar() + "'";
}

double number(const std::string& name, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(name, n, key + ": expected a number, got " + kind(n));
  const std::string s = n.Scalar();
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v)) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    fail(name, n, key + ": expected a number, got '" + s + "'");
  }
}

double positive(const std::string& name, const YAML::Node& n, const std::string& key) {
  const double v = number(name, n, key);
  if (!(v > 0)) fail(name, n, key + ": must be > 0, got " + n.Scalar());
  return v;
}

double non_negative(const std::string& name, const YAML::Node& n, const std::string& key) {
  const double v = number(name, n, key);
  if (v < 0) fail(name, n, key + ": must be >= 0, got " + n.Scalar());
  return v;
}

double fraction(const std::string& name, const YAML::Node& n, const std::string& key) {
  const double v = number(name, n, key);
  if (!(v > 0 && v <= 1)) fail(name, n, key + ": must be in (0, 1], got " + n.Scalar());
  return v;
}

int64_t integer(const std::string& name, const YAML::Node& n, const std::string& key,
                int64_t min) {
  if (!n.IsScalar()) fail(name, n, key + ": expected an integer, got " + kind(n));
  const std::string s = n.Scalar();
  int64_t v = 0;
  try {
    size_t used = 0;
    v = std::stoll(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
  } catch (const std::exception&) {
    fail(name, n, key + ": expected an integer, got '" + s + "'");
  }
  if (v < min) fail(name, n, key + ": must be >= " + std::to_string(min) + ", got " + s);
  return v;
}

// Walks a mapping with a fixed key set: unknown and repeated keys are errors
// naming the allowed ones.
void for_keys(const std::string& name, const YAML::Node& map, const std::string& where,
              const std::vector<std::string>& allowed,
              const std::function<void(const std::string&, const YAML::Node&)>& each) {
  if (!map.IsMap()) fail(name, map, where + ": expected a mapping, got " + kind(map));
  std::map<std::string, int> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node k = it->first;
    if (!k.IsScalar()) fail(name, k, where + ": keys must be plain words, got " + kind(k));
    const std::string key = k.Scalar();
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == key;
    if (!ok) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(name, k, (where.empty() ? "" : where + ".") + key + ": unknown key; allowed: " + list);
    }
    if (auto [p, fresh] = seen.emplace(key, k.Mark().line + 1); !fresh)
      fail(name, k, (where.empty() ? "" : where + ".") + key + " appears twice (first at line " +
                        std::to_string(p->second) + ")");
    each(key, it->second);
  }
}

Link parse_link(const std::string& name, const YAML::Node& n, const std::string& where,
                bool allow_nodes = false, LinkOverride* ov = nullptr) {
  Link l;
  bool bw = false, lat = false;
  std::vector<std::string> allowed = {"bandwidth_GBps", "latency_us", "efficiency"};
  if (allow_nodes) allowed.push_back("nodes");
  bool nodes = false;
  for_keys(name, n, where, allowed, [&](const std::string& k, const YAML::Node& v) {
    const std::string key = where + "." + k;
    if (k == "bandwidth_GBps") l.bandwidth = positive(name, v, key) * 1e9, bw = true;
    if (k == "latency_us") l.latency = non_negative(name, v, key) * 1e-6, lat = true;
    if (k == "efficiency") l.efficiency = fraction(name, v, key);
    if (k == "nodes") {
      if (!v.IsSequence() || v.size() != 2)
        fail(name, v, key + ": expected two node indices [a, b], got " + kind(v));
      ov->node_a = integer(name, v[0], key, 0);
      ov->node_b = integer(name, v[1], key, 0);
      if (ov->node_a == ov->node_b)
        fail(name, v, key + ": a link joins two different nodes, got [" + v[0].Scalar() + ", " +
                          v[1].Scalar() + "]");
      nodes = true;
    }
  });
  if (!bw) fail(name, n, where + ": bandwidth_GBps is required");
  if (!lat) fail(name, n, where + ": latency_us is required");
  if (allow_nodes && !nodes) fail(name, n, where + ": nodes: [a, b] is required");
  return l;
}

PowerModel parse_power(const std::string& name, const YAML::Node& n) {
  PowerModel p;
  bool idle = false, limit = false;
  for_keys(name, n, "device.power",
           {"idle_w", "limit_w", "pj_per_flop_bf16", "pj_per_flop_fp8", "pj_per_flop_fp32", "pj_per_byte",
            "clock_exponent", "limiter_window_s", "limiter_brake_clock", "limiter_hold_s", "source"},
           [&](const std::string& k, const YAML::Node& v) {
             const std::string key = "device.power." + k;
             if (k == "limiter_window_s") p.limiter_window_s = non_negative(name, v, key);
             if (k == "limiter_hold_s") p.limiter_hold_s = non_negative(name, v, key);
             if (k == "limiter_brake_clock") {
               p.limiter_brake_clock = positive(name, v, key);
               if (p.limiter_brake_clock > 1)
                 fail(name, v, key + ": a fraction of the sustained clock, in (0, 1], got " + v.Scalar());
             }
             if (k == "idle_w") p.idle_w = non_negative(name, v, key), idle = true;
             if (k == "limit_w") p.limit_w = positive(name, v, key), limit = true;
             if (k == "pj_per_flop_bf16") p.pj_per_flop_bf16 = non_negative(name, v, key);
             if (k == "pj_per_flop_fp8") p.pj_per_flop_fp8 = non_negative(name, v, key);
             if (k == "pj_per_flop_fp32") p.pj_per_flop_fp32 = non_negative(name, v, key);
             if (k == "pj_per_byte") p.pj_per_byte = non_negative(name, v, key);
             if (k == "clock_exponent") p.clock_exponent = positive(name, v, key);
             if (k == "source") {
               if (!v.IsScalar()) fail(name, v, key + ": expected a string, got " + kind(v));
               p.source = v.Scalar();
             }
           });
  if (!idle || !limit) fail(name, n, "device.power: idle_w and limit_w are required");
  if (p.idle_w >= p.limit_w)
    fail(name, n, "device.power: idle_w (" + std::to_string(p.idle_w) + ") must be below limit_w (" +
                      std::to_string(p.limit_w) + ")");
  return p;
}

Device parse_device(const std::string& name, const YAML::Node& n) {
  Device d;
  std::map<std::string, bool> got;
  for_keys(name, n, "device",
           {"name", "peak_bf16_tflops", "peak_fp32_tflops", "peak_fp8_tflops", "memory_gib", "hbm_GBps",
            "gemm_efficiency", "gemm_half_gflops", "attention_efficiency",
            "attention_half_gflops", "memory_efficiency", "kernel_overhead_us", "sustained_clock", "power"},
           [&](const std::string& k, const YAML::Node& v) {
             const std::string key = "device." + k;
             got[k] = true;
             if (k == "name") {
               if (!v.IsScalar()) fail(name, v, key + ": expected a string, got " + kind(v));
               d.name = v.Scalar();
             }
             if (k == "peak_bf16_tflops") d.peak_bf16_flops = positive(name, v, key) * 1e12;
             if (k == "peak_fp32_tflops") d.peak_fp32_flops = positive(name, v, key) * 1e12;
             if (k == "peak_fp8_tflops") d.peak_fp8_flops = non_negative(name, v, key) * 1e12;
             if (k == "memory_gib") d.memory_bytes = positive(name, v, key) * 1073741824.0;
             if (k == "hbm_GBps") d.hbm_bandwidth = positive(name, v, key) * 1e9;
             if (k == "gemm_efficiency") d.gemm_efficiency = fraction(name, v, key);
             if (k == "gemm_half_gflops") d.gemm_half_flops = non_negative(name, v, key) * 1e9;
             if (k == "attention_efficiency") d.attention_efficiency = fraction(name, v, key);
             if (k == "attention_half_gflops")
               d.attention_half_flops = non_negative(name, v, key) * 1e9;
             if (k == "memory_efficiency") d.memory_efficiency = fraction(name, v, key);
             if (k == "kernel_overhead_us") d.kernel_overhead = non_negative(name, v, key) * 1e-6;
             if (k == "sustained_clock") d.sustained_clock = fraction(name, v, key);
             if (k == "power") d.power = parse_power(name, v);
           });
  for (const char* req : {"peak_bf16_tflops", "peak_fp32_tflops", "memory_gib", "hbm_GBps"})
    if (!got[req]) fail(name, n, std::string("device.") + req + " is required");
  return d;
}

}  // namespace

int64_t Cluster::site_of_node(int64_t node) const {
  int64_t first = 0;
  for (size_t s = 0; s < sites.size(); ++s) {
    first += sites[s];
    if (node < first) return static_cast<int64_t>(s);
  }
  return 0;
}

double Cluster::speed_of_node(int64_t node) const {
  if (node_speed.empty()) return 1.0;
  return node_speed.at(static_cast<size_t>(node));
}

const Link& Cluster::link_between(int64_t a, int64_t b) const {
  if (a == b) return intra;
  for (const auto& o : link_overrides)
    if ((o.node_a == a && o.node_b == b) || (o.node_a == b && o.node_b == a)) return o.link;
  if (!sites.empty() && site_of_node(a) != site_of_node(b)) return wan;
  return inter;
}

Cluster parse_cluster(const std::string& yaml, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(name + (e.mark.is_null() ? "" : ":" + std::to_string(e.mark.line + 1)) +
                      ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) fail(name, root, "expected a mapping of cluster keys, got " + kind(root));
  Cluster c;
  c.source = name;
  std::map<std::string, YAML::Node> got;
  for_keys(name, root, "",
           {"name", "nodes", "devices_per_node", "cores_per_node", "threads_per_rank", "device",
            "intra", "inter",
            "nics_per_node", "node_speed", "link_overrides", "sites", "wan"},
           [&](const std::string& k, const YAML::Node& v) {
             got[k] = v;
             if (k == "name") {
               if (!v.IsScalar()) fail(name, v, "name: expected a string, got " + kind(v));
               c.name = v.Scalar();
             }
             if (k == "nodes") c.nodes = integer(name, v, k, 1);
             if (k == "devices_per_node") c.devices_per_node = integer(name, v, k, 1);
             if (k == "cores_per_node") c.cores_per_node = integer(name, v, k, 0);
             if (k == "threads_per_rank") c.threads_per_rank = integer(name, v, k, 0);
             if (k == "nics_per_node") c.nics_per_node = integer(name, v, k, 1);
             if (k == "device") c.device = parse_device(name, v);
             if (k == "intra") c.intra = parse_link(name, v, "intra");
             if (k == "inter") c.inter = parse_link(name, v, "inter");
             if (k == "wan") c.wan = parse_link(name, v, "wan");
           });
  for (const char* req : {"nodes", "devices_per_node", "device", "intra"})
    if (!got.count(req)) fail(name, root, std::string(req) + " is required");
  if (c.nodes > 1 && !got.count("inter"))
    fail(name, root, "inter is required with nodes > 1 (the link between nodes)");
  if (!got.count("inter")) c.inter = c.intra;
  if (got.count("node_speed")) {
    const YAML::Node v = got["node_speed"];
    if (!v.IsSequence()) fail(name, v, "node_speed: expected a list of factors, got " + kind(v));
    if (static_cast<int64_t>(v.size()) != c.nodes)
      fail(name, v, "node_speed: has " + std::to_string(v.size()) + " entries but nodes=" +
                        std::to_string(c.nodes) + "; give one factor per node");
    for (size_t i = 0; i < v.size(); ++i)
      c.node_speed.push_back(positive(name, v[i], "node_speed[" + std::to_string(i) + "]"));
  }
  if (got.count("link_overrides")) {
    const YAML::Node v = got["link_overrides"];
    if (!v.IsSequence()) fail(name, v, "link_overrides: expected a list, got " + kind(v));
    for (size_t i = 0; i < v.size(); ++i) {
      LinkOverride o;
      o.link = parse_link(name, v[i], "link_overrides[" + std::to_string(i) + "]", true, &o);
      for (int64_t n : {o.node_a, o.node_b})
        if (n >= c.nodes)
          fail(name, v[i], "link_overrides[" + std::to_string(i) + "].nodes: node " +
                               std::to_string(n) + " is outside 0.." +
                               std::to_string(c.nodes - 1));
      c.link_overrides.push_back(o);
    }
  }
  if (got.count("sites")) {
    const YAML::Node v = got["sites"];
    if (!v.IsSequence()) fail(name, v, "sites: expected a list of node counts, got " + kind(v));
    int64_t sum = 0;
    for (size_t i = 0; i < v.size(); ++i)
      sum += c.sites.emplace_back(integer(name, v[i], "sites[" + std::to_string(i) + "]", 1));
    if (sum != c.nodes)
      fail(name, v, "sites: the node counts sum to " + std::to_string(sum) + " but nodes=" +
                        std::to_string(c.nodes));
    if (c.sites.size() > 1 && !got.count("wan"))
      fail(name, v, "sites: more than one site needs wan: {bandwidth_GBps, latency_us}");
  } else if (got.count("wan")) {
    fail(name, got["wan"], "wan: only meaningful with sites: [nodes of site 0, nodes of site 1, ...]");
  }
  if (c.threads_per_rank > 0 && c.cores_per_node == 0)
    fail(name, got["threads_per_rank"],
         "threads_per_rank: only meaningful for CPU ranks; give cores_per_node (the cores the "
         "node's ranks share)");
  if (c.cores_per_node == 0 && c.nics_per_node > c.devices_per_node)
    fail(name, got.count("nics_per_node") ? got["nics_per_node"] : root,
         "nics_per_node=" + std::to_string(c.nics_per_node) + " exceeds devices_per_node=" +
             std::to_string(c.devices_per_node));
  return c;
}

int64_t Cluster::rank_threads() const {
  if (threads_per_rank > 0) return threads_per_rank;
  if (cores_per_node <= 0) return 1;
  return std::max<int64_t>(1, cores_per_node / std::max<int64_t>(1, devices_per_node));
}

Cluster load_cluster_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(path + ": cannot read the cluster file (presets: dgx-a100-80gb, dgx-h100, "
                             "dgx-h200, cpu-here)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cluster(ss.str(), path);
}

Cluster load_cluster(const std::string& preset_or_path) {
  if (auto it = presets().find(preset_or_path); it != presets().end()) {
    Cluster c = parse_cluster(it->second, "preset:" + it->first);
    // cpu-here is this machine: its cores (the preset's 2 where unknown).
    if (it->first == "cpu-here")
      if (const unsigned n = std::thread::hardware_concurrency(); n > 0) c.cores_per_node = n;
    return c;
  }
  if (!std::filesystem::exists(preset_or_path)) {
    std::string list;
    for (const auto& p : cluster_presets()) list += (list.empty() ? "" : ", ") + p;
    throw ConfigError("cluster '" + preset_or_path +
                      "' is neither a preset nor a readable file; presets: " + list);
  }
  return load_cluster_file(preset_or_path);
}

std::vector<std::string> cluster_presets() {
  std::vector<std::string> out;
  for (const auto& [k, v] : presets()) out.push_back(k);
  return out;
}

Cluster with_gpus(Cluster c, int64_t gpus) {
  if (gpus < 1) throw ConfigError("--gpus must be >= 1, got " + std::to_string(gpus));
  if (gpus < c.devices_per_node && c.nodes == 1) {
    c.devices_per_node = gpus;
    if (c.cores_per_node == 0) c.nics_per_node = std::min(c.nics_per_node, gpus);
    return c;
  }
  if (gpus % c.devices_per_node != 0)
    throw ConfigError("--gpus " + std::to_string(gpus) + " is not a multiple of the " +
                      std::to_string(c.devices_per_node) + " devices per node of cluster " +
                      c.name);
  const int64_t nodes = gpus / c.devices_per_node;
  if (nodes != c.nodes && (!c.node_speed.empty() || c.sites.size() > 1 || !c.link_overrides.empty()))
    throw ConfigError("--gpus " + std::to_string(gpus) + " needs " + std::to_string(nodes) +
                      " nodes but cluster " + c.name + " describes " + std::to_string(c.nodes) +
                      " with per-node settings (node_speed, sites or link_overrides); edit the file");
  c.nodes = nodes;
  if (c.sites.size() == 1) c.sites = {nodes};
  return c;
}

namespace {
std::string num(double v) {
  std::ostringstream os;
  os.precision(12);
  os << v;
  return os.str();
}
std::string link_yaml(const Link& l) {
  return "{bandwidth_GBps: " + num(l.bandwidth / 1e9) + ", latency_us: " + num(l.latency * 1e6) +
         ", efficiency: " + num(l.efficiency) + "}";
}
}  // namespace

std::string to_yaml(const Cluster& c) {
  std::ostringstream os;
  const Device& d = c.device;
  os << "name: " << c.name << "\nnodes: " << c.nodes << "\ndevices_per_node: "
     << c.devices_per_node << "\ncores_per_node: " << c.cores_per_node
     << "\nthreads_per_rank: " << c.threads_per_rank << "\ndevice:\n  name: "
     << d.name << "\n  peak_bf16_tflops: " << num(d.peak_bf16_flops / 1e12)
     << "\n  peak_fp32_tflops: " << num(d.peak_fp32_flops / 1e12)
     << "\n  peak_fp8_tflops: " << num(d.peak_fp8_flops / 1e12)
     << "\n  memory_gib: " << num(d.memory_bytes / 1073741824.0)
     << "\n  hbm_GBps: " << num(d.hbm_bandwidth / 1e9)
     << "\n  gemm_efficiency: " << num(d.gemm_efficiency)
     << "\n  gemm_half_gflops: " << num(d.gemm_half_flops / 1e9)
     << "\n  attention_efficiency: " << num(d.attention_efficiency)
     << "\n  attention_half_gflops: " << num(d.attention_half_flops / 1e9)
     << "\n  memory_efficiency: " << num(d.memory_efficiency)
     << "\n  kernel_overhead_us: " << num(d.kernel_overhead * 1e6)
     << "\n  sustained_clock: " << num(d.sustained_clock);
  if (d.power.on())
    os << "\n  power: {idle_w: " << num(d.power.idle_w) << ", limit_w: " << num(d.power.limit_w)
       << ", pj_per_flop_bf16: " << num(d.power.pj_per_flop_bf16)
       << ", pj_per_flop_fp8: " << num(d.power.pj_per_flop_fp8)
       << ", pj_per_flop_fp32: " << num(d.power.pj_per_flop_fp32)
       << ", pj_per_byte: " << num(d.power.pj_per_byte)
       << ", clock_exponent: " << num(d.power.clock_exponent)
       << (d.power.limiter() ? ", limiter_window_s: " + num(d.power.limiter_window_s) +
                                   ", limiter_brake_clock: " + num(d.power.limiter_brake_clock) +
                                   ", limiter_hold_s: " + num(d.power.limiter_hold_s)
                             : std::string())
       << ", source: \"" << d.power.source << "\"}";
  os << "\nintra: "
     << link_yaml(c.intra) << "\ninter: " << link_yaml(c.inter)
     << "\nnics_per_node: " << c.nics_per_node << "\n";
  if (!c.node_speed.empty()) {
    os << "node_speed: [";
    for (size_t i = 0; i < c.node_speed.size(); ++i) os << (i ? ", " : "") << num(c.node_speed[i]);
    os << "]\n";
  }
  if (!c.link_overrides.empty()) {
    os << "link_overrides:\n";
    for (const auto& o : c.link_overrides) {
      std::string l = link_yaml(o.link);
      os << "  - {nodes: [" << o.node_a << ", " << o.node_b << "], " << l.substr(1) << "\n";
    }
  }
  if (c.sites.size() > 1) {
    os << "sites: [";
    for (size_t i = 0; i < c.sites.size(); ++i) os << (i ? ", " : "") << c.sites[i];
    os << "]\nwan: " << link_yaml(c.wan) << "\n";
  }
  return os.str();
}

}  // namespace adgt::cluster
