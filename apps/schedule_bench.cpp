#include "apps/schedule_bench.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt::pp {
namespace {

BenchRow row_of(const Schedule& s, const StageCosts& c, double theory) {
  const Timeline r = time_schedule(s, c);
  BenchRow b;
  b.schedule = s.name;
  b.pp = s.pp, b.m = s.microbatches, b.v = s.virtual_stages;
  b.makespan = r.makespan;
  b.bubble_fraction = r.bubble_fraction;
  b.bubble_ratio = r.bubble_ratio;
  b.theory_ratio = theory;
  for (std::int64_t p : peak_inflight(s)) b.peak_inflight = std::max(b.peak_inflight, p);
  b.peak_inflight_stages = static_cast<double>(b.peak_inflight) / s.virtual_stages;
  return b;
}

StageCosts per_chunk(int pp, int v) {
  return StageCosts::uniform(pp * v, 1.0 / v, 1.0 / v, 1.0 / v);
}

void fill_vs_1f1b(std::vector<BenchRow>& rows) {
  for (BenchRow& r : rows)
    for (const BenchRow& o : rows)
      if (o.schedule == "1f1b" && o.pp == r.pp && o.m == r.m) r.vs_1f1b = r.makespan / o.makespan;
}

}  // namespace

double theory_bubble_ratio(const std::string& schedule, int pp, int m, int v) {
  const double p1 = pp - 1;
  if (schedule == "gpipe" || schedule == "1f1b") return p1 / m;
  if (schedule == "interleaved") return p1 / (static_cast<double>(v) * m);
  if (schedule == "zb-h1") return p1 / (3.0 * m);
  return std::numeric_limits<double>::quiet_NaN();
}

std::vector<BenchRow> bubble_table(int pp, const std::vector<int>& ms, int v) {
  std::vector<BenchRow> rows;
  const StageCosts c1 = per_chunk(pp, 1);
  for (int m : ms) {
    for (const char* name : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "greedy"}) {
      const std::string n = name;
      if (n == "zb-v" && pp < 2) continue;
      const int vv = n == "interleaved" ? v : n == "zb-v" ? 2 : 1;
      const Schedule s = n == "zb-v" ? zb_v(pp, m, per_chunk(pp, 2)) : make_schedule(n, pp, m, vv, c1, pp);
      rows.push_back(row_of(s, vv == 1 ? c1 : per_chunk(pp, vv), theory_bubble_ratio(n, pp, m, vv)));
    }
  }
  fill_vs_1f1b(rows);
  return rows;
}

std::vector<BenchRow> cost_table(int pp, const std::vector<int>& ms, const StageCosts& costs) {
  check_costs(costs, pp, "cost_table");
  std::vector<BenchRow> rows;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int m : ms)
    for (const char* name : {"gpipe", "1f1b", "zb-h1", "greedy"})
      rows.push_back(row_of(make_schedule(name, pp, m, 1, costs, pp), costs, nan));
  fill_vs_1f1b(rows);
  return rows;
}

std::vector<BenchRow> mismatches(const std::vector<BenchRow>& rows, double tol) {
  std::vector<BenchRow> bad;
  for (const BenchRow& r : rows)
    if (std::isfinite(r.theory_ratio) && std::fabs(r.bubble_ratio - r.theory_ratio) > tol) bad.push_back(r);
  return bad;
}

std::string format_table(const std::vector<BenchRow>& rows, bool theory) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-12s %3s %3s %2s  %9s  %8s  %12s", "schedule", "pp", "m", "v", "makespan",
                "vs 1F1B", "bubble/ideal");
  out += buf;
  if (theory) out += "    theory  check";
  out += "  bubble/(pp*makespan)  peak in-flight\n";
  for (const BenchRow& r : rows) {
    std::snprintf(buf, sizeof buf, "%-12s %3d %3d %2d  %9.4g  %8.4f  %11.2f%%", r.schedule.c_str(), r.pp, r.m, r.v,
                  r.makespan, r.vs_1f1b, 100 * r.bubble_ratio);
    out += buf;
    if (theory) {
      if (std::isfinite(r.theory_ratio)) {
        const bool ok = std::fabs(r.bubble_ratio - r.theory_ratio) <= 1e-9;
        std::snprintf(buf, sizeof buf, "  %7.2f%%  %5s", 100 * r.theory_ratio, ok ? "ok" : "DIFF");
      } else {
        std::snprintf(buf, sizeof buf, "  %8s  %5s", "-", "");
      }
      out += buf;
    }
    if (r.v > 1)
      std::snprintf(buf, sizeof buf, "  %19.2f%%  %lld chunks = %g stages\n", 100 * r.bubble_fraction,
                    static_cast<long long>(r.peak_inflight), r.peak_inflight_stages);
    else
      std::snprintf(buf, sizeof buf, "  %19.2f%%  %lld\n", 100 * r.bubble_fraction,
                    static_cast<long long>(r.peak_inflight));
    out += buf;
  }
  return out;
}

}  // namespace adgt::pp
