// adgt-data prepare's progress on stderr (progress_meter.hpp).
#include "core/data/prepare/progress_meter.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace adgt::data {
namespace {

constexpr double kBarSeconds = 0.25, kLineSeconds = 5.0;

std::string clock_text(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const long t = long(s + 0.5);
  char b[32];
  std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  return b;
}

}  // namespace

ProgressMode progress_mode(const std::string& arg) {
  if (arg == "auto") return ::isatty(2) ? ProgressMode::Bar : ProgressMode::Lines;
  if (arg == "bar") return ProgressMode::Bar;
  if (arg == "lines") return ProgressMode::Lines;
  if (arg == "off") return ProgressMode::Off;
  throw std::runtime_error("--progress '" + arg + "': use auto, bar, lines or off");
}

ProgressMeter::ProgressMeter(ProgressMode mode, int64_t total_bytes, int64_t done_bytes)
    : mode_(mode), total_(total_bytes), start_bytes_(done_bytes), bytes_(done_bytes), t0_(Clock::now()), last_(t0_) {}

void ProgressMeter::update(int64_t bytes, int64_t documents, int64_t tokens) {
  bytes_ = bytes, docs_ = documents, tokens_ = tokens;
  if (start_tokens_ < 0) start_tokens_ = tokens;
  if (mode_ == ProgressMode::Off) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (since < (mode_ == ProgressMode::Bar ? kBarSeconds : kLineSeconds)) return;
  last_ = now;
  print(false);
}

void ProgressMeter::finish() {
  if (mode_ == ProgressMode::Off) return;
  print(true);
}

void ProgressMeter::print(bool last) {
  const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
  const double mb = 1e-6 * double(bytes_), total_mb = 1e-6 * double(total_);
  const double pct = total_ > 0 ? 100.0 * double(bytes_) / double(total_) : 100.0;
  const double tok_s = t > 0 ? double(tokens_ - std::max<int64_t>(start_tokens_, 0)) / t : 0.0;
  const double byte_s = t > 0 ? double(bytes_ - start_bytes_) / t : 0.0;
  const std::string eta = last ? "done in " + clock_text(t)
                               : "ETA " + (byte_s > 0 ? clock_text(double(total_ - bytes_) / byte_s) : "?");
  char line[256];
  std::snprintf(line, sizeof line, "prepare %5.1f%% %.1f/%.1f MB, %lld documents, %.3g M tokens/s, %s", pct, mb,
                total_mb, static_cast<long long>(docs_), 1e-6 * tok_s, eta.c_str());
  if (mode_ == ProgressMode::Bar) {
    std::fprintf(stderr, "\r%-100s%s", line, last ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
  printed_ = true;
}

}  // namespace adgt::data
