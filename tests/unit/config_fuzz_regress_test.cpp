// Inputs found by scripts/reliability/fuzz_configs.py that
// the config path once accepted silently or took minutes over; each must now be
// refused quickly with the key and line named.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "core/config.hpp"
#include "kernels/clock.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::string& y, const std::vector<std::string>& ov = {}) {
  try {
    (void)load_config_text(y, "x.yaml", ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("an unclosed quote does not swallow the rest of the file", "[config][fuzz]") {
  // yaml-cpp 0.7 reads an unterminated quoted scalar to the end of the file.
  CHECK_THAT(error_of("data:\n  val: \"data/val.bin\n  tokenizer: byte\nlog:\n  dir: x\n"),
             Contains("x.yaml:2: data.val: the quoted string is never closed"));
  CHECK_THAT(error_of("data:\n  val: 'data/val.bin\n  tokenizer: byte\n"),
             Contains("x.yaml:2: data.val: the quoted string is never closed"));
  // ... and one closed by a later line's quote folds the lines between into it.
  CHECK_THAT(error_of("data:\n  val: \"data/val.bin\n  tokenizer: byte\"\n"),
             Contains("x.yaml:2: data.val: the quoted string runs over 2 lines"));
  CHECK_THAT(error_of("", {"data.val=\"abc"}), Contains("data.val: the quoted string is never closed"));
  // Quotes that close on their line, with escapes, anchors and aliases, still load.
  const RunConfig c = load_config_text(
      "data:\n  val: &v \"a\\\"b # c\"\n  train: *v\n  tokenizer: 'it''s'\n", "x.yaml");
  CHECK(c.data.val == "a\"b # c");
  CHECK(c.data.train == "a\"b # c");
  CHECK(c.data.tokenizer == "it's");
}

TEST_CASE("sizes too large for 64-bit arithmetic are refused, quickly", "[config][fuzz]") {
  // This thread's CPU time, which no other process's load adds to: the
  // checks take microseconds, the loop they guard against seconds.
  const double t0 = thread_cpu_seconds();
  // d_model = 2^63 - 1 once made the n_heads suggestion loop ~3e9 times.
  CHECK_THAT(error_of("model:\n  d_model: 9223372036854775807\n"),
             Contains("model.d_model=9223372036854775807 is larger than adgt supports"));
  CHECK_THAT(error_of("model:\n  n_layers: 9223372036854775807\n"), Contains("model.n_layers="));
  CHECK_THAT(error_of("model:\n  vocab_size: 9223372036854775807\n"), Contains("model.vocab_size="));
  CHECK_THAT(error_of("model:\n  n_experts: 9223372036854775807\n"), Contains("model.n_experts="));
  CHECK_THAT(error_of("parallel:\n  dp: 4611686018427387904\n"), Contains("parallel.dp="));
  CHECK_THAT(error_of("train:\n  global_batch: 9223372036854775807\n"),
             Contains("train.global_batch="));
  CHECK_THAT(error_of("model:\n  seq_len: 65536\ntrain:\n  micro_batch: 16777216\n  global_batch: 16777216\n"),
             Contains("tokens per micro-batch"));
  CHECK_THAT(error_of("model:\n  vocab_size: 2000000000\n  d_model: 1048576\n  n_heads: 8\n"),
             Contains("parameters"));
  // The suggestion search stays short for a huge d_model that is in range.
  CHECK_THAT(error_of("model:\n  d_model: 1048573\n"),
             Contains("choose n_heads in {} (none: model.d_model=1048573 is odd"));
  CHECK(thread_cpu_seconds() - t0 < 5);
  // The shipped sizes stay well inside.
  CHECK_NOTHROW(load_config(std::string(ADGT_SOURCE_DIR) + "/configs/llama-70b.yaml"));
  CHECK_NOTHROW(load_config(std::string(ADGT_SOURCE_DIR) + "/configs/mixtral-8x7b.yaml"));
}
