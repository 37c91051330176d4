// The planner (parallel/plan/planner.hpp) and the sweep under it: the branch
// and bound finds the same best plans as simulating everything, constraints
// are kept, an infeasible constraint is a named error with the nearest
// plans, the speed-weighted stage split, the overrides round trip, and the
// keys a run file sets.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/gpu_topology.hpp"
#include "parallel/plan/launch_plan.hpp"
#include "parallel/plan/planner.hpp"
#include "parallel/sim/ops.hpp"
#include "parallel/sim/sweep.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

const char* kModel = R"(model: {vocab_size: 256, d_model: 64, n_layers: 8, n_heads: 8,
       n_kv_heads: 4, ffn_hidden: 128, seq_len: 64}
train: {global_batch: 16}
)";

// With parallel.auto the layout keys are constraints, checked once planned.
RunConfig run(const std::vector<std::string>& sets = {}) {
  std::vector<std::string> s = {"parallel.auto=true"};
  s.insert(s.end(), sets.begin(), sets.end());
  return load_config_text(kModel, "plan.yaml", s);
}

// Two nodes of four; the link between them 10x slower than inside.
cluster::Cluster two_nodes(const std::string& extra = "") {
  return cluster::parse_cluster(
      "nodes: 2\ndevices_per_node: 4\n"
      "device: {peak_bf16_tflops: 0.05, peak_fp32_tflops: 0.05, memory_gib: 1, hbm_GBps: 10}\n"
      "intra: {bandwidth_GBps: 0.4, latency_us: 100}\n"
      "inter: {bandwidth_GBps: 0.04, latency_us: 1000}\n" + extra,
      "two.yaml");
}

plan::PlanInput input(const std::vector<std::string>& fixed = {},
                      const std::vector<std::string>& sets = {},
                      const cluster::Cluster& cl = two_nodes()) {
  plan::PlanInput in;
  in.base = run(sets);
  in.fixed = fixed;
  in.world = 8;
  in.cluster = cl;
  return in;
}

}  // namespace

TEST_CASE("plan: branch and bound finds the best plans of the full sweep", "[plan]") {
  sim::DeviceModelCosts costs(two_nodes().device);
  const RunConfig base = run();
  sim::SweepOptions all;
  const auto full = sim::sweep_layouts(base, 8, two_nodes(), costs, all);
  REQUIRE(full.rows.size() > 20);
  REQUIRE(full.bounded == 0);
  // The bound never exceeds the simulated step.
  for (const auto& r : full.rows) CHECK(r.lower_bound_s <= r.result.step_time_s * (1 + 1e-9));
  sim::SweepOptions some;
  some.keep = 5;
  const auto bb = sim::sweep_layouts(base, 8, two_nodes(), costs, some);
  CHECK(bb.bounded > 0);
  CHECK(bb.candidates == full.candidates);
  for (size_t i = 0; i < 5; ++i)
    CHECK(bb.rows[i].result.step_time_s == Approx(full.rows[i].result.step_time_s).epsilon(1e-12));

  const plan::Plan p = plan::make_plan(input(), costs);
  CHECK(p.chosen().result.step_time_s == Approx(full.rows[0].result.step_time_s).epsilon(1e-12));
  // Tensor parallelism does not cross the slow link when a node can hold it.
  CHECK(p.chosen().cfg.parallel.tp <= 4);
  const std::string table = plan::format_plan(p, two_nodes());
  CHECK_THAT(table, Contains("<- chosen"));
  CHECK_THAT(table, Contains("constraints: none"));
}

TEST_CASE("plan: constraints are kept; an infeasible one names the nearest plans", "[plan]") {
  sim::DeviceModelCosts costs(two_nodes().device);
  const plan::Plan p = plan::make_plan(
      input({"parallel.pp", "train.micro_batch", "train.steps"}, {"parallel.pp=2", "train.micro_batch=2"}),
      costs);
  REQUIRE(!p.rows.empty());
  for (const auto& r : p.rows) {
    CHECK(r.cfg.parallel.pp == 2);
    CHECK(r.cfg.train.micro_batch == 2);
  }
  CHECK(p.fixed == std::vector<std::string>{"parallel.pp", "train.micro_batch"});  // train.steps is not a layout key
  CHECK(p.rejected_fixed > 0);

  try {
    plan::make_plan(input({"parallel.pp"}, {"parallel.pp=3"}), costs);
    FAIL("pp=3 of 8 ranks was planned");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Contains("no plan for 8 ranks"));
    CHECK_THAT(std::string(e.what()), Contains("parallel.pp=3"));
    CHECK_THAT(std::string(e.what()), Contains("nearest feasible plans"));
    CHECK_THAT(std::string(e.what()), Contains("changes parallel.pp to"));
  }
}

