// The step simulator (parallel/sim/) against independent references: its
// pipeline phase against the schedule timeline (parallel/pipeline/timeline),
// processor sharing against the single process, the data-parallel buckets
// against their collective times summed by hand, a slow rank, the
// homogeneous shortcut against simulating every replica, and named errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "parallel/cluster/cluster.hpp"
#include "parallel/cluster/collectives.hpp"
#include "parallel/engine/engine.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu_threads.hpp"
#include "kernels/flop_counter.hpp"
#include "parallel/sim/host.hpp"
#include "parallel/sim/profile.hpp"
#include "parallel/sim/sweep.hpp"
#include "parallel/sim/step_sim.hpp"
#include "parallel/sim/work.hpp"

using namespace adgt;
using namespace adgt::sim;
using Catch::Matchers::Contains;

namespace {

// Every op 1 ms plus 1 ns per MFLOP; the update free (so a step is its passes).
struct FakeCosts final : OpCosts {
  double seconds(const Op& op, int) override {
    if (op.kind == OpKind::AdamW || op.kind == OpKind::SumSquares) return 0;
    return 1e-3 + op.flops() * 1e-15;
  }
  std::string describe() const override { return "fake"; }
};

// FakeCosts times `scale`; a power of two scales every sum the simulator
// forms exactly, so a step's times scale by it too.
struct ScaledCosts final : OpCosts {
  explicit ScaledCosts(double s) : scale(s) {}
  double scale;
  FakeCosts base;
  double seconds(const Op& op, int bytes) override { return scale * base.seconds(op, bytes); }
  std::string describe() const override { return "scaled"; }
};

// simulate_step on a thread of its own: its result, or nothing after
// `limit_s` (a simulation that does not end; the thread, owning copies of its
// inputs, is left to run until the process exits).
std::optional<SimResult> simulate_within(const RunConfig& cfg, const cluster::Cluster& cl,
                                         double scale, double limit_s) {
  auto done = std::make_shared<std::promise<SimResult>>();
  std::future<SimResult> result = done->get_future();
  std::thread([done, cfg, cl, scale] {
    try {
      ScaledCosts costs(scale);
      done->set_value(simulate_step(cfg, cl, costs));
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(limit_s)) != std::future_status::ready)
    return std::nullopt;
  return result.get();
}

RunConfig run(const std::vector<std::string>& sets) {
  return load_config_text(R"(model: {vocab_size: 256, d_model: 64, n_layers: 8, n_heads: 8,
         n_kv_heads: 4, ffn_hidden: 128, seq_len: 32}
train: {micro_batch: 2, global_batch: 16}
)",
                          "sim.yaml", sets);
}

// 8 devices on one node, links so fast that communication is ~free.
cluster::Cluster fast(int64_t cores = 0) {
  return cluster::parse_cluster(
      "nodes: 1\ndevices_per_node: 8\ncores_per_node: " + std::to_string(cores) +
          "\ndevice: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 16, hbm_GBps: 1}\n"
          "intra: {bandwidth_GBps: 1000000000, latency_us: 0}\n",
      "fast.yaml");
}

double pass_sum(const PassWork& w, OpCosts& c) {
  double t = 0;
  for (const Piece& p : w.pieces)
    for (const Op& op : p.ops) t += c.seconds(op, 4);
  return t;
}

}  // namespace

TEST_CASE("sim: the pipeline phase equals the schedule simulator's makespan", "[sim]") {
  for (const char* sched : {"1f1b", "zb-h1", "gpipe", "interleaved", "zb-v"}) {
    INFO(sched);
    std::vector<std::string> sets = {"parallel.pp=4", std::string("parallel.schedule=") + sched};
    if (std::string(sched) == "interleaved" || std::string(sched) == "zb-v")
      sets.push_back("parallel.virtual_stages=2");
    const RunConfig cfg = run(sets);
    FakeCosts costs;
    const int P = 4, v = int(cfg.parallel.virtual_stages), S = P * v;
    pp::StageCosts sc;
    sc.f.assign(size_t(S), 0);
    sc.b.assign(size_t(S), 0);
    sc.w.assign(size_t(S), 0);
    for (int p = 0; p < P; ++p) {
      const RankWork rw = rank_work(cfg, p);
      for (int c = 0; c < v; ++c) {
        // zb-v: rank p's chunk 1 is stage 2P-1-p (the vee placement).
        const size_t s = size_t(stage_of(placement_of_schedule(sched), P, p, c));
        sc.f[s] = pass_sum(rw.chunks[size_t(c)].forward, costs);
        sc.b[s] = pass_sum(rw.chunks[size_t(c)].input_grad, costs);
        sc.w[s] = pass_sum(rw.chunks[size_t(c)].weight_grad, costs);
        // The fused backward is B and W.
        CHECK(pass_sum(rw.chunks[size_t(c)].backward, costs) == Approx(sc.b[s] + sc.w[s]));
      }
    }
    // The cost-driven generator (zb-v) plans on the simulation's own stage
    // times (what the run's re-plan measures), the fixed orders as they are;
    // from the FLOP costs zb-v would order its list differently.
    const bool planned = std::string(sched) == "zb-v";
    const pp::Timeline ref = pp::time_schedule(planned ? engine_schedule(cfg, &sc) : engine_schedule(cfg), sc);
    const SimResult r = simulate_step(cfg, fast(), costs);
    CHECK(r.step_time_s == Approx(ref.makespan).epsilon(1e-6));
    CHECK(r.bubble == Approx(ref.bubble_fraction).margin(1e-6));
  }
}

