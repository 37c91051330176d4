// The run configuration: loading, every error message class, overrides,
// the to_yaml round trip, the shipped configs and the docs table.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/config.hpp"
#include "tests/unit/config_text.hpp"

using namespace adgt;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::string kSrc = ADGT_SOURCE_DIR;

using test::error_of;
using test::load;

}  // namespace

TEST_CASE("defaults are valid and an empty file gives them", "[config]") {
  REQUIRE_NOTHROW(validate(RunConfig{}));
  RunConfig c = load("");
  RunConfig d;
  d.source = "x.yaml";
  CHECK(c == d);
  CHECK(load("model:\ntrain:\n") == d);  // empty sections
  CHECK(load("# only a comment\n") == d);
}

TEST_CASE("values are read into their fields", "[config]") {
  RunConfig c = load(
      "model:\n  d_model: 128\n  n_heads: 4\n  n_kv_heads: 2\n  tie_embeddings: true\n"
      "  norm_eps: 1e-6\n"
      "train:\n  lr: 1.5e-3\n  min_lr: 0\n  seed: 18446744073709551615\n  device: cpu\n"
      "  dtype: f64\n  decay_norms_and_embeddings: False\n"
      "data:\n  train: 'a b/c: d.bin'\n  tokenizer: byte\n");
  CHECK(c.model.d_model == 128);
  CHECK(c.model.n_heads == 4);
  CHECK(c.model.tie_embeddings);
  CHECK(c.model.norm_eps == 1e-6);
  CHECK(c.train.lr == 1.5e-3);
  CHECK(c.train.min_lr == 0);
  CHECK(c.train.seed == std::numeric_limits<uint64_t>::max());
  CHECK(c.train.device == "cpu");
  CHECK(c.train.dtype == "f64");
  CHECK(c.data.train == "a b/c: d.bin");
  CHECK(c.data.tokenizer == "byte");
  CHECK(c.source == "x.yaml");
}

TEST_CASE("to_yaml round-trips every key", "[config]") {
  RunConfig c;
  c.source = "x.yaml";
  CHECK(load(to_yaml(c)) == c);

  c.model.rope_theta = 500000.0;
  c.model.norm_eps = 1.0 / 3.0;  // needs all 17 digits
  c.model.tie_embeddings = true;
  c.train.lr = 0.1 + 0.2;
  c.train.min_lr = 1e-300;
  c.train.seed = std::numeric_limits<uint64_t>::max();
  c.train.dtype = "f64";
  c.train.grad_clip = 0;
  c.data.train = "weird \"name\": #1\\x.bin";
  c.data.val = "true";  // a string that looks like a bool
  c.data.tokenizer = "123";
  c.checkpoint.dir = "  spaced  ";
  c.log.peak_tflops = 989.5;
  c.parallel.stage_layers = {4};
  c.parallel.schedule = "gpipe";
  const std::string y = to_yaml(c);
  INFO(y);
  CHECK(load(y) == c);
  // Every schema key is written.
  for (const auto& k : config_keys()) CHECK_THAT(y, Contains("  " + k.key + ": "));
}

TEST_CASE("every shipped config loads and round-trips", "[config]") {
  for (const char* n : {"tiny", "gpt-small", "llama-1.3b", "llama-7b", "llama-13b", "llama-34b",
                        "llama-70b"}) {
    INFO(n);
    const std::string path = kSrc + "/configs/" + n + ".yaml";
    RunConfig c = load_config(path);
    CHECK(c.source == path);
    CHECK(load_config_text(to_yaml(c), path) == c);
    CHECK(c.accum_steps() * c.train.micro_batch * c.parallel.dp == c.train.global_batch);
  }
  RunConfig t = load_config(kSrc + "/configs/tiny.yaml");
  CHECK(t.model.vocab_size == 4096);
  CHECK(t.model.d_model == 256);
  CHECK(t.model.n_layers == 4);
  CHECK(t.model.n_heads == 8);
  CHECK(t.model.n_kv_heads == 4);
  CHECK(t.model.ffn_hidden == 688);
  CHECK(t.model.seq_len == 256);
  CHECK(t.train.steps == 300);
  CHECK(t.train.micro_batch == 8);
  CHECK(t.train.global_batch == 8);
  CHECK(t.train.lr == 3e-3);
  CHECK(t.train.min_lr == 3e-4);
  CHECK(t.train.warmup_steps == 20);
  CHECK(t.train.weight_decay == 0.1);
  CHECK(t.train.grad_clip == 1.0);
  CHECK(t.train.eval_interval == 100);
  CHECK(t.data.train == "data/kjv/train.bin");
  CHECK(t.data.val == "data/kjv/val.bin");
  CHECK(t.data.tokenizer == "data/kjv/tokenizer.model");
  CHECK(t.log.dir == "runs/tiny");
  CHECK(t.log.interval == 10);
  CHECK(t.checkpoint.dir == "runs/tiny/checkpoints");
  CHECK(t.checkpoint.interval == 100);
  CHECK(t.checkpoint.keep == 3);
  RunConfig b = load_config(kSrc + "/configs/llama-34b.yaml");
  CHECK(b.model.rope_theta == 1e6);
  CHECK(b.model.seq_len == 16384);
  CHECK(b.model.n_kv_heads == 8);
}