TEST_CASE("plan: overrides reproduce the chosen layout", "[plan]") {
  sim::DeviceModelCosts costs(two_nodes().device);
  const plan::Plan p = plan::make_plan(input(), costs);
  for (const auto& row : p.rows) {
    const RunConfig c = run(plan::plan_overrides(row.cfg));
    CHECK(layout_of(c) == layout_of(row.cfg));
    CHECK(c.train.micro_batch == row.cfg.train.micro_batch);
    CHECK(c.train.recompute == row.cfg.train.recompute);
  }
}

TEST_CASE("plan: stages weighted by speed, and Megatron's default", "[plan]") {
  const cluster::Cluster slow = two_nodes("node_speed: [1, 0.5]\n");
  RunConfig c = run({"parallel.pp=2", "parallel.tp=4", "train.micro_batch=1"});
  CHECK(sim::speed_weighted_stages(c, slow) == std::vector<int64_t>{5, 3});  // 8 x 2/3, 8 x 1/3
  CHECK(sim::speed_weighted_stages(c, two_nodes()).empty());
  c = run({"parallel.pp=2", "parallel.tp=2", "parallel.dp=2", "parallel.schedule=interleaved",
           "parallel.virtual_stages=2", "train.micro_batch=1"});
  const auto w = sim::speed_weighted_stages(c, slow);
  REQUIRE(w.size() == 4);
  CHECK(w[0] + w[1] + w[2] + w[3] == 8);
  CHECK(w[0] > w[1]);  // stage 0 on node 0 (fast), stage 1 on node 1

  sim::DeviceModelCosts costs(slow.device);
  const auto meg = plan::megatron_default(input({}, {}, slow), costs);
  REQUIRE(meg);
  CHECK(meg->layout.rfind("tp=4 pp=1 dp=2", 0) == 0);
  const plan::Plan p = plan::make_plan(input({}, {}, slow), costs);
  CHECK(p.chosen().result.step_time_s <= meg->result.step_time_s);
}

TEST_CASE("config: explicit_keys lists what the file and --set give", "[plan][config]") {
  const auto k = explicit_keys_text(kModel, "plan.yaml", {"parallel.pp=2", "parallel.auto=true"});
  CHECK(k == std::vector<std::string>{"model.d_model", "model.ffn_hidden", "model.n_heads",
                                      "model.n_kv_heads", "model.n_layers", "model.seq_len",
                                      "model.vocab_size", "parallel.auto", "parallel.pp",
                                      "train.global_batch"});
  CHECK_THROWS_AS(explicit_keys_text("train: {nope: 1}", "bad.yaml"), ConfigError);
}

TEST_CASE("plan: NVLink domains from nvidia-smi topo -m", "[plan]") {
  // An 8-GPU NVSwitch node (DGX H100): one domain of 8.
  std::string dgx = "\t GPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\n";
  for (int i = 0; i < 8; ++i) {
    dgx += "GPU" + std::to_string(i);
    for (int j = 0; j < 8; ++j) dgx += i == j ? "\t X " : "\tNV18";
    dgx += "\tPXB\t0-55\t0\n";
  }
  dgx += "\nLegend:\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n";
  plan::GpuTopology t = plan::parse_nvidia_topology(dgx);
  CHECK(t.gpus == 8);
  CHECK(t.nvlink_domain == 8);
  // Four PCIe GPUs bridged in pairs by NVLink: domains of 2.
  const std::string pairs =
      "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
      "GPU0\t X \tNV4\tSYS\tSYS\t0-15\n"
      "GPU1\tNV4\t X \tSYS\tSYS\t0-15\n"
      "GPU2\tSYS\tSYS\t X \tNV4\t16-31\n"
      "GPU3\tSYS\tSYS\tNV4\t X \t16-31\n";
  t = plan::parse_nvidia_topology(pairs);
  CHECK(t.gpus == 4);
  CHECK(t.nvlink_domain == 2);
  // No NVLink at all.
  t = plan::parse_nvidia_topology("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n");
  CHECK(t.nvlink_domain == 1);
  CHECK(plan::parse_nvidia_topology("nvidia-smi: command not found").gpus == 0);

  // A launch of 2 hosts x 4 of those pair-bridged GPUs: PCIe inside the node, tp <= 2.
  RunConfig cfg = run();
  std::string why;
  int64_t max_tp = 0;
  const std::vector<std::string> hosts = {"a", "a", "a", "a", "b", "b", "b", "b"};
  const cluster::Cluster cl = plan::launch_cluster(cfg, hosts, "NVIDIA A100-SXM4-80GB", 0, &why,
                                                   plan::parse_nvidia_topology(pairs), &max_tp);
  CHECK(cl.nodes == 2);
  CHECK(cl.devices_per_node == 4);
  CHECK(cl.intra.bandwidth == 25e9);
  CHECK(max_tp == 2);
  CHECK_THAT(why, Contains("preset dgx-a100-80gb"));
  CHECK_THAT(why, Contains("NVLink joins only 2 of the host's 4 GPUs"));
  plan::PlanInput in = input();
  in.cluster = cl;
  in.max_tp = max_tp;
  sim::DeviceModelCosts costs(cl.device);
  for (const auto& r : plan::make_plan(in, costs).rows) CHECK(r.cfg.parallel.tp <= 2);
  // CPU ranks of one host: cpu-here with the host's cores.
  const cluster::Cluster cpu = plan::launch_cluster(cfg, std::vector<std::string>(8, "h"), "", 2, &why);
  CHECK(cpu.nodes == 1);
  CHECK(cpu.devices_per_node == 8);
  CHECK(cpu.cores_per_node == 2);
}