TEST_CASE("sim: ranks sharing cores share them (processor sharing)", "[sim]") {
  FakeCosts costs;
  const double single = simulate_step(run({}), fast(), costs).step_time_s;
  const double dp4_one_core = simulate_step(run({"parallel.dp=4"}), fast(1), costs).step_time_s;
  const double dp4_four_cores = simulate_step(run({"parallel.dp=4"}), fast(4), costs).step_time_s;
  const double dp4_own = simulate_step(run({"parallel.dp=4"}), fast(), costs).step_time_s;
  // Four ranks on one core do the single process's work; on four cores a quarter each.
  CHECK(dp4_one_core == Approx(single).epsilon(1e-3));
  CHECK(dp4_four_cores == Approx(single / 4).epsilon(1e-3));
  CHECK(dp4_own == Approx(single / 4).epsilon(1e-3));
  // tp=2: each unit needs two cores.
  const double tp2_two_cores = simulate_step(run({"parallel.tp=2", "parallel.dp=2"}), fast(2), costs).step_time_s;
  const double tp2_own = simulate_step(run({"parallel.tp=2", "parallel.dp=2"}), fast(), costs).step_time_s;
  CHECK(tp2_two_cores == Approx(2 * tp2_own).epsilon(1e-3));
}

TEST_CASE("sim: CPU ranks of several threads each want that many cores", "[sim]") {
  FakeCosts costs;
  const RunConfig single_cfg = run({}), dp4 = run({"parallel.dp=4"});
  const double single = simulate_step(single_cfg, fast(), costs).step_time_s;
  // 4 ranks on 8 cores: with 1 or 2 threads each they all run at once; with
  // 4 each (the costs are their ops at 4 threads) they want 16 cores: half speed.
  for (const auto& [threads, expect] : std::vector<std::pair<int64_t, double>>{
           {1, single / 4}, {2, single / 4}, {4, single / 2}}) {
    INFO("threads per rank " << threads);
    cluster::Cluster cl = fast(8);
    cl.threads_per_rank = threads;
    CHECK(cl.rank_threads() == threads);
    const double t = simulate_step(dp4, cl, costs).step_time_s;
    CHECK(t == Approx(expect).epsilon(1e-3));
    // The sweep's bound stays below the simulation.
    CHECK(step_lower_bound(dp4, cl, costs, {}) <= t * (1 + 1e-9));
    CHECK(step_lower_bound(dp4, cl, costs, {}) == Approx(expect).epsilon(1e-3));
  }
  // Automatic: the node's cores over its ranks (8 over 8: one each), one
  // without cores per node; a file's threads need cores.
  CHECK(fast(8).rank_threads() == 1);
  CHECK(fast(16).rank_threads() == 2);
  CHECK(fast(0).rank_threads() == 1);
  CHECK_THROWS_WITH(cluster::parse_cluster("nodes: 1\ndevices_per_node: 2\nthreads_per_rank: 2\n"
                                           "device: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, "
                                           "memory_gib: 1, hbm_GBps: 1}\nintra: {bandwidth_GBps: 1, "
                                           "latency_us: 1}\n",
                                           "t.yaml"),
                    Catch::Contains("t.yaml:3: threads_per_rank: only meaningful for CPU ranks"));
  // It round-trips through the YAML form.
  cluster::Cluster c = fast(8);
  c.threads_per_rank = 3;
  CHECK(cluster::parse_cluster(cluster::to_yaml(c), "rt.yaml").threads_per_rank == 3);
}

TEST_CASE("sim: CPU ranks that fill their cores reduce their gradients after the backward", "[sim]") {
  // A slow link, so the reduction is long next to the last backward.
  const auto slow = [](int64_t cores) {
    cluster::Cluster c = fast(cores);
    c.intra.bandwidth = 3e7;
    return c;
  };
  FakeCosts costs;
  const RunConfig on = run({"parallel.dp=2"}), off = run({"parallel.dp=2", "parallel.overlap=false"});
  // Every core computing (2 ranks x 1 thread on 2 cores): no core moves the
  // buckets during the backward, overlap or not.
  const double full_on = simulate_step(on, slow(2), costs).step_time_s;
  CHECK(full_on == simulate_step(off, slow(2), costs).step_time_s);
  // A spare core (2 ranks on 4 cores): the buckets reduce during the
  // backward and the step is shorter with overlap.
  CHECK(simulate_step(on, slow(4), costs).step_time_s < simulate_step(off, slow(4), costs).step_time_s * 0.99);
  // Two threads each on 4 cores fill them too.
  cluster::Cluster two = slow(4);
  two.threads_per_rank = 2;
  CHECK(simulate_step(on, two, costs).step_time_s == simulate_step(off, two, costs).step_time_s);
}

