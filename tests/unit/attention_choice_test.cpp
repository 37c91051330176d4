// train.attention (kernels/attention_choice.hpp): auto's choice with a fake
// timer and fake kernels — the faster is kept, the timing stays within its
// budget, a kernel that disagrees with the others is refused with a named
// error —, and the CPU and emulated backends accepting only their one kernel.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_choice.hpp"
#include "kernels/backend.hpp"

using namespace adgt;
using Catch::Contains;

namespace {

// Fake kernels: run() records itself as the last one run; output(i) is a
// fixed vector per output, optionally perturbed by `rel` (relative, L2).
struct Fake {
  std::map<std::string, double> seconds;  // what the fake timer reports per kernel
  std::map<std::string, int> runs;
  std::string last;

  AttentionCandidate make(const std::string& name, double rel = 0, bool reference = false,
                          bool nan = false) {
    AttentionCandidate c;
    c.name = name;
    c.reference = reference;
    c.run = [this, name] {
      ++runs[name];
      last = name;
    };
    c.output = [rel, nan](int i) {
      std::vector<float> v(64);
      for (size_t j = 0; j < v.size(); ++j) v[j] = float(std::sin(double(j + 7 * i)));
      // +rel * ||v|| along the first axis: relative error rel / (1 + O(rel)).
      double n2 = 0;
      for (float x : v) n2 += double(x) * x;
      v[0] += float(rel * std::sqrt(n2));
      if (nan) v[3] = std::nanf("");
      return v;
    };
    return c;
  }
  AttentionTimer timer() {
    return [this](const std::function<void()>& f) {
      f();
      return seconds.at(last);
    };
  }
};

AttentionChoiceOptions opts() {
  AttentionChoiceOptions o;
  o.what = "bf16 B=1 T=64 H=2 KV=1 head_dim=64";
  return o;
}

}  // namespace

TEST_CASE("attention choice: the faster candidate is kept, the reference never timed",
          "[attention_choice]") {
  Fake f;
  f.seconds = {{"flash", 2e-3}, {"cudnn", 1e-3}, {"exact", 1.0}};
  const std::vector<AttentionCandidate> c = {f.make("flash"), f.make("cudnn", 1e-3),
                                             f.make("exact", 0, /*reference=*/true)};
  const AttentionChoice r = choose_attention(c, f.timer(), opts());
  CHECK(r.chosen == "cudnn");
  REQUIRE(r.timings.size() == 3);
  // 3 ms a round: the 1.5 s budget is not reached, so max_iters (20) bounds it.
  CHECK(r.timings[0].iters == 20);
  CHECK(r.timings[1].iters == 20);
  CHECK(r.timings[2].iters == 0);
  CHECK(f.runs["exact"] == 1);  // the warm-up/check run only
  CHECK(f.runs["cudnn"] == 21);
  CHECK(r.timings[1].best_s == Approx(1e-3));
  CHECK(r.timings[0].median_s == Approx(2e-3));
  const std::string t = r.table();
  CHECK_THAT(t, Contains("| cudnn | candidate | 20 | 1.000 | 1.000 | yes |"));
  CHECK_THAT(t, Contains("| flash | candidate | 20 | 2.000 | 2.000 |  |"));
  CHECK_THAT(t, Contains("| exact | reference (checked, not timed) |"));
  CHECK_THAT(t, Contains("agreement: flash vs cudnn"));
  REQUIRE(r.agreement.size() == 3);  // every pair
}

TEST_CASE("attention choice: timing stops at the budget after min_iters", "[attention_choice]") {
  Fake f;
  f.seconds = {{"flash", 0.5}, {"cudnn", 0.6}};
  AttentionChoiceOptions o = opts();
  o.budget_s = 1.5;
  o.min_iters = 2;
  const AttentionChoice r = choose_attention({f.make("flash"), f.make("cudnn")}, f.timer(), o);
  CHECK(r.chosen == "flash");
  CHECK(r.timings[0].iters == 2);  // 1.1 s after one round, 2.2 s after two: stop
  CHECK(r.timings[1].iters == 2);
  // A budget already spent still gives every candidate min_iters runs.
  o.budget_s = 0;
  o.min_iters = 3;
  const AttentionChoice r3 = choose_attention({f.make("flash"), f.make("cudnn")}, f.timer(), o);
  CHECK(r3.timings[0].iters == 3);
}

TEST_CASE("attention choice: ties keep the earlier candidate; one candidate is not timed",
          "[attention_choice]") {
  Fake f;
  f.seconds = {{"flash", 1e-3}, {"cudnn", 1e-3}};
  CHECK(choose_attention({f.make("flash"), f.make("cudnn")}, f.timer(), opts()).chosen == "flash");
  CHECK(choose_attention({f.make("cudnn"), f.make("flash")}, f.timer(), opts()).chosen == "cudnn");

  AttentionTimer never = [](const std::function<void()>&) -> double {
    FAIL("timer called with one timed candidate");
    return 0;
  };
  const AttentionChoice r =
      choose_attention({f.make("flash"), f.make("exact", 0, true)}, never, opts());
  CHECK(r.chosen == "flash");
  CHECK(r.timings[0].iters == 0);
  CHECK_THAT(r.table(), Contains("candidate (the only one)"));

  CHECK_THROWS_WITH(choose_attention({f.make("exact", 0, true)}, never, opts()),
                    Contains("no attention kernel takes bf16 B=1"));
}

