// The emulation's single-process parts (docs/emulation.md): emulate.* keys
// and their errors, the compute slowdown hook's rule, EmulatedComm on a group
// of one, and the set-up of a single process. The multi-rank delays are
// tests/emulate/ (ctest emulate_*).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <time.h>
#include <unistd.h>

#include "core/config.hpp"
#include "kernels/backend.hpp"
#include "parallel/emulate/clock.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/comm/mpi_env.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

std::string config_error(const std::string& yaml, const std::vector<std::string>& ov = {}) {
  try {
    load_config_text(yaml, "x.yaml", ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Every spec of `bad` ({spec, message}) is refused by parse with a
// ConfigError naming `key` and holding the message and `expected`.
using Refusals = std::vector<std::pair<const char*, const char*>>;
template <class Parse>
void check_refused(Parse&& parse, const Refusals& bad, const std::string& key, const std::string& expected) {
  for (const auto& [spec, msg] : bad) {
    INFO(spec);
    try {
      parse(spec);
      FAIL("no error");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Contains(key + ": ") && Contains(msg) && Contains(expected));
    }
  }
}

void busy_for(double s) {
  const double end = wall_seconds() + s;
  while (wall_seconds() < end) {
  }
}

}  // namespace

TEST_CASE("emulate.slow_ranks: rank:factor pairs", "[emulate]") {
  using V = std::vector<std::pair<int64_t, double>>;
  CHECK(parse_slow_ranks("") == V{});
  CHECK(parse_slow_ranks("3:2.0,5:1.5") == V{{3, 2.0}, {5, 1.5}});
  CHECK(parse_slow_ranks(" 1 : 3 ") == V{{1, 3.0}});
  CHECK(parse_slow_ranks("0:1") == V{{0, 1.0}});
  check_refused([](const char* spec) { parse_slow_ranks(spec); },
                Refusals{
      {"1-3", "entry 1 \"1-3\" has no ':'"},
      {"a:2", "entry 1 \"a:2\": the rank is not a non-negative integer"},
      {"-1:2", "the rank is not a non-negative integer"},
      {"1:x", "entry 1 \"1:x\": the factor is not a number"},
      {"1:", "the factor is not a number"},
      {"1:0.5", "factor 0.5 < 1"},
      {"1:2,1:3", "entry 2 \"1:3\": rank 1 is given twice"},
      {"1:2,", "a trailing ','"},
      {"1:2,,2:2", "entry 2 \"\" has no ':'"},
                },
                "emulate.slow_ranks", "expected \"rank:factor[@step],...\"");
}

TEST_CASE("emulate.slow_links: a-b:factor[@step] entries", "[emulate]") {
  const std::vector<SlowLink> l = parse_slow_links(" 1-2:4@30, 3 - 0 : 2.5");
  REQUIRE(l.size() == 2);
  CHECK((l[0].a == 1 && l[0].b == 2 && l[0].factor == 4 && l[0].from_step == 30));
  CHECK((l[1].a == 0 && l[1].b == 3 && l[1].factor == 2.5 && l[1].from_step == 0));  // ordered pair
  CHECK(parse_slow_links("").empty());
  check_refused([](const char* spec) { parse_slow_links(spec); },
                Refusals{
      {"1-2", "entry 1 \"1-2\" has no ':'"},
      {"1:2", "the link is not \"a-b\""},
      {"1:2-3@4", "entry 1 \"1:2-3@4\": the link is not \"a-b\""},
      {"1-x:2", "a rank of the link is not a non-negative integer"},
      {"2-2:3", "rank 2 is linked to itself"},
      {"1-2:0.5", "factor 0.5 < 1"},
      {"1-2:x", "the factor is not a number"},
      {"1-2:2@x", "the step after '@' is not a non-negative integer"},
      {"1-2:2,2-1:3", "entry 2 \"2-1:3\": link 2-1 is given twice"},
      {"1-2:2,", "a trailing ','"},
                },
                "emulate.slow_links", "expected \"a-b:factor[@step],...\"");
  CHECK_THAT(config_error("", {"emulate.slow_links=0-1:2"}),
             Contains("x.yaml, --set emulate.slow_links=0-1:2: emulate.slow_links=\"0-1:2\" needs emulate.cluster"));
  CHECK_THAT(config_error("emulate:\n  cluster: cpu-here\n  slow_links: \"0-1:0\"\n"),
             Contains("x.yaml:3: emulate.slow_links: entry 1 \"0-1:0\": factor 0 < 1"));

  // Rank 1's links at each step boundary: to rank 2 from step 30, to rank 0
  // from the start; rank 3's entry is not rank 1's.
  // (setup_emulation maps launcher ranks to world ranks; one process here
  // has one rank, so the run's Emulation is built by hand.)
  RunConfig one;
  one.emulate.cluster = "cpu-here";
  one.emulate.slow_links = "0-1:2";
  CHECK_THROWS_WITH(emulate::setup_emulation(one, nullptr, 0),
                    Contains("emulate.slow_links: link 0-1 names a rank outside the run's 1 ranks"));
  auto emu = std::make_unique<emulate::Emulation>();
  emu->cluster = cluster::load_cluster("cpu-here");
  emu->world = 4;
  emu->world_rank = 1;
  emu->state = std::make_shared<emulate::EmulatedRank>(emu->cluster, 1);
  emu->slow_links = {{1, 2, 4, 30}, {0, 1, 2, 0}, {2, 3, 8, 0}};
  CHECK_THAT(emu->summary(), Contains("link 1-2 x4 slower from step 30") && Contains("link 0-1 x2 slower"));
  emu->at_step(29);
  CHECK(emu->state->link_slowdown == std::map<int, double>{{0, 2.0}});
  emu->at_step(30);
  CHECK(emu->state->link_slowdown == std::map<int, double>{{0, 2.0}, {2, 4.0}});
  // Link times taken per group, as differences since the last take; the
  // totals stay for other readers.
  emu->state->link_in[{"pp", 0}] = {0.5, 2, 64};
  emu->state->link_in[{"dp", 1}] = {0.25, 1, 32};
  const auto pp = emu->take_link_times("pp");
  REQUIRE(pp.size() == 1);
  CHECK((pp.at(0).seconds == 0.5 && pp.at(0).messages == 2));
  CHECK(emu->take_link_times("pp").empty());
  emu->state->link_in[{"pp", 0}] = {0.75, 3, 96};  // one more message, of 0.25 s
  const auto more = emu->take_link_times("pp");
  REQUIRE(more.size() == 1);
  CHECK((more.at(0).seconds == 0.25 && more.at(0).messages == 1 && more.at(0).bytes == 32));
  CHECK((emu->link_totals("pp").at(0).messages == 3 && emu->link_totals("dp").at(1).messages == 1));
}

TEST_CASE("emulate keys: off by default, checked with the file's line", "[emulate][config]") {
  const RunConfig d = load_config_text("", "x.yaml");
  CHECK(d.emulate.cluster.empty());
  CHECK(d.emulate.slow_ranks.empty());
  const RunConfig c = load_config_text("emulate:\n  cluster: cpu-here\n  slow_ranks: \"0:2\"\n", "x.yaml");
  CHECK(c.emulate.cluster == "cpu-here");
  CHECK(c.emulate.slow_ranks == "0:2");
  CHECK(load_config_text(to_yaml(c), "y.yaml") == [&] {
    RunConfig r = c;
    r.source = "y.yaml";
    return r;
  }());
  CHECK_THAT(config_error("emulate:\n  cluster: cpu-here\n  slow_ranks: \"0:0.5\"\n"),
             Contains("x.yaml:3: emulate.slow_ranks: entry 1 \"0:0.5\": factor 0.5 < 1"));
  CHECK_THAT(config_error("", {"emulate.slow_ranks=0:2"}),
             Contains("x.yaml, --set emulate.slow_ranks=0:2: emulate.slow_ranks=\"0:2\" needs emulate.cluster"));
  CHECK_THAT(config_error("parallel:\n  dp: 2\ntrain:\n  global_batch: 16\n",
                          {"emulate.cluster=cpu-here", "emulate.slow_ranks=1:2,2:3"}),
             Contains("x.yaml, --set emulate.slow_ranks=1:2,2:3: emulate.slow_ranks=\"1:2,2:3\": "
                      "rank 2 is outside the run's 2 "
                      "ranks (tp x pp x dp); world ranks are 0..1"));
}

TEST_CASE("emulate.clock: wall by default; virtual needs the cluster and the cpu backend",
          "[emulate][config]") {
  CHECK(load_config_text("", "x.yaml").emulate.clock == "wall");
  CHECK(load_config_text("", "x.yaml", {"emulate.cluster=cpu-here", "emulate.clock=virtual"})
            .emulate.clock == "virtual");
  CHECK_THAT(config_error("", {"emulate.clock=virtual"}),
             Contains("x.yaml, --set emulate.clock=virtual: emulate.clock=virtual needs emulate.cluster"));
  CHECK_THAT(config_error("", {"emulate.cluster=cpu-here", "emulate.clock=virtual",
                               "train.device=emulated"}),
             Contains("emulate.clock=virtual needs train.device=cpu") && Contains("\"emulated\""));
  CHECK_THAT(config_error("emulate:\n  clock: cpu\n"), Contains("x.yaml:2") && Contains("emulate.clock"));
}

TEST_CASE("virtual clock: CPU time outside calls, nothing inside, waits jump", "[emulate]") {
  emulate::Clock c(emulate::ClockKind::Virtual);
  const auto cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  const double v0 = c.now(), c0 = cpu();
  busy_for(0.02);  // wall and CPU time
  const double used = cpu() - c0;
  CHECK(c.now() - v0 == Approx(used).margin(1e-3));
  const double v1 = c.now();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // no CPU: no time
  CHECK(c.now() - v1 < 5e-3);
  c.pause();  // inside an emulated call: its CPU time is dropped
  const double v2 = c.now();
  busy_for(0.02);
  CHECK(c.now() == v2);
  c.wait_until(v2 + 1.5);  // a wait jumps, it does not sleep
  CHECK(c.now() == v2 + 1.5);
  c.resume();
  CHECK(c.now() - (v2 + 1.5) < 5e-3);
  c.wait_until(0);  // never backwards
  CHECK(c.now() >= v2 + 1.5);
  // The wall clock is CLOCK_MONOTONIC.
  emulate::Clock w;
  const double w0 = wall_seconds(), x = w.now(), w1 = wall_seconds();
  CHECK(w0 <= x);
  CHECK(x <= w1);
}

TEST_CASE("model clock: counted matmul FLOPs at its rate outside calls, waits jump", "[emulate]") {
  emulate::Clock c(emulate::ClockKind::Model, 2e9);
  CHECK(c.is_virtual());
  const double v0 = c.now();
  busy_for(0.02);  // host time, wall and CPU: not the model clock's
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(c.now() == v0);
  count_gemm_flops(100, 200, 50);  // 2e6 FLOPs: 1 ms at 2e9 FLOP/s
  CHECK(c.now() - v0 == Approx(1e-3).epsilon(1e-12));
  // The count is the CPU kernels' own: a linear's forward adds 2 N O I.
  auto be = make_backend("cpu");
  std::vector<float> x(3 * 8, 1.0f), w(5 * 8, 0.5f), y(3 * 5);
  const double c0 = c.compute_now();
  be->linear_forward(Tensor(y.data(), DType::F32, {3, 5}), Tensor(x.data(), DType::F32, {3, 8}),
                     Tensor(w.data(), DType::F32, {5, 8}));
  // The count is process-wide: after other cases in the same process c0 is
  // large, and the difference carries c0's rounding (a few ulps of c0).
  CHECK(c.compute_now() - c0 ==
        Approx(2.0 * 3 * 5 * 8 / 2e9).epsilon(1e-12).margin(8 * 2.3e-16 * std::abs(c0)));
  CHECK(y[0] == 4.0f);
  c.pause();  // inside an emulated call: its FLOPs (none are expected) are dropped
  const double v1 = c.now();
  count_gemm_flops(1000, 1000, 1000);
  CHECK(c.now() == v1);
  c.wait_until(v1 + 0.5);
  CHECK(c.now() == v1 + 0.5);
  c.resume();
  CHECK(c.now() == v1 + 0.5);
  count_gemm_flops(10, 10, 10);  // 2000 FLOPs: 1 us
  CHECK(c.now() - (v1 + 0.5) == Approx(1e-6).epsilon(1e-9));
}

TEST_CASE("emulate.clock model: needs the cluster and a host backend", "[emulate]") {
  CHECK_THAT(config_error("emulate:\n  clock: model\n"),
             Contains("emulate.clock=model needs emulate.cluster"));
  CHECK_THAT(config_error("train:\n  device: cuda\nemulate:\n  cluster: cpu-here\n  clock: model\n"),
             Contains("emulate.clock=model needs train.device=cpu or emulated") && Contains("\"cuda\""));
  CHECK_THAT(config_error("emulate:\n  cluster: cpu-here\n  clock: model\n  model_flops: 0\n"),
             Contains("emulate.model_flops"));
  const RunConfig ok = load_config_text(
      "train:\n  device: emulated\nemulate:\n  cluster: cpu-here\n  clock: model\n  model_flops: 5e9\n", "x.yaml");
  CHECK(ok.emulate.clock == "model");
  CHECK(ok.emulate.model_flops == 5e9);
}

TEST_CASE("core tokens: at most `cores` held, a timed-out wait takes none", "[emulate]") {
  const std::string name = "/adgt-emu-unit-" + std::to_string(::getpid());
  auto a = std::make_shared<emulate::CoreTokens>(name, 2, true);
  emulate::CoreTokens b(name, 2, false);  // another rank opens it by name
  a->unlink();
  CHECK_THROWS_WITH(emulate::CoreTokens(name, 2, false), Contains(name));  // the name is gone
  CHECK(a->acquire(0.01));
  CHECK(b.acquire(0.01));
  const double t0 = wall_seconds();
  CHECK_FALSE(b.acquire(0.05));  // both taken
  CHECK(wall_seconds() - t0 >= 0.04);
  a->release();
  CHECK(b.acquire(0.01));
  // A clock hands its token back while it may block and takes it again after.
  b.release();
  b.release();
  emulate::Clock c(emulate::ClockKind::Virtual);
  c.set_tokens(a);
  c.reclaim_core();  // holds one
  CHECK(b.acquire(0.01));
  CHECK_FALSE(b.acquire(0.02));  // the clock holds the other
  {
    emulate::CoreYield y(c);
    CHECK(b.acquire(0.01));  // handed back
    b.release();
  }
  CHECK_FALSE(b.acquire(0.02));  // taken again
  emulate::Clock moved = std::move(c);  // the token moves with the clock
  CHECK_FALSE(b.acquire(0.02));
  moved.set_tokens(nullptr);  // gives it back
  CHECK(b.acquire(0.01));
}

TEST_CASE("compute slowdown: sleeps (factor - 1) x the compute, not the comm time", "[emulate]") {
  auto rank = std::make_shared<emulate::EmulatedRank>(cluster::load_cluster("cpu-here"), 0);
  emulate::ComputeSlowdown off;
  CHECK_FALSE(off.active());
  off.run([] { busy_for(0.005); });
  CHECK(off.slept_seconds() == 0);

  emulate::ComputeSlowdown slow(3, rank);
  // 10 ms of compute and 50 ms inside (pretend) emulated comm calls: at least
  // 20 ms of sleep (on the wall clock a loaded host only adds; the exact
  // figure is the model clock's, below).
  slow.run([&] {
    busy_for(0.010);
    const double c0 = wall_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rank->comm_seconds += wall_seconds() - c0;
  });
  CHECK(slow.slept_seconds() >= 2 * 0.010);

  // On the model clock: 1e7 counted FLOPs at 1e9 FLOP/s are 10 ms of
  // compute, a 50 ms emulated wait is comm: exactly 20 ms more, whatever the
  // host does meanwhile (120 ms if the comm counted as compute).
  auto model = std::make_shared<emulate::EmulatedRank>(cluster::load_cluster("cpu-here"), 0,
                                                       std::vector<int>{}, emulate::ClockKind::Model, 1e9);
  emulate::ComputeSlowdown on_model(3, model);
  CHECK(on_model.model_clock());
  const double m0 = model->clock.now();
  on_model.run([&] {
    count_gemm_flops(1000, 1000, 5);
    busy_for(0.005);  // host time: not the model clock's
    model->clock.pause();
    const double c0 = model->clock.now();
    model->clock.wait_until(c0 + 0.050);
    model->comm_seconds += model->clock.now() - c0;
    model->clock.resume();
  });
  CHECK(on_model.slept_seconds() == Approx(0.020).epsilon(1e-9));
  CHECK(model->clock.now() - m0 == Approx(0.010 + 0.050 + 0.020).epsilon(1e-9));

  // A gradient hook catches up before it runs; an empty one stays empty.
  CHECK_FALSE(slow.wrap({}));
  std::vector<double> slept_at_call;
  auto hook = slow.wrap([&](int64_t, int64_t) { slept_at_call.push_back(slow.slept_seconds()); });
  const double before = slow.slept_seconds();
  slow.begin();
  busy_for(0.005);
  hook(0, 1);
  REQUIRE(slept_at_call.size() == 1);
  CHECK(slept_at_call[0] - before >= 2 * 0.005);
}

TEST_CASE("EmulatedComm on a group of one passes every call through", "[emulate]") {
  // On the model clock: no delay means the clock does not move at all.
  auto rank = std::make_shared<emulate::EmulatedRank>(cluster::load_cluster("cpu-here"), 0,
                                                      std::vector<int>{}, emulate::ClockKind::Model, 1e9);
  SelfComm self("dp");
  emulate::EmulatedComm c(self, rank, {0});
  CHECK(c.name() == "dp");
  CHECK(c.size() == 1);
  const double v0 = rank->clock.now();
  std::vector<float> in = {1, 2, 3}, out(3);
  c.all_reduce(Tensor(in.data(), DType::F32, {3}));
  c.reduce_scatter(Tensor(out.data(), DType::F32, {3}), Tensor(in.data(), DType::F32, {3}));
  Work w = c.start_all_gather(Tensor(out.data(), DType::F32, {3}), Tensor(in.data(), DType::F32, {3}));
  w.wait();
  c.barrier();
  CHECK(rank->clock.now() == v0);  // nothing was delayed
  CHECK(out == in);
  CHECK(c.last_collective_end() == 0);  // nothing was delayed
  CHECK_THROWS_WITH(emulate::EmulatedComm(self, rank, {1}),
                    Contains("group rank 0 is world rank 1, but this process is world rank 0"));
  CHECK_THROWS_WITH(emulate::EmulatedComm(self, std::make_shared<emulate::EmulatedRank>(
                                                    cluster::load_cluster("cpu-here"), 9),
                                          {9}),
                    Contains("world rank 9 is outside the 8 devices of cluster cpu-here"));
}

TEST_CASE("setup_emulation: factors, the rank table's words, named errors", "[emulate]") {
  RunConfig cfg;
  CHECK(emulate::setup_emulation(cfg, nullptr, 0) == nullptr);  // off by default
  cfg.emulate.cluster = "cpu-here";
  cfg.emulate.slow_ranks = "0:2.5";
  auto emu = emulate::setup_emulation(cfg, nullptr, 0);
  REQUIRE(emu);
  CHECK(emu->factors == std::vector<double>{2.5});
  CHECK(emu->slowdown.factor() == 2.5);
  CHECK(emu->cell(0) == "node 0, compute x2.5");
  CHECK_THAT(emu->summary(), Contains("emulation: cluster cpu-here (preset:cpu-here) for 1 ranks: "
                                      "1 nodes x 8 devices; intra 4 GB/s 5 us") &&
                                 Contains("compute slowdown rank 0 x2.5"));
  // node_speed 0.5 doubles the factor; a node faster than real is refused.
  const std::string path = std::string(ADGT_BINARY_DIR) + "/emulate_speed_test.yaml";
  auto write = [&](const char* speed) {
    std::ofstream(path) << "name: speedy\nnodes: 1\ndevices_per_node: 2\nnode_speed: [" << speed
                        << "]\ndevice: {peak_bf16_tflops: 1, peak_fp32_tflops: 1, memory_gib: 1, "
                           "hbm_GBps: 1}\nintra: {bandwidth_GBps: 1, latency_us: 1}\n";
  };
  write("0.5");
  cfg.emulate.cluster = path;
  CHECK(emulate::setup_emulation(cfg, nullptr, 0)->factors == std::vector<double>{5.0});
  write("2");
  CHECK_THROWS_WITH(emulate::setup_emulation(cfg, nullptr, 0),
                    Contains("emulate.cluster=\"" + path + "\": node_speed[0]=2 > 1"));
  std::remove(path.c_str());
  cfg.emulate.cluster = "no-such-cluster";
  try {
    emulate::setup_emulation(cfg, nullptr, 0);
    FAIL("no error");
  } catch (const CollectiveError& e) {
    CHECK_THAT(e.what(), Contains("emulate.cluster=\"no-such-cluster\": cluster 'no-such-cluster' "
                                  "is neither a preset nor a readable file"));
  }
}

TEST_CASE("emulate.link_bandwidth: a bandwidth schedule of every link", "[emulate]") {
  using V = std::vector<std::pair<int64_t, double>>;
  CHECK(parse_link_bandwidth("") == V{});
  CHECK(parse_link_bandwidth("0.0005@20, 1@40") == V{{20, 0.0005}, {40, 1.0}});
  CHECK(parse_link_bandwidth("2@0") == V{{0, 2.0}});
  check_refused([](const char* spec) { parse_link_bandwidth(spec); },
                Refusals{
      {"0.5", "entry 1 \"0.5\" has no '@step'"},
      {"x@3", "the factor is not a number"},
      {"0@3", "factor 0 is not > 0"},
      {"-1@3", "factor -1 is not > 0"},
      {"1@-3", "the step after '@' is not a non-negative integer"},
      {"1@5,2@5", "entry 2 \"2@5\": step 5 does not come after step 5"},
      {"1@5,", "a trailing ','"},
                },
                "emulate.link_bandwidth", "");
  CHECK_THAT(config_error("", {"emulate.link_bandwidth=0.5@3"}),
             Contains("emulate.link_bandwidth=\"0.5@3\" needs emulate.cluster"));
  CHECK_THAT(config_error("emulate:\n  cluster: cpu-here\n  link_bandwidth: \"1@3,1@2\"\n"),
             Contains("x.yaml:3: emulate.link_bandwidth: entry 2"));

  // At each step boundary the rank's cluster takes the schedule's factor:
  // bandwidths scaled, latencies and the rest unchanged; back to the base.
  RunConfig cfg;
  cfg.emulate.cluster = "cpu-here";
  cfg.emulate.link_bandwidth = "0.25@3,1@5";
  auto emu = emulate::setup_emulation(cfg, nullptr, 0);
  REQUIRE(emu);
  const cluster::Cluster base = emu->state->cluster;
  CHECK_THAT(emu->summary(), Contains("links x0.25 bandwidth from step 3") &&
                                 Contains("links x1 bandwidth from step 5"));
  for (int64_t step = 0; step < 7; ++step) {
    emu->at_step(step);
    const cluster::Cluster& c = emu->state->cluster;
    const double f = step >= 3 && step < 5 ? 0.25 : 1.0;
    INFO("step " << step);
    CHECK(c.intra.bandwidth == base.intra.bandwidth * f);
    CHECK(c.inter.bandwidth == base.inter.bandwidth * f);
    CHECK(c.intra.latency == base.intra.latency);
    CHECK(c.device == base.device);
    // A message's time follows: 1 MB between two devices of node 0.
    CHECK(cluster::message_time(c, 0, 1, 1e6) - c.intra.latency ==
          Approx((cluster::message_time(base, 0, 1, 1e6) - base.intra.latency) / f));
  }
}