TEST_CASE("sim: ranks of a host share its memory bandwidth", "[sim]") {
  FakeCosts inner;
  const Op adam{OpKind::AdamW, 1 << 20};        // 28 MiB moved
  const Op gemm{OpKind::GemmForward, 64, 64, 64};  // compute-bound
  const double bw = 10e9;
  SharedMemoryCosts alone(inner, bw, 1), two(inner, bw, 2);
  CHECK(alone.seconds(adam, 4) == inner.seconds(adam, 4));
  const double floor2 = 2 * DeviceModelCosts::bytes_moved(adam, 4) / bw;
  CHECK(two.seconds(adam, 4) == Approx(std::max(inner.seconds(adam, 4), floor2)));
  CHECK(two.seconds(gemm, 4) == Approx(std::max(inner.seconds(gemm, 4),
                                                2 * DeviceModelCosts::bytes_moved(gemm, 4) / bw)));
  CHECK_THAT(two.describe(), Catch::Contains("shared by 2 ranks"));
}

TEST_CASE("sim: data-parallel buckets, overlapped or after the backward", "[sim]") {
  FakeCosts costs;
  cluster::Cluster slow = cluster::parse_cluster(
      "nodes: 1\ndevices_per_node: 8\n"
      "device: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 16, hbm_GBps: 1}\n"
      "intra: {bandwidth_GBps: 0.01, latency_us: 100}\n",
      "slow.yaml");
  const RunConfig plain = run({"parallel.dp=2", "parallel.bucket_mb=0.05", "parallel.overlap=false"});
  const RunConfig over = run({"parallel.dp=2", "parallel.bucket_mb=0.05"});
  const RankWork rw = rank_work(plain, 0);
  REQUIRE(rw.buckets.size() > 2);
  double compute = 0;
  for (int64_t mb = 0; mb < plain.accum_steps(); ++mb)
    compute += pass_sum(rw.chunks[0].forward, costs) + pass_sum(rw.chunks[0].backward, costs);
  double reduce = 0, elems = 0;
  for (const BucketWork& b : rw.buckets) {
    reduce += cluster::collective_time(slow, cluster::Collective::AllReduce, {0, 1}, b.bytes);
    elems += b.bytes / 4;
  }
  CHECK(elems == Approx(rw.param_elems));  // every gradient is in one bucket
  const double steps = 2 * cluster::collective_time(slow, cluster::Collective::AllReduce, {0, 1}, 8);
  const SimResult a = simulate_step(plain, slow, costs);
  CHECK(a.step_time_s == Approx(compute + reduce + steps).epsilon(1e-9));
  CHECK(a.exposed_dp_s == Approx(reduce).epsilon(1e-9));
  const SimResult b = simulate_step(over, slow, costs);
  CHECK(b.step_time_s < a.step_time_s);
  CHECK(b.step_time_s >= (compute + steps) * (1 - 1e-12));
  CHECK(b.exposed_dp_s < reduce);
}

TEST_CASE("sim: a slow rank and the homogeneous shortcut", "[sim]") {
  FakeCosts costs;
  const RunConfig cfg = run({"parallel.dp=2", "parallel.pp=2", "parallel.tp=2"});
  const SimResult even = simulate_step(cfg, fast(), costs);
  SimOptions all;
  all.all_replicas = true;
  const SimResult every = simulate_step(cfg, fast(), costs, all);
  CHECK(every.units_simulated == 4);
  CHECK(even.units_simulated == 2);
  CHECK(every.step_time_s == Approx(even.step_time_s).epsilon(1e-12));
  // World rank 5 (tp 1, dp 0, pp 1) three times slower: its tp group is, and
  // the pipeline's last stage with it; about twice the step at least.
  SimOptions slow;
  slow.slow_ranks[5] = 3;
  const SimResult s = simulate_step(cfg, fast(), costs, slow);
  CHECK(s.step_time_s > 1.8 * even.step_time_s);
  CHECK(s.step_time_s < 3.0 * even.step_time_s);
}

TEST_CASE("sim: mixture of experts, recompute and errors", "[sim]") {
  FakeCosts costs;
  const RunConfig moe = run({"model.n_experts=4", "model.moe_top_k=2", "parallel.dp=4", "parallel.ep=2"});
  cluster::Cluster c = fast();
  c.intra.bandwidth = 1e8;
  const SimResult r = simulate_step(moe, c, costs);
  CHECK(r.exposed_ep_s > 0);
  CHECK(r.step_time_s > r.exposed_ep_s);
  const double none = simulate_step(run({}), fast(), costs).compute_s;
  const double sel = simulate_step(run({"train.recompute=selective"}), fast(), costs).compute_s;
  const double full = simulate_step(run({"train.recompute=full"}), fast(), costs).compute_s;
  CHECK(none < sel);
  CHECK(sel < full);
  cluster::Cluster small = fast();
  small.devices_per_node = 2;
  CHECK_THROWS_WITH(simulate_step(run({"parallel.dp=4"}), small, costs),
                    Contains("the layout needs 4 ranks (tp*cp*pp*dp) but cluster custom has 2 devices"));
}