TEST_CASE("unknown keys and sections name the line and suggest", "[config]") {
  CHECK(error_of("model:\n  d_model: 256\n  n_layerz: 4\n") ==
        "x.yaml:3: model.n_layerz: unknown key; did you mean model.n_layers? (allowed keys in "
        "model: vocab_size, d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, seq_len, "
        "rope_theta, norm_eps, tie_embeddings, rope_reset_per_document, init_std, n_experts, "
        "moe_top_k, moe_every, "
              "expert_ffn_hidden, moe_aux_loss_coef, moe_aux_free, moe_bias_rate, moe_bias_init_zipf, "
        "moe_capacity_factor, moe_capacity_segment)");
  // A key from another section.
  CHECK_THAT(error_of("train:\n  seq_len: 4\n"),
             StartsWith("x.yaml:2: train.seq_len: unknown key; did you mean model.seq_len?"));
  CHECK_THAT(error_of("log:\n  lr: 1\n"),
             StartsWith("x.yaml:2: log.lr: unknown key; did you mean train.lr?"));
  CHECK_THAT(error_of("log:\n  dri: x\n"),
             StartsWith("x.yaml:2: log.dri: unknown key; did you mean log.dir?"));
  // Nothing close: no suggestion.
  CHECK_THAT(error_of("log:\n  zzzzzzzzzz: 1\n"),
             StartsWith("x.yaml:2: log.zzzzzzzzzz: unknown key (allowed keys in log: dir, "));
  CHECK(error_of("model:\n  d_model: 256\nmodle:\n  x: 1\n") ==
        "x.yaml:3: unknown section \"modle\"; did you mean model? (sections: model, train, "
        "data, parallel, checkpoint, log, emulate)");
  CHECK(error_of("optimiser:\n  lr: 1\n  beta1: 0.8\n") ==
        "x.yaml:1: unknown section \"optimiser\"; did you mean train (it has lr, beta1)? "
        "(sections: model, train, data, parallel, checkpoint, log, emulate)");
  CHECK_THAT(error_of("steps: 10\n"),
             StartsWith("x.yaml:1: unknown section \"steps\"; did you mean train.steps"));
  CHECK_THAT(error_of("train:\n  steps: 10\n  steps: 20\n"),
             StartsWith("x.yaml:3: train.steps appears twice (first at line 2)"));
  CHECK_THAT(error_of("train:\n  steps: 10\ntrain:\n  lr: 1\n"),
             StartsWith("x.yaml:3: section train appears twice"));
}

