// The run configuration: loading, every error message class, overrides,
// the to_yaml round trip, the shipped configs and the docs table.
#include <catch2/catch.hpp>

#include <fstream>
#include <limits>
#include <sstream>

#include "core/config.hpp"

using namespace adgt;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::string kSrc = ADGT_SOURCE_DIR;

RunConfig load(const std::string& y, const std::vector<std::string>& ov = {}) {
  return load_config_text(y, "x.yaml", ov);
}

std::string error_of(const std::string& y, const std::vector<std::string>& ov = {}) {
  try {
    load(y, ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

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
  const std::string y = to_yaml(c);
  INFO(y);
  CHECK(load(y) == c);
  // Every schema key is written.
  for (const auto& k : config_keys()) CHECK_THAT(y, Contains("  " + k.key + ": "));
}

TEST_CASE("every shipped config loads and round-trips", "[config]") {
  for (const char* n : {"tiny", "gpt-small", "llama-7b", "llama-13b", "llama-34b", "llama-70b"}) {
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
        "rope_theta, norm_eps, tie_embeddings, init_std)");
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
        "data, parallel, checkpoint, log)");
  CHECK(error_of("optimiser:\n  lr: 1\n  beta1: 0.8\n") ==
        "x.yaml:1: unknown section \"optimiser\"; did you mean train (it has lr, beta1)? "
        "(sections: model, train, data, parallel, checkpoint, log)");
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
        "x.yaml:2: data.train: expected a non-empty string, got a sequence");
  CHECK(error_of("data:\n  train: ''\n") ==
        "x.yaml:2: data.train: expected a non-empty string, got an empty string");
  CHECK(error_of("model: 5\n") ==
        "x.yaml:1: model: expected a mapping of keys (vocab_size, d_model, n_layers, n_heads, "
        "n_kv_heads, ffn_hidden, seq_len, rope_theta, norm_eps, tie_embeddings, init_std), got \"5\"");
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
        "x.yaml:2: train.device: expected one of {auto, cpu, cuda}, got \"gpu\"");
  CHECK(error_of("train:\n  dtype: bf16\n") ==
        "x.yaml:2: train.dtype: expected one of {f32, f64}, got \"bf16\"");
  CHECK(error_of("parallel:\n  tp: 0\n") ==
        "x.yaml:2: parallel.tp: expected a positive integer, got 0");
  CHECK(error_of("checkpoint:\n  keep: -1\n") ==
        "x.yaml:2: checkpoint.keep: expected a non-negative integer, got -1");
}

TEST_CASE("cross-field rules name both keys and a fix", "[config]") {
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
  CHECK(error_of("parallel:\n  tp: 3\n") ==
        "x.yaml: parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}");
  CHECK(error_of("parallel:\n  pp: 2\n") ==
        "x.yaml: parallel.pp=2: pipeline parallelism is not available in this build yet; use 1");
  CHECK(error_of("parallel:\n  zero: 2\n") ==
        "x.yaml: parallel.zero=2: only ZeRO stage 0 or 1 is supported; use 0 or 1");
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
            "srun -n); with tp=2 pp=1 use dp=4");
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
        "--set train.device=gpu: train.device: expected one of {auto, cpu, cuda}, got \"gpu\"");
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
        "x.yaml: parallel.tp=3 does not divide model.n_heads=8; use tp in {1,2,4}");
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
  CHECK(config_keys().size() == 45);
  for (const auto& k : config_keys()) {
    CHECK(!k.doc.empty());
    CHECK(!k.allowed.empty());
  }
}