TEST_CASE("sim: the MoE load model and the expert placement", "[sim]") {
  FakeCosts costs;
  cluster::Cluster c = fast();
  c.intra.bandwidth = 1e8;
  const RunConfig moe = run({"model.n_experts=4", "model.moe_top_k=2", "parallel.dp=4", "parallel.ep=2"});
  const SimResult even = simulate_step(moe, c, costs);
  SimOptions uniform;
  uniform.work.expert_load = {1, 1, 1, 1};  // normalised: the default
  CHECK(simulate_step(moe, c, costs, uniform).step_time_s == Approx(even.step_time_s).epsilon(1e-12));
  // Skewed routing: the busiest ep rank runs more tokens and receives more rows.
  SimOptions skew;
  skew.work.expert_load = zipf_load(4, 1.5);
  const SimResult s = simulate_step(moe, c, costs, skew);
  CHECK(s.compute_s > even.compute_s);
  CHECK(s.exposed_ep_s > even.exposed_ep_s);
  // Under that skew, pairing the heaviest expert with the lightest on one rank
  // ([0, 1, 1, 0]) balances the ranks better than the contiguous blocks.
  const RunConfig paired = run({"model.n_experts=4", "model.moe_top_k=2", "parallel.dp=4",
                                "parallel.ep=2", "parallel.expert_placement=[0,1,1,0]"});
  CHECK(simulate_step(paired, c, costs, skew).step_time_s < s.step_time_s);
  CHECK(simulate_step(paired, c, costs).step_time_s == Approx(even.step_time_s).epsilon(1e-12));
  SimOptions bad;
  bad.work.expert_load = {1, 1};
  CHECK_THROWS_WITH(simulate_step(moe, c, costs, bad),
                    Contains("the expert load has 2 entries but model.n_experts=4"));
}

TEST_CASE("sim: a long step ends and scales with its op times", "[sim]") {
  // 256 micro-batches on one rank, like llama-34b's dry run on one GPU (its
  // step ~2e4 s): far from t = 0 a compute's end, now + remaining, rounds to a
  // multiple of ulp(now) > 1e-12 s, and the event loop once stalled there
  // forever (the residual work left above its tolerance, the next event at now).
  const RunConfig cfg = run({"train.global_batch=512"});
  REQUIRE(cfg.accum_steps() == 256);
  const std::optional<SimResult> ref = simulate_within(cfg, fast(), 1, 10);
  REQUIRE(ref);
  for (const double scale : {1024.0, 65536.0, 1048576.0}) {
    INFO("op times x " << scale);
    const std::optional<SimResult> r = simulate_within(cfg, fast(), scale, 10);
    REQUIRE(r);  // ends (in milliseconds; 10 s is the watchdog)
    CHECK(r->step_time_s > 1e4);
    CHECK(r->step_time_s == Approx(scale * ref->step_time_s).epsilon(1e-12));
    CHECK(r->compute_s == Approx(scale * ref->compute_s).epsilon(1e-12));
    CHECK(r->events == ref->events);
  }
}

// The simulator runs the trainer's op list: with train.fused_projections
// (the default) one q/k/v and one gate/up GEMM per layer in each of the
// forward, input gradient and weight gradient, against five unfused; the
// same GEMM FLOPs either way.
TEST_CASE("sim: fused projections are two GEMMs of the same FLOPs", "[sim]") {
  auto count = [](const RunConfig& cfg, double& gemm_flops) {
    const RankWork rw = rank_work(cfg, 0);
    int64_t n = 0;
    gemm_flops = 0;
    for (const PassWork* p : {&rw.chunks[0].forward, &rw.chunks[0].backward})
      for (const Piece& piece : p->pieces)
        for (const Op& op : piece.ops)
          if (op.kind == OpKind::GemmForward || op.kind == OpKind::GemmInputGrad ||
              op.kind == OpKind::GemmWeightGrad) {
            ++n;
            gemm_flops += op.flops();
          }
    return n;
  };
  for (const char* moe : {"model.n_experts=0", "model.n_experts=4"}) {
    INFO(moe);
    double ff = 0, fu = 0;
    const int64_t fused = count(run({moe}), ff);
    const int64_t unfused = count(run({moe, "train.fused_projections=false"}), fu);
    const RunConfig cfg = run({moe});
    // Per layer: q/k/v 3 -> 1 and gate/up 2 -> 1 GEMMs in each of the three
    // products (an MoE layer: gate/up per expert of the busiest rank).
    int64_t saved = 0;
    for (int64_t l = 0; l < cfg.model.n_layers; ++l)
      saved += 3 * (2 + (cfg.model.is_moe_layer(l) ? int64_t(cfg.model.n_experts) : 1));
    CHECK(unfused - fused == saved);
    CHECK(ff == Approx(fu).epsilon(1e-12));
  }
}