TEST_CASE("wrong types say what was expected and what was found", "[config]") {
  CHECK(error_of("train:\n  micro_batch: eight\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got \"eight\"");
  CHECK(error_of("train:\n  micro_batch: -3\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got -3");
  CHECK(error_of("train:\n  micro_batch: 0\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got 0");
  CHECK(load("train:\n  micro_batch: +4\n  global_batch: 8\n").train.micro_batch == 4);
  CHECK(error_of("train:\n  micro_batch: +-4\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got \"+-4\"");
  CHECK(error_of("train:\n  micro_batch: 8.5\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got \"8.5\"");
  CHECK(error_of("train:\n  micro_batch: \"8\"\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got \"8\" (a quoted string; "
        "remove the quotes)");
  CHECK(error_of("train:\n  micro_batch: 99999999999999999999\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got 99999999999999999999 "
        "(too large for a 64-bit integer)");
  CHECK(error_of("train:\n  micro_batch:\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got nothing (null)");
  CHECK(error_of("train:\n  micro_batch: [1, 2]\n") ==
        "x.yaml:2: train.micro_batch: expected a positive integer, got a sequence");
  CHECK(error_of("model:\n  tie_embeddings: yes\n") ==
        "x.yaml:2: model.tie_embeddings: expected true or false, got \"yes\"");
  CHECK(error_of("model:\n  tie_embeddings: 1\n") ==
        "x.yaml:2: model.tie_embeddings: expected true or false, got \"1\"");
  CHECK(error_of("train:\n  lr: fast\n") == "x.yaml:2: train.lr: expected a number > 0, got \"fast\"");
  CHECK(error_of("train:\n  lr: .nan\n") == "x.yaml:2: train.lr: expected a number > 0, got \".nan\"");
  CHECK(error_of("train:\n  seed: -1\n") ==
        "x.yaml:2: train.seed: expected an integer in [0, 2^64), got \"-1\"");
  CHECK(error_of("data:\n  train: [a]\n") ==
        "x.yaml:2: data.train[0]: expected a mapping {path: FILE, weight: W}, got \"a\"");
  CHECK(error_of("data:\n  train: ''\n") ==
        "x.yaml:2: data.train: expected a token file, a blend \"W1 FILE1 W2 FILE2 ...\", or a list of "
        "{path: FILE, weight: W}, got an empty string");
  CHECK(error_of("data:\n  tokenizer: [a]\n") ==
        "x.yaml:2: data.tokenizer: expected a non-empty string, got a sequence");
  CHECK(error_of("model: 5\n") ==
        "x.yaml:1: model: expected a mapping of keys (vocab_size, d_model, n_layers, n_heads, "
        "n_kv_heads, ffn_hidden, seq_len, rope_theta, norm_eps, tie_embeddings, "
        "rope_reset_per_document, init_std, n_experts, "
              "moe_top_k, moe_every, expert_ffn_hidden, moe_aux_loss_coef, moe_aux_free, moe_bias_rate, "
              "moe_bias_init_zipf, moe_capacity_factor, moe_capacity_segment), got \"5\"");
  CHECK_THAT(error_of("- a\n- b\n"),
             StartsWith("x.yaml:1: expected a mapping of sections (model, train,"));
}

TEST_CASE("out-of-range values", "[config]") {
  CHECK(error_of("train:\n  lr: 0\n") == "x.yaml:2: train.lr: expected a number > 0, got 0");
  CHECK(error_of("train:\n  lr: -1e-3\n") == "x.yaml:2: train.lr: expected a number > 0, got -1e-3");
  CHECK(error_of("train:\n  beta1: 1.0\n") ==
        "x.yaml:2: train.beta1: expected a number in [0, 1), got 1.0");
  CHECK(error_of("train:\n  beta2: -0.1\n") ==
        "x.yaml:2: train.beta2: expected a number in [0, 1), got -0.1");
  CHECK(error_of("model:\n  norm_eps: 0\n") ==
        "x.yaml:2: model.norm_eps: expected a number > 0, got 0");
  CHECK(error_of("model:\n  seq_len: 0\n") ==
        "x.yaml:2: model.seq_len: expected a positive integer, got 0");
  CHECK(error_of("train:\n  weight_decay: -0.1\n") ==
        "x.yaml:2: train.weight_decay: expected a number >= 0, got -0.1");
  CHECK(error_of("train:\n  device: gpu\n") ==
        "x.yaml:2: train.device: expected one of {auto, cpu, cuda, emulated}, got \"gpu\"");
  CHECK(error_of("train:\n  dtype: f16\n") ==
        "x.yaml:2: train.dtype: expected one of {f32, bf16, fp8, f64}, got \"f16\"");
  CHECK(error_of("parallel:\n  tp: 0\n") ==
        "x.yaml:2: parallel.tp: expected a positive integer, got 0");
  CHECK(error_of("checkpoint:\n  keep: -1\n") ==
        "x.yaml:2: checkpoint.keep: expected a non-negative integer, got -1");
}

TEST_CASE("cross-field rules name both keys and a fix", "[config]") {
  CHECK(error_of("train:\n  dtype: bf16\nparallel:\n  fp8_allgather: true\n") ==
        "x.yaml: parallel.fp8_allgather gathers FP8 codes, but train.dtype is bf16; set "
        "train.dtype: fp8 or parallel.fp8_allgather: false");
  CHECK(error_of("model:\n  d_model: 768\n  n_heads: 12\n  n_kv_heads: 8\n") ==
        "x.yaml: model.n_heads=12 is not divisible by model.n_kv_heads=8; choose n_kv_heads in "
        "{1,2,3,4,6,12}");
  CHECK(error_of("train:\n  global_batch: 10\n  micro_batch: 4\n") ==
        "x.yaml: train.global_batch=10 is not a multiple of train.micro_batch=4 x parallel.dp=1; "
        "use 8 or 12");
  CHECK(error_of("train:\n  global_batch: 3\n  micro_batch: 4\n") ==
        "x.yaml: train.global_batch=3 is not a multiple of train.micro_batch=4 x parallel.dp=1; "
        "use 4");
  CHECK(error_of("model:\n  d_model: 250\n  n_heads: 8\n  n_kv_heads: 1\n") ==
        "x.yaml: model.d_model=250 is not divisible by model.n_heads=8; choose n_heads in "
        "{1,5,25,125}");
  CHECK(error_of("model:\n  d_model: 24\n  n_heads: 8\n") ==
        "x.yaml: model.d_model=24 / model.n_heads=8 gives head_dim=3, but rotary embeddings "
        "need an even head_dim; choose n_heads in {4,12}");
  CHECK(error_of("train:\n  lr: 1e-3\n  min_lr: 1e-2\n") ==
        "x.yaml: train.min_lr=0.01 is greater than train.lr=0.001; use min_lr <= lr (e.g. lr/10 "
        "= 1e-04)");
  CHECK(error_of("train:\n  steps: 10\n  warmup_steps: 20\n") ==
        "x.yaml: train.warmup_steps=20 exceeds train.steps=10; use warmup_steps <= 10");
  CHECK(error_of("model:\n  seq_len: 96\n  moe_capacity_segment: 64\n") ==
        "x.yaml: model.moe_capacity_segment=64 does not divide model.seq_len=96 (a capacity group "
        "never spans two sequences); use a divisor of 96, or 0 for a rank's micro-batch");
  CHECK(error_of("parallel:\n  tp: 3\n") ==
        "x.yaml: parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}");
  CHECK(error_of("parallel:\n  ep: 2\n") ==
        "x.yaml: parallel.ep=2 needs a mixture-of-experts model; set model.n_experts (e.g. 8) or "
              "parallel.ep: 1");
  CHECK(error_of("parallel:\n  zero: 4\n") == "x.yaml: parallel.zero=4: ZeRO stages are 0, 1, 2 and 3");
  CHECK(error_of("model:\n  ffn_hidden: 690\nparallel:\n  tp: 4\n") ==
        "x.yaml: parallel.tp=4 does not divide model.ffn_hidden=690; use tp in {1,2}");
  CHECK(error_of("parallel:\n  dp: 4\ntrain:\n  global_batch: 30\n  micro_batch: 4\n") ==
        "x.yaml: train.global_batch=30 is not a multiple of train.micro_batch=4 x parallel.dp=4; "
        "use 16 or 32");
  {
    RunConfig c = load_config_text("parallel:\n  tp: 2\n  dp: 2\ntrain:\n  global_batch: 16\n", "x.yaml");
    CHECK_NOTHROW(validate_world(c, 4));
    try {
      validate_world(c, 8);
      FAIL("validate_world accepted 8 ranks for tp=2 x dp=2");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()) ==
            "x.yaml: parallel.tp=2 x pp=1 x dp=2 = 4 ranks, but the launch has 8 (mpirun -np / "
            "srun -n); use parallel.tp=4 parallel.pp=1 parallel.dp=2");  // tp=2 x dp=4 splits no batch of 16
    }
    // The suggestion passes every rule: on 3 ranks, dp=3 does not split the
    // batch of 16 and tp=3 does not divide the heads, so the batch is raised.
    try {
      validate_world(c, 3);
      FAIL("validate_world accepted 3 ranks for tp=2 x dp=2");
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      CHECK_THAT(m, Contains("but the launch has 3"));
      const size_t at = m.find("use parallel.");
      REQUIRE(at != std::string::npos);
      // Apply the suggestion and check it validates for 3 ranks.
      RunConfig s = c;
      std::string rest = m.substr(at);
      for (const char* key : {"parallel.tp=", "parallel.pp=", "parallel.dp=", "train.global_batch="})
        if (const size_t k = rest.find(key); k != std::string::npos) {
          const int64_t v = std::stoll(rest.substr(k + std::strlen(key)));
          const std::string name = key;
          if (name == "parallel.tp=") s.parallel.tp = v;
          if (name == "parallel.pp=") s.parallel.pp = v;
          if (name == "parallel.dp=") s.parallel.dp = v;
          if (name == "train.global_batch=") s.train.global_batch = v;
        }
      CHECK_NOTHROW(validate(s));
      CHECK_NOTHROW(validate_world(s, 3));
      CHECK(m.find("use dp=") == std::string::npos);
    }
  }
  // validate() alone catches per-key ranges in a config built in code.
  RunConfig c;
  c.train.lr = -1;
  c.source = "code";
  REQUIRE_THROWS_WITH(validate(c), "code: train.lr: expected a number > 0, got -1");
}

TEST_CASE("YAML syntax errors and missing files", "[config]") {
  // yaml-cpp reports an unclosed flow sequence where it gives up: the end.
  CHECK_THAT(error_of("model:\n  d_model: 256\n  n_heads: [8\n"),
             StartsWith("x.yaml:4: YAML syntax error: end of sequence flow not found"));
  CHECK_THAT(error_of("model:\n  d_model: 256\n   bad indentation: 1\n"),
             StartsWith("x.yaml:3: YAML syntax error: "));
  const std::string missing = kSrc + "/configs/no-such-config.yaml";
  REQUIRE_THROWS_WITH(load_config(missing),
                      StartsWith(missing + ": cannot open config file: no such file"));
  REQUIRE_THROWS_WITH(load_config(kSrc + "/configs"), Contains("not a regular file"));
}

TEST_CASE("overrides (--set) apply in order after the file", "[config]") {
  RunConfig c = load("train:\n  steps: 10\n  warmup_steps: 5\n",
                     {"train.steps=100", "train.steps=200", "model.tie_embeddings=true",
                      "train.lr=1e-4", "train.min_lr=1e-5", "data.train=x:y #z.bin",
                      "data.val=\"quoted: v\"", "train.device=cpu"});
  CHECK(c.train.steps == 200);
  CHECK(c.model.tie_embeddings);
  CHECK(c.train.lr == 1e-4);
  CHECK(c.data.train == "x:y #z.bin");
  CHECK(c.data.val == "quoted: v");
  CHECK(c.train.device == "cpu");
  // Validation happens after the overrides: this fixes a file that alone is invalid.
  CHECK_NOTHROW(load("train:\n  global_batch: 10\n", {"train.global_batch=16"}));

  CHECK(error_of("", {"train.steps=abc"}) ==
        "--set train.steps=abc: train.steps: expected a positive integer, got \"abc\"");
  CHECK(error_of("", {"train.steps="}) ==
        "--set train.steps=: train.steps: expected a positive integer, got nothing (null)");
  CHECK(error_of("", {"train.device=gpu"}) ==
        "--set train.device=gpu: train.device: expected one of {auto, cpu, cuda, emulated}, got \"gpu\"");
  CHECK_THAT(error_of("", {"train.stepz=5"}),
             StartsWith("--set train.stepz=5: train.stepz: unknown key; did you mean train.steps?"));
  CHECK_THAT(error_of("", {"trian.steps=5"}),
             StartsWith("--set trian.steps=5: unknown section \"trian\"; did you mean train?"));
  CHECK(error_of("", {"steps=5"}) ==
        "--set steps=5: expected section.key=value, e.g. --set train.steps=100");
  CHECK(error_of("", {"train.steps"}) ==
        "--set train.steps: expected section.key=value, e.g. --set train.steps=100");
  CHECK_THAT(error_of("", {"train.steps=[1"}),
             StartsWith("--set train.steps=[1: train.steps: cannot read the value as YAML"));
  CHECK(error_of("", {"parallel.tp=3"}) ==
        "x.yaml, --set parallel.tp=3: parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}");
}

TEST_CASE("docs/config.md carries the generated key reference", "[config]") {
  const std::string ref = config_reference_markdown();
  std::ifstream in(kSrc + "/docs/config.md");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const bool in_docs = ss.str().find(ref) != std::string::npos;
  if (!in_docs) {
    const std::string out = std::string(ADGT_BINARY_DIR) + "/config_reference.md";
    std::ofstream(out) << ref;
    FAIL("docs/config.md is out of date with the schema in core/config.cpp; paste " + out +
         " between its BEGIN/END markers");
  }
  CHECK(config_keys().size() == 113);
  for (const auto& k : config_keys()) {
    CHECK(!k.doc.empty());
    CHECK(!k.allowed.empty());
  }
}

// ------------------------------------------------------------ pipeline keys

namespace {

// A valid pipeline base: 8 layers, pp 2, 4 micro-batches of 1 sequence.
const std::string kPipe =
    "model:\n  n_layers: 8\ntrain:\n  micro_batch: 1\n  global_batch: 4\nparallel:\n  pp: 2\n";

}  // namespace

TEST_CASE("pipeline keys: defaults, values and pipeline_microbatches", "[config]") {
  RunConfig d;
  CHECK(d.parallel.schedule == "1f1b");
  CHECK(d.parallel.microbatches == 0);
  CHECK(d.parallel.virtual_stages == 1);
  CHECK(d.parallel.stage_layers.empty());
  CHECK(d.pipeline_microbatches() == d.accum_steps());

  RunConfig c = load(kPipe);
  CHECK(c.parallel.pp == 2);
  CHECK(c.pipeline_microbatches() == 4);
  CHECK(load(kPipe, {"parallel.microbatches=4"}).parallel.microbatches == 4);
  CHECK(load(kPipe, {"parallel.schedule=gpipe", "train.global_batch=1"}).pipeline_microbatches() == 1);
  CHECK(load(kPipe, {"parallel.schedule=zb-h1"}).parallel.schedule == "zb-h1");
  CHECK(load(kPipe, {"parallel.schedule=greedy"}).parallel.schedule == "greedy");
  RunConfig i = load(kPipe, {"parallel.schedule=interleaved", "parallel.virtual_stages=2"});
  CHECK(i.parallel.virtual_stages == 2);
  CHECK(error_of("parallel:\n  schedule: zb-h2\n") ==
        "x.yaml:2: parallel.schedule: expected one of {gpipe, 1f1b, interleaved, zb-h1, zb-v, greedy}, "
        "got \"zb-h2\"");
  CHECK(error_of("parallel:\n  virtual_stages: 0\n") ==
        "x.yaml:2: parallel.virtual_stages: expected a positive integer, got 0");
  CHECK(error_of("parallel:\n  microbatches: -1\n") ==
        "x.yaml:2: parallel.microbatches: expected a non-negative integer, got -1");
  // The data-parallel arithmetic is unchanged with pp = 1.
  CHECK(load("train:\n  micro_batch: 2\n  global_batch: 16\nparallel:\n  dp: 2\n")
            .pipeline_microbatches() == 4);
}

TEST_CASE("parallel.stage_layers: an int list from YAML and --set", "[config]") {
  const std::string base = kPipe;
  CHECK(load(base + "  stage_layers: [5, 3]\n").parallel.stage_layers ==
        std::vector<int64_t>{5, 3});
  CHECK(load(base + "  stage_layers:\n    - 2\n    - 6\n").parallel.stage_layers ==
        std::vector<int64_t>{2, 6});
  CHECK(load(base + "  stage_layers: 4, 4\n").parallel.stage_layers ==
        std::vector<int64_t>{4, 4});
  CHECK(load(base + "  stage_layers: []\n").parallel.stage_layers.empty());
  CHECK(load(base, {"parallel.stage_layers=[3,5]"}).parallel.stage_layers ==
        std::vector<int64_t>{3, 5});
  CHECK(load(base, {"parallel.stage_layers=3,5"}).parallel.stage_layers ==
        std::vector<int64_t>{3, 5});
  CHECK(load(base, {"parallel.stage_layers=[ 1, +7 ]"}).parallel.stage_layers ==
        std::vector<int64_t>{1, 7});
  CHECK(load(base + "  stage_layers: [5, 3]\n", {"parallel.stage_layers=[]"})
            .parallel.stage_layers.empty());
  // pp = 1: the only list is [n_layers].
  CHECK(load("parallel:\n  stage_layers: [4]\n").parallel.stage_layers ==
        std::vector<int64_t>{4});

  // to_yaml writes flow lists and reads them back.
  RunConfig c = load(base + "  stage_layers: [5, 3]\n");
  const std::string y = to_yaml(c);
  CHECK_THAT(y, Contains("  stage_layers: [5, 3]\n"));
  CHECK_THAT(to_yaml(RunConfig{}), Contains("  stage_layers: []\n"));
  CHECK(load(y) == c);
  for (const auto& k : config_keys())
    if (k.key == "stage_layers") {
      CHECK(k.type == "int list");
      CHECK(k.default_value == "[]");
      CHECK(k.allowed == "a list of positive integers");
    }

  // Bad entries name the file, the line of the entry and the key.
  CHECK(error_of(base + "  stage_layers: [5, x]\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got \"x\" at "
        "entry 2");
  CHECK(error_of(base + "  stage_layers:\n    - 5\n    - 2.5\n") ==
        "x.yaml:10: parallel.stage_layers: expected a list of positive integers, got \"2.5\" at "
        "entry 2");
  CHECK(error_of(base + "  stage_layers: [5, 0, 3]\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got 0 at entry 2");
  CHECK(error_of(base + "  stage_layers: [5, \"3\"]\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got \"3\" at "
        "entry 2 (a quoted string; remove the quotes)");
  CHECK(error_of(base + "  stage_layers: [5, [3]]\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got a sequence "
        "at entry 2");
  CHECK(error_of(base + "  stage_layers: {a: 1}\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got a mapping");
  CHECK(error_of(base + "  stage_layers:\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got nothing "
        "(null)");
  CHECK(error_of(base + "  stage_layers: \"5,3\"\n") ==
        "x.yaml:8: parallel.stage_layers: expected a list of positive integers, got \"5,3\" (a "
        "quoted string; remove the quotes)");
  CHECK(error_of(base, {"parallel.stage_layers=5,x"}) ==
        "--set parallel.stage_layers=5,x: parallel.stage_layers: expected a list of positive "
        "integers, got \"x\" at entry 2");
  CHECK(error_of(base, {"parallel.stage_layers=5,,3"}) ==
        "--set parallel.stage_layers=5,,3: parallel.stage_layers: expected a list of positive "
        "integers, got \"\" at entry 2");
  CHECK(error_of(base, {"parallel.stage_layers=[5,-3]"}) ==
        "--set parallel.stage_layers=[5,-3]: parallel.stage_layers: expected a list of positive "
        "integers, got -3 at entry 2");
  CHECK_THAT(error_of(base, {"parallel.stage_layers=[5,3"}),
             StartsWith("--set parallel.stage_layers=[5,3: parallel.stage_layers: cannot read "
                        "the value as YAML"));
  // A list built in code is range-checked by validate() too.
  RunConfig bad = load(base);
  bad.parallel.stage_layers = {8, 0};
  REQUIRE_THROWS_WITH(validate(bad),
                      "x.yaml: parallel.stage_layers: expected a list of positive integers, got "
                      "0 at entry 2 of [8, 0]");
}

TEST_CASE("pipeline cross-field rules name the keys and a fix", "[config]") {
  // parallel.microbatches, when set, equals the accumulation steps.
  CHECK(error_of(kPipe + "  microbatches: 6\n") ==
        "x.yaml: parallel.microbatches=6 does not match train.global_batch=4 / "
        "(train.micro_batch=1 x parallel.dp=1) = 4 accumulation steps, which are the pipeline's "
        "micro-batches; set train.global_batch=6 (= 6 x 1 x 1), or parallel.microbatches=0 to "
        "derive it");
  CHECK_THAT(error_of("train:\n  micro_batch: 2\n  global_batch: 16\nparallel:\n  dp: 2\n"
                      "  microbatches: 2\n"),
             Contains("set train.global_batch=8 (= 2 x 2 x 2)"));

  // virtual_stages > 1 only with the interleaved and greedy schedules.
  CHECK(error_of(kPipe + "  virtual_stages: 2\n") ==
        "x.yaml: parallel.virtual_stages=2 needs parallel.schedule=interleaved, greedy or zb-v (got 1f1b); "
        "use virtual_stages=1, or schedule=interleaved, greedy or zb-v");
  CHECK(error_of(kPipe + "  virtual_stages: 2\n  schedule: zb-h1\n") ==
        "x.yaml: parallel.virtual_stages=2 needs parallel.schedule=interleaved, greedy or zb-v (got zb-h1); "
        "use virtual_stages=1, or schedule=interleaved, greedy or zb-v");
  CHECK(load(kPipe, {"parallel.virtual_stages=2", "parallel.schedule=greedy"}).parallel.virtual_stages == 2);
  CHECK(error_of("parallel:\n  schedule: greedy\n  virtual_stages: 2\n") ==
        "x.yaml: parallel.pp=1: greedy with parallel.virtual_stages=2 needs at least 2 pipeline ranks; use "
        "pp >= 2, or virtual_stages=1");
  CHECK(error_of(kPipe + "  schedule: interleaved\n") ==
        "x.yaml: parallel.virtual_stages=1: the interleaved schedule needs at least 2 chunks per "
        "rank; use virtual_stages >= 2, or parallel.schedule=1f1b");
  CHECK(error_of("parallel:\n  schedule: interleaved\n  virtual_stages: 2\n") ==
        "x.yaml: parallel.pp=1: the interleaved schedule needs at least 2 pipeline ranks; use "
        "pp >= 2, or parallel.schedule=1f1b with parallel.virtual_stages=1");

  // Tied embeddings cannot span stages.
  CHECK(error_of(kPipe, {"model.tie_embeddings=true"}) ==
        "x.yaml, --set model.tie_embeddings=true: model.tie_embeddings=true with parallel.pp=2: "
        "the embedding (first stage) and "
        "lm_head (last stage) live on different pipeline ranks and cannot share one weight; set "
        "model.tie_embeddings: false or parallel.pp: 1");
  CHECK(error_of(kPipe, {"model.tie_embeddings=true", "parallel.schedule=zb-v", "parallel.virtual_stages=2"}) ==
        "x.yaml, --set model.tie_embeddings=true: model.tie_embeddings=true with parallel.pp=2: zb-v "
        "puts the embedding (stage 0) and "
        "lm_head (stage 3) on pipeline rank 0 but in different chunks, whose gradients are reduced "
        "separately, so they cannot share one weight; set model.tie_embeddings: false or parallel.pp: 1");

  // Fewer micro-batches than stages.
  CHECK(error_of(kPipe, {"parallel.pp=4", "train.global_batch=2"}) ==
        "x.yaml, --set parallel.pp=4, --set train.global_batch=2: parallel.schedule=1f1b with "
        "parallel.pp=4: fewer micro-batches than stages "
        "(train.global_batch=2 / (train.micro_batch=1 x parallel.dp=1) = 2, need >= 4); use "
        "train.global_batch >= 4, or parallel.schedule=gpipe");
  CHECK_THAT(error_of(kPipe, {"parallel.schedule=zb-h1", "train.global_batch=1"}),
             Contains("parallel.schedule=zb-h1 with parallel.pp=2: fewer micro-batches than "
                      "stages"));
  CHECK_THAT(error_of(kPipe, {"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                              "train.global_batch=1"}),
             Contains("parallel.schedule=interleaved with parallel.pp=2: fewer micro-batches"));
  CHECK_NOTHROW(load(kPipe, {"parallel.schedule=gpipe", "train.global_batch=1"}));
  CHECK_NOTHROW(load(kPipe, {"parallel.schedule=greedy", "train.global_batch=1"}));
  // pp = 1 has no pipeline micro-batch rule.
  CHECK_NOTHROW(load("train:\n  micro_batch: 8\n  global_batch: 8\n"));

  // Interleaved: micro-batches in groups of pp.
  CHECK(error_of(kPipe, {"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                         "train.global_batch=5"}) ==
        "x.yaml, --set parallel.schedule=interleaved, --set train.global_batch=5: "
        "parallel.schedule=interleaved with parallel.pp=2: the micro-batches "
        "(train.global_batch=5 / (train.micro_batch=1 x parallel.dp=1) = 5) run in groups of pp "
        "and must be a multiple of 2; use train.global_batch=4 or 6");

  // Enough layers for every stage.
  CHECK(error_of(kPipe, {"model.n_layers=3", "parallel.pp=4"}) ==
        "x.yaml, --set model.n_layers=3, --set parallel.pp=4: model.n_layers=3 is fewer than "
        "parallel.pp x parallel.virtual_stages = 4 x 1 = 4 "
        "stages (each stage needs at least one layer); use pp x virtual_stages <= 3");
  CHECK_THAT(error_of(kPipe, {"parallel.schedule=interleaved", "parallel.virtual_stages=8"}),
             Contains("model.n_layers=8 is fewer than parallel.pp x parallel.virtual_stages = 2 x "
                      "8 = 16 stages"));

  // Interleaved without a list: equal stages.
  CHECK(error_of(kPipe, {"model.n_layers=12", "parallel.schedule=interleaved",
                         "parallel.virtual_stages=4"}) ==
        "x.yaml, --set model.n_layers=12, --set parallel.virtual_stages=4: model.n_layers=12 is "
        "not divisible by parallel.pp x parallel.virtual_stages = 2 "
        "x 4 = 8 stages: without parallel.stage_layers every interleaved stage holds the same "
        "number of layers; use virtual_stages in {2,3,6}, or list the layers per stage in "
        "parallel.stage_layers");
  CHECK_THAT(error_of(kPipe, {"model.n_layers=7", "parallel.schedule=interleaved",
                              "parallel.virtual_stages=3"}),
             Contains("no virtual_stages >= 2 does that with pp=2, or list the layers per stage"));
  CHECK(load(kPipe, {"model.n_layers=12", "parallel.schedule=interleaved",
                     "parallel.virtual_stages=4", "parallel.stage_layers=[2,1,2,1,2,1,2,1]"})
            .parallel.stage_layers.size() == 8);
  // Balanced (v = 1) needs no divisibility.
  CHECK_NOTHROW(load(kPipe, {"model.n_layers=7"}));

  // stage_layers: one count per stage, summing to n_layers.
  CHECK(error_of(kPipe + "  stage_layers: [3, 3, 2]\n") ==
        "x.yaml: parallel.stage_layers=[3, 3, 2] has 3 entries, but parallel.pp x "
        "parallel.virtual_stages = 2 x 1 = 2 stages; give one layer count per stage, or [] to "
        "balance by cost");
  CHECK(error_of(kPipe + "  stage_layers: [5, 4]\n") ==
        "x.yaml: parallel.stage_layers=[5, 4] sums to 9, but model.n_layers=8; make the counts add "
        "up to 8, or use [] to balance by cost");
  CHECK(error_of("parallel:\n  stage_layers: [2, 2]\n") ==
        "x.yaml: parallel.stage_layers=[2, 2] has 2 entries, but parallel.pp x "
        "parallel.virtual_stages = 1 x 1 = 1 stage; with one stage the only list is [4] "
        "(model.n_layers), or [] to leave it out");
  CHECK(error_of("parallel:\n  stage_layers: [3]\n") ==
        "x.yaml: parallel.stage_layers=[3] sums to 3, but model.n_layers=4; make the counts add "
        "up to 4, or use [] to balance by cost");
}

TEST_CASE("train.fp8_weight_cache: auto caches unless ZeRO-3 frees the gathered weights", "[config]") {
  RunConfig c;
  c.train.dtype = "fp8";
  CHECK(fp8_weight_cache_on(c));  // one process
  c.parallel.dp = 4;
  c.parallel.zero = 3;
  CHECK_FALSE(fp8_weight_cache_on(c));  // ZeRO-3, resharding after the forward
  c.parallel.zero3_reshard_after_forward = false;
  CHECK(fp8_weight_cache_on(c));  // the gathered weights kept: their codes too
  c.parallel.zero3_reshard_after_forward = true;
  c.parallel.dp = 1;
  CHECK(fp8_weight_cache_on(c));  // nothing sharded
  c.parallel.cp = 2;
  CHECK_FALSE(fp8_weight_cache_on(c));  // ZeRO shards over dp x cp
  c.train.fp8_weight_cache = "on";
  CHECK(fp8_weight_cache_on(c));
  c.parallel.zero = 0;
  c.train.fp8_weight_cache = "off";
  CHECK_FALSE(fp8_weight_cache_on(c));
}