TEST_CASE("attention choice: a candidate that disagrees is refused with a named error",
          "[attention_choice]") {
  Fake f;
  f.seconds = {{"flash", 2e-3}, {"cudnn", 1e-3}};
  // cudnn 5% off, against the reference: refused, flash named as agreeing.
  const std::vector<AttentionCandidate> c = {f.make("flash", 2e-3), f.make("cudnn", 5e-2),
                                             f.make("exact", 0, true)};
  CHECK_THROWS_WITH(choose_attention(c, f.timer(), opts()),
                    Contains("train.attention=auto: attention kernels disagree on bf16 B=1 T=64") &&
                        Contains("flash vs cudnn: out relative error") &&
                        Contains("cudnn vs exact: out relative error 4.99e-02") &&
                        Contains("Refused: cudnn (disagrees with the reference kernel)") &&
                        Contains("train.attention=flash agrees with it"));
  CHECK(f.runs["cudnn"] == 1);  // refused before any timing

  // No reference: both named, no verdict on which is wrong.
  CHECK_THROWS_WITH(choose_attention({f.make("flash"), f.make("cudnn", 5e-2)}, f.timer(), opts()),
                    Contains("flash vs cudnn") && Contains("Choose one explicitly"));
  // A NaN in one output is a disagreement, never a pass.
  CHECK_THROWS_WITH(
      choose_attention({f.make("flash"), f.make("cudnn", 0, false, /*nan=*/true)}, f.timer(), opts()),
      Contains("relative error inf"));
  // Within the bound (bf16's 1e-2): accepted.
  CHECK(choose_attention({f.make("flash", 4e-3), f.make("cudnn", -4e-3), f.make("exact", 0, true)},
                         f.timer(), opts())
            .chosen == "cudnn");
  // The bound is the option's: tighter, the same kernels are refused.
  AttentionChoiceOptions tight = opts();
  tight.rel_bound = attention_rel_bound(DType::F32);
  tight.setting = "ADGT_ATTENTION=auto";
  CHECK_THROWS_WITH(choose_attention({f.make("flash", 4e-3), f.make("cudnn")}, f.timer(), tight),
                    Contains("ADGT_ATTENTION=auto"));
}

TEST_CASE("attention choice: a candidate whose first run throws is left out, named",
          "[attention_choice]") {
  Fake f;
  f.seconds = {{"flash", 2e-3}, {"cudnn", 1e-3}};
  AttentionCandidate broken = f.make("cudnn");
  broken.run = [] { throw std::runtime_error("graph->execute failed: CUDNN_STATUS_NOT_SUPPORTED"); };
  const AttentionChoice r =
      choose_attention({f.make("flash"), broken, f.make("exact", 0, true)}, f.timer(), opts());
  CHECK(r.chosen == "flash");
  REQUIRE(r.timings.size() == 2);  // flash and the reference
  REQUIRE(r.failed.size() == 1);
  CHECK_THAT(r.table(), Contains("left out (its first run failed): cudnn: graph->execute failed"));
  // Nothing timed left: an error naming the failures.
  CHECK_THROWS_WITH(choose_attention({broken, f.make("exact", 0, true)}, f.timer(), opts()),
                    Contains("no attention kernel takes") && Contains("CUDNN_STATUS_NOT_SUPPORTED"));
}

TEST_CASE("attention choice: relative error and per-dtype bounds", "[attention_choice]") {
  CHECK(attention_rel_err({3, 4}, {3, 4}) == 0);
  CHECK(attention_rel_err({0, 0}, {0, 0}) == 0);
  CHECK(attention_rel_err({3, 4}, {0, 0}) == Approx(1.0));
  CHECK(attention_rel_err({3, 4}, {3, 5}) == Approx(1 / std::sqrt(34.0)));
  CHECK(attention_rel_err({3, 5}, {3, 4}) == attention_rel_err({3, 4}, {3, 5}));
  CHECK(std::isinf(attention_rel_err({1}, {1, 2})));
  CHECK(std::isinf(attention_rel_err({1, std::nanf("")}, {1, 2})));
  CHECK(attention_rel_bound(DType::BF16) == 1e-2);
  CHECK(attention_rel_bound(DType::F32) < attention_rel_bound(DType::BF16));
  CHECK(attention_rel_bound(DType::F64) < attention_rel_bound(DType::F32));
}

TEST_CASE("train.attention: values, and the CPU and emulated backends' one kernel",
          "[attention_choice]") {
  CHECK(parse_attention_setting("auto", "train.attention") == AttentionSetting::Auto);
  CHECK(parse_attention_setting("cudnn", "train.attention") == AttentionSetting::Cudnn);
  CHECK(std::string(attention_setting_name(AttentionSetting::Flash)) == "flash");
  CHECK_THROWS_WITH(parse_attention_setting("fast", "ADGT_ATTENTION"),
                    Contains("ADGT_ATTENTION=fast not understood") && Contains("auto, flash"));
  for (const char* device : {"cpu", "emulated"}) {
    INFO(device);
    auto be = make_backend(device);
    CHECK_NOTHROW(configure_attention(*be, "auto"));
    CHECK_NOTHROW(configure_attention(*be, "exact"));
    CHECK_THROWS_WITH(configure_attention(*be, "flash"),
                      Contains("train.attention=flash") && Contains("one attention kernel (exact)") &&
                          Contains("auto or exact"));
    CHECK_THROWS_WITH(configure_attention(*be, "cudnn"), Contains("train.attention=cudnn"));
    CHECK_THROWS_WITH(configure_attention(*be, "sdpa"), Contains("train.attention=sdpa not understood"));
    // What the trainer broadcasts from rank 0 under auto: the one kernel,
    // which configure_attention then accepts on every rank.
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string k = probe_attention(*be, AttentionShape{2, 8, 4, 2, 16}, dt);
      CHECK(k == "exact");
      CHECK_NOTHROW(configure_attention(*be, k));
    }
  }
}