TEST_CASE("sim: a slow pipeline link slows the messages that cross it", "[sim]") {
  FakeCosts costs;
  // One activation message (2 x 32 x 64 fp32 = 16 KiB) takes ~1 ms.
  const cluster::Cluster cl = cluster::parse_cluster(
      "nodes: 1\ndevices_per_node: 8\n"
      "device: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 16, hbm_GBps: 1}\n"
      "intra: {bandwidth_GBps: 0.016, latency_us: 0}\n",
      "slow-links.yaml");
  const RunConfig cfg = run({"parallel.pp=2", "parallel.dp=2"});
  const SimResult even = simulate_step(cfg, cl, costs);
  // Replica 0's two stages.
  const int a = rank_of(layout_of(cfg), RankCoords{0, 0, 0}),
            b = rank_of(layout_of(cfg), RankCoords{0, 0, 1});
  SimOptions slow;
  slow.slow_links[{std::min(a, b), std::max(a, b)}] = 8;
  const SimResult s = simulate_step(cfg, cl, costs, slow);
  const double msg = cluster::message_time(cl, a, b, 2.0 * 32 * 64 * 4);
  CHECK(msg > 5e-4);
  // At least the first micro-batch's activation and the last one's gradient
  // wait 7 more message times each.
  CHECK(s.step_time_s > even.step_time_s + 2 * 7 * msg * 0.99);
  // A link no pipeline message crosses (the two replicas' first stages) changes nothing.
  SimOptions other;
  const int c = rank_of(layout_of(cfg), RankCoords{0, 1, 0});
  other.slow_links[{std::min(a, c), std::max(a, c)}] = 8;
  CHECK(simulate_step(cfg, cl, costs, other).step_time_s == Approx(even.step_time_s).epsilon(1e-12));
}

TEST_CASE("sim: a profile on the model clock costs the kernels' counted FLOPs, off the count", "[sim]") {
  // The CPU kernels' count (kernels/flop_counter.hpp) against the
  // simulator's own formula (Op::flops), and the profiling left off the
  // count the model clock times a rank's compute by.
  auto be = make_backend("cpu");
  sim::ProfileCosts pc(*be, "");
  pc.count_flops(1e9);
  const uint64_t before = gemm_flops_executed().load();
  for (const sim::Op op : {sim::Op{sim::OpKind::GemmForward, 64, 48, 32},
                           sim::Op{sim::OpKind::GemmWeightGrad, 48, 32, 64},
                           sim::Op{sim::OpKind::GemmInputGrad, 64, 32, 48}}) {
    INFO(sim::to_string(op));
    CHECK(pc.seconds(op, 4) == Approx(op.flops() / 1e9).epsilon(1e-12));
  }
  CHECK(gemm_flops_executed().load() == before);
  CHECK(pc.seconds(sim::Op{sim::OpKind::RmsNormForward, 64, 32}, 4) == 0);  // no matmul: free
}

TEST_CASE("sim: the profile cache: thread counts apart, saves merged, the default path", "[sim]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("adgt-profile-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cache = (dir / "p.json").string();
  auto be = make_backend("cpu");
  const sim::Op a{sim::OpKind::GemmForward, 32, 32, 32}, b{sim::OpKind::Add, 4096};
  {
    ScopedCpuThreads one(1);
    sim::ProfileCosts pc(*be, cache, 0.001, 0);
    (void)pc.seconds(a, 4);
    CHECK(pc.has(a, 4));
    {
      ScopedCpuThreads two(2);
      CHECK_FALSE(pc.has(a, 4));  // another thread count: another entry
      (void)pc.seconds(a, 4);
      CHECK(pc.has(a, 4));
    }
    CHECK(pc.measured() == 2);
    // Another process saves its op meanwhile: both are kept.
    sim::ProfileCosts other(*be, cache, 0.001, 0);
    (void)other.seconds(b, 4);
    other.save();
    pc.save();
  }
  {
    ScopedCpuThreads one(1);
    sim::ProfileCosts again(*be, cache, 0.001, 0);
    CHECK(again.has(a, 4));
    CHECK(again.has(b, 4));
    bool announced = false;
    again.on_first_measure([&] { announced = true; });
    (void)again.seconds(a, 4);
    CHECK_FALSE(announced);  // read, not measured
    (void)again.seconds(sim::Op{sim::OpKind::Add, 8192}, 4);
    CHECK(announced);
    CHECK(again.measured() == 1);
  }
  // The default path: ADGT_PROFILE_CACHE, else XDG_CACHE_HOME/adgt.
  const char* had = std::getenv("ADGT_PROFILE_CACHE");
  const std::string was = had ? had : "";
  ::unsetenv("ADGT_PROFILE_CACHE");
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const std::string def = sim::default_profile_cache();
  CHECK(def.rfind((dir / "adgt" / "op-profile-").string(), 0) == 0);
  CHECK(def == sim::default_profile_cache());  // stable for this binary and machine
  ::setenv("ADGT_PROFILE_CACHE", "off", 1);
  CHECK(sim::default_profile_cache().empty());
  if (had) ::setenv("ADGT_PROFILE_CACHE", was.c_str(), 1);
  else ::unsetenv("ADGT_PROFILE_CACHE");
  ::unsetenv("XDG_CACHE_HOME");
  fs::remove_all(dir);
}

