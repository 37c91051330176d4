// data.train and data.val as a YAML list of {path, weight} (core/config_blend.hpp):
// the list equals the shorthand "W A W B", --set takes either, every bad
// entry is named by its key path and line, and to_yaml writes a blend back
// as the list, which loads to the same configuration. Also the eval record
// and line of a data.val blend (core/metrics.hpp).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "tests/unit/config_text.hpp"
#include "core/data/blend.hpp"
#include "core/metrics.hpp"

using namespace adgt;

namespace {

using test::error_of;
using test::load;

const char* kList =
    "data:\n"
    "  train:\n"
    "    - path: a.bin\n"
    "      weight: 0.7\n"
    "    - {path: dir/b, weight: 3e-1}\n"
    "  val:\n"
    "    - path: a_val.bin\n"
    "    - path: b_val.bin\n";

}  // namespace

TEST_CASE("blend: data.train and data.val as a YAML list equal the shorthand", "[config]") {
  const RunConfig c = load(kList);
  CHECK(c.data.train == "0.7 a.bin 0.3 dir/b");
  CHECK(c.data.val == "1 a_val.bin 1 b_val.bin");  // no weights: equal
  // The same sources and weights as the shorthand written by hand.
  const RunConfig s = load("data:\n  train: 0.7 a.bin 0.3 dir/b\n  val: 1 a_val.bin 1 b_val.bin\n");
  CHECK(s == c);
  const auto blend = parse_blend(c.data.train, "data.train");
  REQUIRE(blend.size() == 2);
  CHECK(blend[0].path == "a.bin");
  CHECK(blend[1].path == "dir/b");
  CHECK(blend[0].weight == 0.7 / (0.7 + 0.3));
  // Weights need not sum to 1; one entry is its path (its weight moot).
  CHECK(load("data:\n  train:\n    - {path: a, weight: 2}\n    - {path: b, weight: 6}\n").data.train == "2 a 6 b");
  CHECK(load("data:\n  val:\n    - path: only.bin\n      weight: 5\n").data.val == "only.bin");
  // --set keeps the shorthand and takes the list in YAML flow.
  CHECK(load(kList, {"data.train=0.5 x 0.5 y"}).data.train == "0.5 x 0.5 y");
  CHECK(load("", {"data.val=[{path: x, weight: 1}, {path: y, weight: 3}]"}).data.val == "1 x 3 y");
  CHECK(load("", {"data.train=plain.bin"}).data.train == "plain.bin");
}

TEST_CASE("blend: a bad list entry is named by key path and line", "[config]") {
  const auto list = [](const std::string& entries) { return "data:\n  train:\n" + entries; };
  CHECK(error_of(list("    - {path: a, weight: 1}\n    - {path: b, weight: -1}\n")) ==
        "x.yaml:4: data.train[1].weight: expected a number > 0, got -1");
  CHECK(error_of(list("    - {path: a, weight: 0}\n    - {path: b, weight: 1}\n")) ==
        "x.yaml:3: data.train[0].weight: expected a number > 0, got 0");
  CHECK(error_of(list("    - {path: a, weight: 1}\n    - {path: b, weight: .inf}\n")) ==
        "x.yaml:4: data.train[1].weight: expected a number > 0, got .inf");
  CHECK(error_of(list("    - {path: a, weight: \"1\"}\n")) ==
        "x.yaml:3: data.train[0].weight: expected a number > 0, got \"1\" (a quoted string; remove the quotes)");
  CHECK(error_of(list("    - path: a\n      weight: 1\n    - weight: 1\n")) ==
        "x.yaml:5: data.train[1].path: missing; give the token file (or a directory: its train.bin or val.bin)");
  CHECK(error_of(list("    - path: a\n      wieght: 1\n")) ==
        "x.yaml:4: data.train[0].wieght: unknown key; an entry has path (a token file or directory) and weight");
  CHECK(error_of(list("    - {path: a, weight: 1}\n    - {path: b}\n")) ==
        "x.yaml:4: data.train[1].weight: missing, but data.train[0] has one; give every source a weight, "
        "or none (equal weights)");
  CHECK(error_of(list("    - {path: a}\n    - {path: b, weight: 2}\n")) ==
        "x.yaml:3: data.train[0].weight: missing, but data.train[1] has one; give every source a weight, "
        "or none (equal weights)");
  CHECK(error_of(list("    - {path: a, weight: 1}\n    - {path: a, weight: 2}\n")) ==
        "x.yaml:4: data.train[1].path: a is named twice; give each source once, with one weight");
  CHECK(error_of(list("    - a.bin\n")) ==
        "x.yaml:3: data.train[0]: expected a mapping {path: FILE, weight: W}, got \"a.bin\"");
  CHECK(error_of(list("    - {path: 'my file.bin'}\n")) ==
        "x.yaml:3: data.train[0].path: \"my file.bin\" holds white space, which a blend's file names cannot "
        "(the blend is kept as \"WEIGHT PATH ...\"); rename or link the file");
  CHECK(error_of(list("    - {path: [a]}\n")) ==
        "x.yaml:3: data.train[0].path: expected a file name, got a sequence");
  CHECK(error_of("data:\n  val: []\n") ==
        "x.yaml:2: data.val: an empty list; give one or more entries {path: FILE, weight: W}");
  CHECK(error_of("data:\n  val:\n    - {path: v, weight: nan}\n") ==
        "x.yaml:3: data.val[0].weight: expected a number > 0, got nan");
  CHECK(error_of("", {"data.val=[{path: x, weight: 0}]"}) ==
        "--set data.val=[{path: x, weight: 0}]: data.val[0].weight: expected a number > 0, got 0");
  CHECK(error_of("", {"data.val=[{path: x"}).rfind("--set data.val=[{path: x: data.val: cannot read the value as YAML", 0) == 0);
}

