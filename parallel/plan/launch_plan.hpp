// parallel.auto at launch (docs/planner.md): rank 0 finds the cluster (the
// emulated cluster file on CPU ranks, else the hosts of the launch and the
// device), measures the op costs the model needs on this machine (a short
// profile, cached under log.dir) or uses the device model for GPUs, plans
// (planner.hpp), prints the table and broadcasts the plan as --set overrides;
// every rank loads the run with them. The decision is data: every rank gets
// the same overrides and the same validated config.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/gpu_topology.hpp"
#include "parallel/plan/planner.hpp"
#include "parallel/sim/step_sim.hpp"

namespace adgt::plan {

// The cluster of a launch of `hosts.size()` ranks (hosts[r]: rank r's host
// name): cfg.emulate.cluster when set (grown to the launch when it is a
// preset); else nodes = distinct hosts and devices per node = ranks per host
// (unequal counts: the smallest, with a note in `why`), the device a GPU
// preset by `gpu_name` ("NVIDIA H100 80GB HBM3" -> dgx-h100; "" -> the CPU:
// cpu-here with this host's `cores` shared by its ranks). `topo`: this host's
// GPUs (gpu_topology.hpp); when its NVLink domain is smaller than the
// devices per node, the intra-node link is costed as PCIe (25 GB/s, 2 us)
// and *max_tp is set to the domain (tensor parallelism stays on NVLink).
cluster::Cluster launch_cluster(const RunConfig& cfg, const std::vector<std::string>& hosts,
                                const std::string& gpu_name, int64_t cores, std::string* why,
                                const GpuTopology& topo = {}, int64_t* max_tp = nullptr);

struct LaunchPlan {
  RunConfig cfg;                        // the run with the plan applied (validated)
  std::vector<std::string> overrides;   // the plan as --set overrides
  std::string table;                    // rank 0: the plan table; others: ""
  std::string json;                     // plan_json() (the same on every rank)
  std::vector<std::string> hosts;       // launcher rank -> host name
  std::vector<std::string> fixed;       // the keys the user set (the plan kept them)
  // parallel.auto_trials: the plans to try, each as --set overrides (the
  // structure leaders first, the launch's choice first of all), and each
  // one's structure (trial_candidates); empty when off.
  std::vector<std::vector<std::string>> trials;
  std::vector<int> trial_group;
};

// Collective over MPI_COMM_WORLD (an MpiEnv must exist). `cfg` was loaded
// from `path` with `overrides`. Throws ConfigError on every rank (the same
// message) when nothing fits.
LaunchPlan plan_at_launch(const RunConfig& cfg, const std::string& path,
                          const std::vector<std::string>& overrides);

// parallel.auto_trials' candidates: indices into p.rows (best predicted
// first), at most k: the best row of each distinct (tp, pp, dp, ep), among
// the rows predicted within `within` of the best. The simulator's error is
// mostly per structure (on CPU ranks sharing cores, pipelines measured
// 1.4-2x their prediction, data-parallel plans 1.1-1.25x;
// docs/simulator.md), so the trials hedge it across structures rather than
// time micro-batch sizes of one.
std::vector<size_t> trial_rows(const Plan& p, size_t k, double within = 0.25);
// Every candidate: trial_rows' leaders, then for each leader up to `more`
// other rows of its structure (best predicted first, any prediction): pairs
// (row, the index of its leader among the leaders).
std::vector<std::pair<size_t, int>> trial_candidates(const Plan& p, size_t k, size_t more = 2,
                                                     double within = 0.25);

// Writes `json` to DIR/plan.json (creating DIR); a failure is a warning on
// stderr, not an error (the plan is also in metrics.jsonl).
void write_plan_file(const std::string& dir, const std::string& json);

// adgt-train --dry-run with parallel.auto: the plan table for `gpus` devices
// (0: the cluster file's devices, or the run's tp*pp*dp for a preset) of
// `cluster_arg` (a preset or file; "" = this machine's CPU), and the chosen
// config in `chosen`. Nothing is allocated but the profile's operands on a CPU.
std::string plan_dry_run(const RunConfig& cfg, const std::string& path,
                         const std::vector<std::string>& overrides,
                         const std::string& cluster_arg, int64_t gpus, RunConfig* chosen);

// parallel.auto at run time (docs/planner.md "Re-planning"): the plan for
// the run's world (`hosts[r]`: launcher rank r's host) on the cluster the
// launch planned with, but with the compute slowdowns measured while
// training (`slow`: launcher rank -> factor >= 1) and the pipeline links'
// (`slow_links`: {launcher a, launcher b} -> factor >= 1 on a message's
// time; the emulation's own entries are not read), keeping the user's keys
// (`fixed`). Also the current
// layout (`cfg`) simulated on the same cluster and costs. Local: world rank
// 0 calls it and broadcasts the decision. The profile comes from the cache
// the launch wrote under log.dir (CPU ranks).
struct Replan {
  RunConfig chosen;
  std::vector<std::string> overrides;  // the chosen layout as --set overrides
  sim::SimResult current, planned;     // predicted: the running layout, the plan
  std::string layout_now, layout_new;  // describe_layout()
  std::string table;                   // the plan table
  std::string json;                    // plan_json() of the new plan
};
// `power_cap_w` > 0: every device of the cluster capped at that many watts
// (its power model; the power controller's re-plan under a measured limit).
Replan replan(const RunConfig& cfg, const std::vector<std::string>& fixed,
              const std::vector<std::string>& hosts, const std::map<int, double>& slow,
              const std::map<std::pair<int, int>, double>& slow_links = {}, double power_cap_w = 0);

// The cluster model replan() plans on for `hosts` (launcher rank -> host):
// emulate.cluster's, else this machine's GPU preset or CPU cores (local: no
// communication; world rank 0's answer is the one decisions use).
cluster::Cluster run_cluster(const RunConfig& cfg, const std::vector<std::string>& hosts);

// The cluster model's seconds for one message of `bytes` over each link
// {launcher a, launcher b} of `links`, on the cluster and rank placement
// replan() uses (the re-plan controller compares measured link times with
// them). Links outside the cluster are left out.
std::map<std::pair<int, int>, double> link_model_times(const RunConfig& cfg,
                                                       const std::vector<std::string>& hosts,
                                                       const std::vector<std::pair<int, int>>& links,
                                                       double bytes);

}  // namespace adgt::plan
