#include "parallel/pipeline/print.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace adgt::pp {

std::string label(const Instr& in, int virtual_stages) {
  char letter = 'F';
  if (in.op == Op::BackwardInput || in.op == Op::Backward) letter = 'B';
  if (in.op == Op::BackwardWeight) letter = 'W';
  if (virtual_stages == 2 && in.chunk == 1) letter = static_cast<char>(std::tolower(letter));
  std::string s = std::string(1, letter) + std::to_string(in.microbatch);
  if (virtual_stages > 2) s += "." + std::to_string(in.chunk);
  return s;
}

namespace {
std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}
}  // namespace

std::string timeline(const Schedule& s, const Timeline& sim, const TimelineOptions& opt) {
  double unit = 0;
  size_t width = 1;
  for (const auto& rank : sim.timeline)
    for (const Interval& iv : rank) {
      const double d = iv.end - iv.start;
      if (d > 0 && (unit == 0 || d < unit)) unit = d;
      width = std::max(width, label(iv.instr, s.virtual_stages).size());
    }
  const double per_char =
      opt.time_per_char > 0 ? opt.time_per_char : (unit > 0 ? unit / static_cast<double>(width) : 1);
  auto col = [&](double t) { return static_cast<long>(std::llround(t / per_char)); };

  std::string out = s.name + ": pp=" + std::to_string(s.pp) + ", m=" + std::to_string(s.microbatches) +
                    ", v=" + std::to_string(s.virtual_stages) + "; one character = " +
                    fmt("%g", per_char) + " time units\n";
  if (!s.detail.empty()) out += "  (" + s.detail + ")\n";
  const std::string last_rank = std::to_string(s.pp - 1);
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    std::string row(static_cast<size_t>(std::max(0L, col(sim.makespan))), '.');
    long pos = 0;
    for (const Interval& iv : sim.timeline[r]) {
      const long a = std::max(pos, col(iv.start));
      const long b = std::max(a + 1, col(iv.end));
      if (static_cast<long>(row.size()) < b) row.resize(static_cast<size_t>(b), '.');
      const std::string l = label(iv.instr, s.virtual_stages);
      for (long c = a; c < b; ++c) {
        const size_t k = static_cast<size_t>(c - a);
        row[static_cast<size_t>(c)] = k < l.size() ? l[k] : '-';
      }
      pos = b;
    }
    std::string name = std::to_string(r);
    name.insert(0, last_rank.size() - name.size(), ' ');
    out += "rank " + name + " |" + row + "|\n";
  }
  double busy = 0;
  for (double b : sim.busy) busy += b;
  out += "makespan " + fmt("%g", sim.makespan) + ", ideal " + fmt("%g", s.pp ? busy / s.pp : 0) +
         " (compute per rank); predicted bubble " + fmt("%.1f%%", 100 * sim.bubble_fraction) +
         " of pp x makespan (idle / (pp x makespan)), " + fmt("%.1f%%", 100 * sim.bubble_ratio) +
         " of the ideal compute time (idle / busy)\n";
  out += "F forward, B backward (input part where W is separate), W weight gradient, - still running, . idle";
  if (s.virtual_stages == 2) out += "; lower case: chunk 1";
  if (s.virtual_stages > 2) out += "; .c: chunk c";
  out += "\n";
  return out;
}

}  // namespace adgt::pp
