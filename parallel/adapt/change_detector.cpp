// Sustained-change detection (change_detector.hpp).
#include "parallel/adapt/change_detector.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace adgt::adapt {

ChangeDetector::ChangeDetector(DetectorOptions o) : o_(o), warmup_(o.warmup) {
  if (o_.window < 1 || o_.confirm < 1 || o_.warmup < o_.window || !(o_.threshold > 0) ||
      o_.drift < 0 || o_.drift >= 1)
    throw std::invalid_argument(
        "ChangeDetector: needs window >= 1, confirm >= 1, warmup >= window, threshold > 0 and "
        "0 <= drift < 1");
}

void ChangeDetector::rebase(double planned) {
  ref_ = 0;
  planned_ = planned > 0 && std::isfinite(planned) ? planned : 0;
  out_ = 0;
  recent_.clear();
  since_rebase_ = 0;
  warmup_ = o_.window;
}

double upper_median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

bool out_of_band(double level, double reference, double threshold) {
  return std::abs(level / reference - 1) >= threshold;
}

bool ChangeDetector::take(double x) {
  if (!(x > 0) || !std::isfinite(x)) return false;  // a step that measured nothing
  ++n_;
  ++since_rebase_;
  recent_.push_back(x);
  if (int(recent_.size()) > o_.window) recent_.pop_front();
  median_ = upper_median(std::vector<double>(recent_.begin(), recent_.end()));
  if (ref_ == 0) {
    if (since_rebase_ < warmup_) return false;
    if (!(planned_ > 0)) {
      ref_ = median_;
      return false;
    }
    ref_ = planned_;  // the first full median is compared with the plan's level
    planned_ = 0;
  }
  return true;
}

void ChangeDetector::record(double x) { take(x); }

bool ChangeDetector::out_of_band() const {
  return full() && ref_ > 0 && adapt::out_of_band(median_, ref_, o_.threshold);
}

bool ChangeDetector::add(double x) {
  if (!take(x)) return false;
  if (!adapt::out_of_band(median_, ref_, o_.threshold)) {
    out_ = 0;
    ref_ = (1 - o_.drift) * ref_ + o_.drift * median_;
    return false;
  }
  if (++out_ < o_.confirm) return false;
  last_ratio_ = median_ / ref_;
  ref_ = median_;
  out_ = 0;
  return true;
}

}  // namespace adgt::adapt
