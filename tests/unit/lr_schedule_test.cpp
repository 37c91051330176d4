// The learning-rate schedule and what a resume with other schedule keys says.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/optimizer.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {
// The schedule from its definition (linear warm-up, cosine to min_lr), apart
// from lr_at: an independent reference.
double reference_lr(double lr, double min_lr, long warmup, long steps, long s) {
  if (s < warmup) return lr * double(s + 1) / double(warmup);
  const double p = std::min(1.0, double(s - warmup) / double(steps - warmup));
  return min_lr + (lr - min_lr) * (1 + std::cos(3.14159265358979323846 * p)) / 2;
}
}  // namespace

TEST_CASE("lr schedule: warm-up and cosine against the definition", "[optimizer]") {
  TrainConfig t;
  t.lr = 1e-3, t.min_lr = 1e-4, t.warmup_steps = 4, t.steps = 20;
  for (long s = 0; s < 25; ++s)
    CHECK(lr_at(t, s) == Approx(reference_lr(1e-3, 1e-4, 4, 20, s)).epsilon(1e-12));
}

TEST_CASE("lr schedule: a resume that changes train.steps says how the lr changes", "[optimizer]") {
  TrainConfig saved;
  saved.lr = 1e-3, saved.min_lr = 1e-4, saved.warmup_steps = 4, saved.steps = 20;
  CHECK(lr_schedule_change(saved, saved, 20).empty());  // same keys: nothing to say
  TrainConfig longer = saved;
  longer.steps = 30;
  const std::string m = lr_schedule_change(saved, longer, 20);
  char was[32], is[32];
  std::snprintf(was, sizeof was, "%.2e", reference_lr(1e-3, 1e-4, 4, 20, 20));  // min_lr: the end
  std::snprintf(is, sizeof is, "%.2e", reference_lr(1e-3, 1e-4, 4, 30, 20));   // back up the cosine
  CHECK(std::string(is) != std::string(was));
  CHECK_THAT(m, Contains("resuming at step 20 with train.steps=30 (the saved run's: 20)") &&
                    Contains("recomputed over 30 steps") &&
                    Contains(std::string("step 21 gets lr ") + is + " instead of " + was));
  // A key that changes nothing at this step is still named, with the lr kept.
  TrainConfig warm = saved;
  warm.warmup_steps = 2;
  CHECK_THAT(lr_schedule_change(saved, warm, 20), Contains("train.warmup_steps=2 (the saved run's: 4)") &&
                                                      Contains("step 21 keeps lr"));
}