TEST_CASE("sim: rank threads: OMP_NUM_THREADS, else the host's cores over its ranks", "[sim]") {
  const char* had = std::getenv("OMP_NUM_THREADS");
  const std::string was = had ? had : "";
  const char* had_ob = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string was_ob = had_ob ? had_ob : "";
  ::unsetenv("OPENBLAS_NUM_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
  CHECK(rank_threads(2, 8).threads == 4);
  CHECK_FALSE(rank_threads(2, 8).from_env);
  CHECK(rank_threads(2, 8).why == "8 cores / 2 ranks on this host");
  CHECK(rank_threads(4, 2).threads == 1);  // never below one
  CHECK(rank_threads(1, 2).threads == 2);
  ::setenv("OMP_NUM_THREADS", "3,1", 1);  // nested levels: the first
  CHECK(rank_threads(2, 8).threads == 3);
  CHECK(rank_threads(2, 8).from_env);
  ::setenv("OMP_NUM_THREADS", "zero", 1);  // not a count: ignored
  CHECK(rank_threads(2, 8).threads == 4);
  ::unsetenv("OMP_NUM_THREADS");
  ::setenv("OPENBLAS_NUM_THREADS", "2", 1);
  CHECK(rank_threads(1, 8).threads == 2);
  if (had_ob) ::setenv("OPENBLAS_NUM_THREADS", was_ob.c_str(), 1);
  else ::unsetenv("OPENBLAS_NUM_THREADS");
  if (had) ::setenv("OMP_NUM_THREADS", was.c_str(), 1);
  // Bound by the launcher to fewer cores than the host's (here: this thread
  // to its first allowed core): at most those.
  cpu_set_t was_set, one;
  CPU_ZERO(&was_set);
  REQUIRE(sched_getaffinity(0, sizeof(was_set), &was_set) == 0);
  if (CPU_COUNT(&was_set) > 1) {
    int first = 0;
    while (!CPU_ISSET(first, &was_set)) ++first;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
    ::unsetenv("OMP_NUM_THREADS");
    const RankThreads bound = rank_threads(1);
    CHECK(bound.threads == 1);
    CHECK_THAT(bound.why, Contains("at most the 1 this rank is bound to"));
    REQUIRE(sched_setaffinity(0, sizeof(was_set), &was_set) == 0);
    if (had) ::setenv("OMP_NUM_THREADS", was.c_str(), 1);
  }
  // ScopedCpuThreads sets and restores.
  const int before = omp_get_max_threads();
  {
    ScopedCpuThreads t(before + 1);
    CHECK(omp_get_max_threads() == before + 1);
  }
  CHECK(omp_get_max_threads() == before);
}

TEST_CASE("sim: context parallelism, the rank's tokens, the ring's exposure and the all-to-alls",
          "[sim][cp]") {
  FakeCosts costs;
  // One K/V block of cp2 (2 x 16 tokens x 4 KV heads x 8 x 4 bytes, K and
  // V: 8 KiB) takes ~8 ms, longer than a ring step's four 1 ms ops.
  const cluster::Cluster cl = cluster::parse_cluster(
      "nodes: 1\ndevices_per_node: 8\n"
      "device: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 16, hbm_GBps: 1}\n"
      "intra: {bandwidth_GBps: 0.001, latency_us: 10}\n",
      "slow-cp.yaml");
  const int64_t B = 2, T = 32, KV = 4, hd = 8, L = 8;
  for (int cp : {2, 4}) {
    INFO("cp " << cp);
    const RunConfig cfg = run({"parallel.cp=" + std::to_string(cp)});
    const RankWork rw = rank_work(cfg, 0);
    const StageWork& st = rw.chunks[0];
    // Per token the rank's T / cp tokens: the first projection's rows.
    const Piece& a0 = st.forward.pieces[1];  // after the embedding: layer 0's attention
    REQUIRE(!a0.ops.empty());
    // The ring block by block: step 0 two causal diagonal blocks and one
    // full one, each later step two full ones; no whole-sequence attention.
    int whole = 0, causal = 0, blocks = 0;
    std::vector<const CommOp*> hops;
    for (const Op& op : a0.ops) {
      if (op.kind == OpKind::GemmForward) CHECK(op.a == B * T / cp);
      if (op.kind == OpKind::AttentionForward) ++whole;
      if (op.kind == OpKind::AttentionBlockForward) {
        ++blocks;
        causal += op.causal;
        CHECK((op.a == B && op.b == T / cp / 2 && op.c == 8 && op.d == KV && op.e == hd));
      }
    }
    for (const CommOp& c : a0.comms)
      if (c.kind == cluster::Collective::RingShift) hops.push_back(&c);
    CHECK(whole == 0);
    CHECK(causal == 2);
    CHECK(blocks == 3 + 2 * (cp - 1));
    // Step 0's hop beside the own three blocks, steps 1 .. cp-2's beside two.
    REQUIRE(hops.size() == size_t(cp > 2 ? 2 : 1));
    const CommOp* hop = hops[0];
    CHECK(hop->group == Group::cp);
    CHECK(hop->repeat == 1);
    CHECK(hop->hide.size() == 4);
    if (cp > 2) CHECK(hops[1]->repeat == cp - 2);
    const double kv = 2.0 * B * (T / cp) * KV * hd * 4;
    CHECK(hop->bytes == kv);
    // The step's exposed cp time: per layer and micro-batch, the forward's
    // cp - 1 hops less the step each hides; the backward's first K/V hop
    // less the own full block, then per step what travels in it (the next
    // K/V at steps 1..cp-2, the previous accumulator at steps 2..cp-1) less
    // the step, and the last accumulator's hop home less the own two causal
    // blocks (parallel/cp/ring_attention.hpp).
    std::vector<int> ring;
    for (int r = 0; r < cp; ++r) ring.push_back(r);
    auto hop_s = [&](double bytes) {
      double t = 0;
      for (int r = 0; r < cp; ++r) t = std::max(t, cluster::message_time(cl, r, (r + 1) % cp, bytes));
      return t;
    };
    CHECK(cluster::collective_time(cl, cluster::Collective::RingShift, ring, kv) == hop_s(kv));
    // FakeCosts: 1 ms an op plus its FLOPs at 1e15/s; a causal block is
    // half a full one; each step's merges and dK/dV additions are ops too.
    auto block = [&](OpKind k, bool causal_mask) {
      Op o{k, B, T / cp / 2, 8, KV, hd};
      o.causal = causal_mask;
      return 1e-3 + o.flops() * 1e-15;
    };
    const OpKind bf = OpKind::AttentionBlockForward, bb = OpKind::AttentionBlockBackward;
    const double hide_f = 2e-3 + 2 * block(bf, false), hide_b = 2e-3 + 2 * block(bb, false);
    const double own_f = 1e-3 + block(bf, false) + 2 * block(bf, true);
    const double full_b = 1e-3 + block(bb, false), causal_b = 2e-3 + 2 * block(bb, true);
    double back = std::max(0.0, hop_s(kv) - full_b) + std::max(0.0, hop_s(kv) - causal_b);
    for (int s = 1; s < cp; ++s)
      if (const int n = (s < cp - 1) + (s >= 2); n > 0) back += std::max(0.0, hop_s(n * kv) - hide_b);
    const double per_layer = std::max(0.0, hop_s(kv) - own_f) +
                             (cp - 2) * std::max(0.0, hop_s(kv) - hide_f) + back;
    REQUIRE(hop_s(kv) > hide_f);
    const SimResult r = simulate_step(cfg, cl, costs);
    CHECK(r.exposed_cp_s == Approx(per_layer * L * cfg.accum_steps()).epsilon(1e-9));
    CHECK(r.step_time_s > r.exposed_cp_s);
    // The gradients over dp x cp: the buckets' group.
    for (const BucketWork& b : rw.buckets) CHECK(b.group == Group::dpcp);
  }
  // All-to-all: q, k, v out and the output back (forward), the backward's
  // five tensors out and three back; the attention over the whole sequence
  // on heads / cp.
  const RunConfig a2a = run({"parallel.cp=2", "parallel.cp_mode=all-to-all"});
  const RankWork rw = rank_work(a2a, 0);
  const Piece& a0 = rw.chunks[0].forward.pieces[1];
  const double row = double(B * T / 2) * hd * 4;
  std::vector<double> bytes;
  for (const CommOp& c : a0.comms)
    if (c.group == Group::cp) {
      CHECK(c.kind == cluster::Collective::AllToAll);
      bytes.push_back(c.bytes);
    }
  CHECK(bytes == std::vector<double>{row * (8 + 2 * KV), row * 8});
  bool whole = false;
  for (const Op& op : a0.ops)
    if (op.kind == OpKind::AttentionForward) whole = op.b == T && op.c == 4 && op.d == KV / 2;
  CHECK(whole);
  CHECK(simulate_step(a2a, cl, costs).exposed_cp_s > 0);
}

TEST_CASE("sim: a capacity whose groups span cp's chunks gathers the run counts over cp",
          "[sim][cp][moe]") {
  const int64_t B = 2, E = 4;
  // One MoE forward piece's cp all-gathers: bytes of each.
  auto gathers = [](const RunConfig& cfg) {
    std::vector<double> out;
    for (const Piece& p : rank_work(cfg, 0).chunks[0].forward.pieces)
      for (const CommOp& c : p.comms)
        if (c.group == Group::cp && c.kind == cluster::Collective::AllGather) out.push_back(c.bytes);
    return out;
  };
  const std::vector<std::string> moe = {"model.n_experts=4", "model.moe_top_k=2",
                                        "model.moe_capacity_factor=1.0", "parallel.cp=2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> sets = moe;
    sets.insert(sets.end(), more.begin(), more.end());
    return run(sets);
  };
  const RunConfig whole = with({});
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < whole.model.n_layers; ++l) moe_layers += whole.model.is_moe_layer(l);
  REQUIRE(moe_layers > 0);
  // Whole micro-batch groups at cp2: chunks of 8 tokens, 2 B runs of 8 per
  // rank, each [start, E counts] in f64, gathered from both ranks.
  const double bytes = 2.0 * (B * 2) * (E + 1) * 8;
  CHECK(gathers(whole) == std::vector<double>(size_t(moe_layers), bytes));
  // A segment of two chunks: the same runs; one inside a chunk, or
  // dropless, or cp1: none.
  CHECK(gathers(with({"model.moe_capacity_segment=16"})) == std::vector<double>(size_t(moe_layers), bytes));
  CHECK(gathers(with({"model.moe_capacity_segment=8"})).empty());
  CHECK(gathers(with({"model.moe_capacity_factor=0"})).empty());
  CHECK(gathers(with({"parallel.cp=1"})).empty());
}

