// Asynchronous checkpoints in one process (core/checkpoint/async_save.hpp):
// the saver's files equal the synchronous save's, at most one save in flight,
// a failed background write leaves the previous checkpoint the newest, and
// abandoning a save leaves nothing behind. Several ranks: tests/checkpoint_async.cmake.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "core/checkpoint/async_save.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/model/shard_io.hpp"

using namespace adgt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_root(const std::string& name) {
  const fs::path p = fs::path(ADGT_BINARY_DIR) / "test_tmp" / ("checkpoint_async_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<ParamSpec> table() {
  ModelConfig m;
  m.vocab_size = 63;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.seq_len = 8;
  return build_param_table(m);
}

CheckpointState state(const std::vector<ParamSpec>& specs, int64_t step) {
  CheckpointState st;
  st.step = step;
  st.samples_seen = step * 16;
  st.seed = 77;
  st.config_yaml = "model: {}\n";
  st.specs = specs;
  st.state["trainer/opt_steps"] = StateEntry::of_ints({step});
  st.rank_state["compress/ef"] = StateEntry::of_floats({1.5f, -2.0f, float(step)});
  std::mt19937 rng(static_cast<uint32_t>(step));
  std::normal_distribution<float> nd;
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) {
    v->resize(size_t(total_numel(specs)));
    for (float& x : *v) x = nd(rng);
  }
  return st;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<std::string> entries(const fs::path& root) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(root)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("asynchronous save writes what the synchronous save writes", "[checkpoint]") {
  const fs::path sync_root = fresh_root("sync"), async_root = fresh_root("async");
  const auto specs = table();
  SelfComm world("world");
  ShardLayout lay;
  lay.description = "tp=1 dp=1 zero=0 sequence_parallel=0";
  save_checkpoint_sharded(sync_root.string(), state(specs, 12), lay, world, 0);

  AsyncCheckpointSaver saver;
  REQUIRE_FALSE(saver.start(state(specs, 12), lay, world, async_root.string(), 0));
  REQUIRE(saver.in_flight());
  std::optional<AsyncCheckpointSaver::Committed> c;
  for (int k = 0; k < 2000 && !c; ++k) {
    c = saver.poll(world);
    if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(c);
  REQUIRE_FALSE(saver.in_flight());
  REQUIRE(c->dir == (async_root / "step_12").string());
  REQUIRE(c->step == 12);
  REQUIRE(c->polls >= 1);
  REQUIRE(entries(async_root) == std::vector<std::string>{"step_12"});
  // The rank file holds the same datasets at the same offsets: bytes equal but
  // for HDF5's own metadata (timestamps), so compare the loaded state and the
  // per-rank state, and the marker byte for byte.
  REQUIRE(bytes_of(async_root / "step_12" / "COMPLETE") == bytes_of(sync_root / "step_12" / "COMPLETE"));
  const CheckpointState a = load_checkpoint(c->dir, specs), s = load_checkpoint((sync_root / "step_12").string(), specs);
  REQUIRE(a.params == s.params);
  REQUIRE(a.exp_avg == s.exp_avg);
  REQUIRE(a.exp_avg_sq == s.exp_avg_sq);
  REQUIRE(a.state == s.state);
  REQUIRE(load_rank_state(c->dir, 0) == load_rank_state((sync_root / "step_12").string(), 0));

  SECTION("a new save first commits the one in flight") {
    REQUIRE_FALSE(saver.start(state(specs, 13), lay, world, async_root.string(), 2));
    const auto prev = saver.start(state(specs, 14), lay, world, async_root.string(), 2);
    REQUIRE(prev);
    REQUIRE(prev->step == 13);
    const auto last = saver.finish(world);
    REQUIRE(last);
    REQUIRE(last->step == 14);
    REQUIRE(entries(async_root) == std::vector<std::string>{"step_13", "step_14"});  // keep 2
    REQUIRE_FALSE(saver.finish(world));
  }
}

TEST_CASE("a failed background write leaves the previous checkpoint the newest", "[checkpoint]") {
  const fs::path root = fresh_root("fail");
  const auto specs = table();
  SelfComm world("world");
  ShardLayout lay;
  AsyncCheckpointSaver saver;
  saver.start(state(specs, 12), lay, world, root.string(), 0);
  REQUIRE(saver.finish(world));
  ScopedEnv fail("ADGT_TEST_CKPT_WRITE_FAIL", "0:13");
  saver.start(state(specs, 13), lay, world, root.string(), 0);
  std::string msg;
  try {
    saver.finish(world);
  } catch (const CheckpointError& e) {
    msg = e.what();
  }
  REQUIRE_THAT(msg, Contains("writing checkpoint") && Contains("rank_0.h5") && Contains(".tmp_step_13_"));
  REQUIRE_FALSE(saver.in_flight());
  REQUIRE(entries(root) == std::vector<std::string>{"step_12"});  // no step_13, no temporary directory
  REQUIRE(resolve_resume("auto", root.string()) == (root / "step_12").string());
}

TEST_CASE("an abandoned asynchronous save leaves nothing behind", "[checkpoint]") {
  const fs::path root = fresh_root("abandon");
  const auto specs = table();
  SelfComm world("world");
  ShardLayout lay;
  {
    std::optional<ScopedEnv> slow;  // outlives the saver: its writer reads the environment
    AsyncCheckpointSaver saver;
    saver.start(state(specs, 12), lay, world, root.string(), 0);
    REQUIRE(saver.finish(world));
    slow.emplace("ADGT_TEST_CKPT_WRITE_DELAY_S", "0.2");
    saver.start(state(specs, 13), lay, world, root.string(), 0);
    REQUIRE(entries(root).size() == 2);  // step_12 and the temporary directory of step 13
  }  // the destructor: an exception path
  REQUIRE(entries(root) == std::vector<std::string>{"step_12"});
}
