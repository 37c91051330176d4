// adgt-data prepare's progress on stderr (docs/data-format.md, "Streaming
// and --resume"): input bytes read of the total (the input files' sizes,
// known before reading), documents, tokens/s and the time left at the rate so
// far. `bar` rewrites one line (carriage return) a few times a second, for a
// terminal; `lines` prints a line every few seconds, for logs; `off` says
// nothing. `auto` is bar when stderr is a terminal, else lines.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace adgt::data {

enum class ProgressMode { Off, Bar, Lines };

// "auto", "bar", "lines" or "off" (throws naming --progress otherwise).
ProgressMode progress_mode(const std::string& arg);

class ProgressMeter {
 public:
  // `done_bytes`: input bytes already done before this run (a resume).
  ProgressMeter(ProgressMode mode, int64_t total_bytes, int64_t done_bytes = 0);
  // The running totals (bytes of input read, documents, tokens written);
  // prints when the interval has passed.
  void update(int64_t bytes, int64_t documents, int64_t tokens);
  void finish();  // a last line (and the bar's newline)

 private:
  void print(bool last);
  using Clock = std::chrono::steady_clock;
  ProgressMode mode_;
  int64_t total_, start_bytes_, bytes_ = 0, docs_ = 0, tokens_ = 0, start_tokens_ = -1;
  Clock::time_point t0_, last_;
  bool printed_ = false;
};

}  // namespace adgt::data