TEST_CASE("sim: ZeRO-2 and ZeRO-3 move every unit's gradient and (3) weights in the passes",
          "[sim][zero]") {
  FakeCosts costs;
  // 8 layers, the embedding and the head: 10 units.
  const int64_t n_units = 10;
  double unit_sum = 0;  // every unit's elements once
  {
    const RankWork rw = rank_work(run({"parallel.dp=4"}), 0);
    unit_sum = rw.param_elems;
    REQUIRE(!rw.buckets.empty());  // zero 0: the bucketed all-reduce
  }
  for (int zero : {2, 3}) {
    INFO("zero " << zero);
    const RunConfig cfg = run({"parallel.dp=4", "parallel.zero=" + std::to_string(zero)});
    const RankWork rw = rank_work(cfg, 0);
    CHECK(rw.buckets.empty());  // the store reduces, in the passes
    const StageWork& st = rw.chunks[0];
    double gathered_f = 0, gathered_b = 0, scattered = 0;
    int gathers_f = 0, gathers_b = 0;
    for (const Piece& p : st.forward.pieces)
      for (const CommOp& c : p.comms)
        if (c.group == Group::dp && c.kind == cluster::Collective::AllGather) gathered_f += c.bytes, ++gathers_f;
    for (const Piece& p : st.backward.pieces)
      for (const CommOp& c : p.comms) {
        if (c.group != Group::dp) continue;
        if (c.kind == cluster::Collective::AllGather) gathered_b += c.bytes, ++gathers_b;
        if (c.kind == cluster::Collective::ReduceScatter) scattered += c.bytes;
        for (const auto& [k, b] : c.with)
          if (k == cluster::Collective::ReduceScatter) scattered += b;
      }
    // Every unit's fp32 gradient reduce-scattered once a micro-batch.
    CHECK(scattered == Approx(unit_sum * 4));
    if (zero == 3) {
      CHECK(gathers_f == n_units);     // every unit before its forward
      CHECK(gathers_b == n_units - 2);  // the head and the prefetched unit kept from the forward
      CHECK(gathered_f == Approx(unit_sum * 4));
    } else {
      CHECK(gathers_f + gathers_b == 0);
    }
    // The weights after the update: ZeRO-2 gathers them, ZeRO-3 keeps its shard.
    int after = 0;
    for (const CommOp& c : rw.step_comms)
      if (c.kind == cluster::Collective::AllGather && c.when == CommOp::AfterUpdate) ++after;
    CHECK(after == (zero == 2 ? 1 : 0));
  }
  // On a slow link the prefetch hides gathers behind the units before them:
  // the exposed data-parallel time falls with the depth, and is zero on a
  // fast link.
  const cluster::Cluster slow = cluster::parse_cluster(
      "nodes: 1\ndevices_per_node: 8\n"
      "device: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 16, hbm_GBps: 1}\n"
      "intra: {bandwidth_GBps: 0.01, latency_us: 10}\n",
      "slow-dp.yaml");
  std::vector<double> exposed;
  for (int p : {0, 1, 2}) {
    const RunConfig cfg = run({"parallel.dp=4", "parallel.zero=3", "parallel.zero3_prefetch=" + std::to_string(p)});
    exposed.push_back(simulate_step(cfg, slow, costs).exposed_dp_s);
    CHECK(simulate_step(cfg, fast(), costs).exposed_dp_s == Approx(0).margin(1e-6));
  }
  CHECK(exposed[0] > exposed[1]);
  CHECK(exposed[1] > exposed[2]);
  CHECK(exposed[2] > 0);
}