TEST_CASE("blend: to_yaml writes a blend as its list, which loads back", "[config]") {
  const RunConfig c = load(kList);
  const std::string y = to_yaml(c);
  INFO(y);
  CHECK(y.find("data:\n  train:\n    - path: \"a.bin\"\n      weight: 0.7\n    - path: \"dir/b\"\n"
               "      weight: 0.3\n  val:\n    - path: \"a_val.bin\"\n      weight: 1.0\n"
               "    - path: \"b_val.bin\"\n      weight: 1.0\n  tokenizer: ") != std::string::npos);
  const RunConfig back = load(y);
  CHECK(back == c);
  CHECK(to_yaml(back) == y);
  // The shorthand is written as the same list; one path stays a string.
  CHECK(to_yaml(load("data:\n  train: 0.7 a.bin 0.3 dir/b\n")).find("  train:\n    - path: \"a.bin\"\n") !=
        std::string::npos);
  CHECK(to_yaml(load("data:\n  train: one.bin\n")).find("  train: \"one.bin\"\n") != std::string::npos);
  // Weights as written, not normalised: 1/3 survives the round trip.
  RunConfig t;
  t.source = "x.yaml";
  t.data.train = "0.3333333333333333 a 2 b";
  CHECK(load(to_yaml(t)) == t);
}

TEST_CASE("blend: the eval record and line carry each val source's loss", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ADGT_BINARY_DIR) / "tmp" / "blend_eval_record";
  fs::remove_all(dir);
  {
    MetricsLog log(dir.string(), false);
    log.log_eval(4, 2.5);
    log.log_eval(8, 0.75 * 2.0 + 0.25 * 3.0, {{"data/a", 2.0}, {"data/b/val.bin", 3.0}});
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::string one, two;
  REQUIRE(std::getline(in, one));
  REQUIRE(std::getline(in, two));
  CHECK(nlohmann::json::parse(one) == nlohmann::json({{"step", 4}, {"val_loss", 2.5}}));
  CHECK(nlohmann::json::parse(two) ==
        nlohmann::json({{"step", 8}, {"val_loss", 2.25},
                        {"val_loss_by_source", {{"data/a", 2.0}, {"data/b/val.bin", 3.0}}}}));
  CHECK(format_val_loss(2.5, {}) == "val loss 2.5000");
  CHECK(format_val_loss(2.25, {{"data/a", 2.0}, {"data/b/val.bin", 3.0}}) ==
        "val loss 2.2500 (data/a 2.0000, data/b/val.bin 3.0000)");
}