TEST_CASE("plan: context parallelism for long sequences, where cp can train", "[plan][cp]") {
  // A sequence of 8192 tokens: cp 2 leaves each rank 4096 (kCpMinTokens),
  // cp 4 too few; 2048 tokens: no cp at all.
  sim::DeviceModelCosts costs(two_nodes().device);
  const std::vector<std::string> lng = {"model.seq_len=8192", "train.device=cpu"};
  auto cps = [](const auto& rows) {
    std::vector<int64_t> c;
    for (const auto& r : rows) c.push_back(r.cfg.parallel.cp);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    return c;
  };
  sim::SweepOptions all;
  cluster::Cluster big = two_nodes();
  big.device.memory_bytes = int64_t(1) << 40;  // every layout fits
  const auto with = sim::sweep_layouts(run(lng), 8, big, costs, all);
  CHECK(cps(with.rows) == std::vector<int64_t>{1, 2});
  for (const auto& r : with.rows)
    if (r.cfg.parallel.cp == 2) {
      CHECK(r.cfg.parallel.cp_mode == "ring");
      CHECK(r.cfg.parallel.tp * 2 * r.cfg.parallel.pp * r.cfg.parallel.dp == 8);
      CHECK(r.layout.find("cp=2") != std::string::npos);
    }
  sim::SweepOptions off;
  off.context_parallel = false;
  CHECK(cps(sim::sweep_layouts(run(lng), 8, big, costs, off).rows) == std::vector<int64_t>{1});
  CHECK(cps(sim::sweep_layouts(run({"model.seq_len=2048"}), 8, big, costs, all).rows) ==
        std::vector<int64_t>{1});
  // parallel.cp held by --set: only it.
  sim::SweepOptions held;
  held.fixed = {"parallel.cp"};
  CHECK(cps(sim::sweep_layouts(run({"model.seq_len=8192", "parallel.cp=2"}), 8, big, costs, held)
                .rows) == std::vector<int64_t>{2});
  // The planner offers cp on host ranks without what cp cannot run yet; a
  // run on CUDA keeps cp = 1; document masking runs in the ring (its mode).
  auto planned = [&](const std::vector<std::string>& sets) {
    plan::PlanInput in = input({}, sets, big);
    in.top = 1000;
    return cps(plan::make_plan(in, costs).rows);
  };
  CHECK(planned(lng) == std::vector<int64_t>{1, 2});
  CHECK(planned({"model.seq_len=8192", "train.device=cuda"}) == std::vector<int64_t>{1});
  CHECK(planned({"model.seq_len=8192", "train.device=cpu", "train.document_mask=true",
                 "data.eos_id=10"}) == std::vector<int64_t>{1, 2});
  // An expert capacity, its groups spanning cp's chunks (the whole
  // micro-batch: the run counts gathered over cp) or inside them (8192 /
  // (2 x 2) = 2048 tokens at cp 2): cp either way.
  std::vector<std::string> moe = {"model.seq_len=8192", "train.device=cpu", "model.n_experts=4",
                                  "model.moe_capacity_factor=1.0"};
  CHECK(planned(moe) == std::vector<int64_t>{1, 2});
  moe.push_back("model.moe_capacity_segment=2048");
  CHECK(planned(moe) == std::vector<int64_t>{1, 2});
}

TEST_CASE("plan: the sweep tries ZeRO-2 and ZeRO-3 where they run, and they save memory", "[plan][zero]") {
  sim::DeviceModelCosts costs(two_nodes().device);
  const RunConfig base = run();
  sim::SweepOptions all;
  const auto full = sim::sweep_layouts(base, 8, two_nodes(), costs, all);
  int z23 = 0;
  for (const auto& r : full.rows) {
    const ParallelConfig& p = r.cfg.parallel;
    if (p.zero < 2) continue;
    ++z23;
    CHECK(p.dp * p.cp > 1);
    CHECK(r.layout.find("zero=" + std::to_string(p.zero)) != std::string::npos);
  }
  CHECK(z23 > 0);
  // The same layout at ZeRO 0..3: each level holds less.
  std::vector<double> mem;
  for (int z = 0; z <= 3; ++z) {
    RunConfig c = base;
    c.parallel.dp = 8;
    c.parallel.zero = z;
    mem.push_back(sim::simulate_step(c, two_nodes(), costs).memory_state_bytes);
  }
  CHECK(mem[1] < mem[0]);
  CHECK(mem[2] < mem[1]);
  CHECK(mem[3] < mem[2]);
  CHECK(mem[3] <= mem[0] / 6);
}
