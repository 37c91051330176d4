// Sustained-change detection for run-time adaptation
// (docs/adaptation.md): one series per measured quantity (a stage's forward
// time, a link's transfer time), one sample per step, taken before any
// collective evens the ranks out. A change is flagged when the median of the
// last `window` samples stays at least `threshold` away from the reference
// level for `confirm` consecutive steps: a single slow step (a page fault, a
// scheduler hiccup) moves a median of five by at most one rank and never
// flags; a straggler that persists does. Within the band the reference
// follows slow drift (an exponential average of the medians), so a clock
// that warms up over minutes is not a change.
//
// Deterministic and pure: fed the same samples, every rank flags at the same
// step (the samples themselves must be agreed first, e.g. an all-reduce of
// the per-rank times).
//
// The one detector of the adaptive layer: the schedule adapter keeps one per
// stage and link; the re-planner (control/replan_controller.hpp) keeps one
// per rank and link with a fixed reference (the slowdown the running layout
// was planned for: no drift, no warm-up beyond the window) and confirms over
// all of them together (some series out of band for `confirm` steps in a
// row, counted once every rank's window is full), through out_of_band()
// and full() instead of add()'s own count.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

namespace adgt::adapt {

struct DetectorOptions {
  double threshold = 0.10;  // relative change of the median that counts
                            // (make_schedule_adapter: parallel.adapt_threshold)
  int window = 5;           // samples in the running median
  int confirm = 5;          // consecutive out-of-band medians that flag
  int warmup = 10;          // samples before the first reference (the first steps are slow)
  double drift = 0.02;      // in-band weight of each median on the reference
};

// The median the adaptive layer takes of a window of samples: the element
// n/2 in sorted order (the upper one for even n). v must not be empty.
double upper_median(std::vector<double> v);

// The band every detector uses: a level at least `threshold` (relative) away
// from the reference is out of it.
bool out_of_band(double level, double reference, double threshold);

class ChangeDetector {
 public:
  explicit ChangeDetector(DetectorOptions o = {});
  // One step's sample (seconds, > 0). True on the step a sustained change is
  // confirmed; the reference then becomes the new level.
  bool add(double x);
  // The sample alone, for a caller that confirms over several series itself
  // (with the reference fixed by rebase(planned) and drift 0): the window and
  // its median move, the reference is set once the window is full, nothing
  // is counted or flagged.
  void record(double x);
  // The window holds `window` samples since construction or the last rebase.
  bool full() const { return int(recent_.size()) == o_.window; }
  // full(), with a reference, and the level out of band from it.
  bool out_of_band() const;
  // Samples in the window (0 right after a rebase).
  int count() const { return int(recent_.size()); }
  bool ready() const { return ref_ > 0; }
  double reference() const { return ref_; }  // 0 before warm-up ends
  double level() const { return median_; }    // the current running median
  // The last flagged change: new level / old level (1 before any).
  double last_ratio() const { return last_ratio_; }
  int64_t samples() const { return n_; }
  // After a re-plan changed what is measured: a new running median from the
  // next `window` samples, then compared with `planned` (the level the plan
  // used; > 0), so that a change that began before the re-plan is still
  // confirmed as one; planned <= 0: that median becomes the reference.
  void rebase(double planned = 0);

 private:
  // Puts x in the window; true once there is a reference to compare with.
  bool take(double x);
  DetectorOptions o_;
  std::deque<double> recent_;
  double ref_ = 0, median_ = 0, last_ratio_ = 1;
  double planned_ = 0;    // the reference after a rebase's warm-up (rebase)
  int out_ = 0;           // consecutive out-of-band medians
  int64_t n_ = 0, since_rebase_ = 0;
  int warmup_ = 0;
};

}  // namespace adgt::adapt
