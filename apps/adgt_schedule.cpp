// adgt-schedule: the pipeline schedules side by side, or one drawn.
//
//   adgt-schedule                                   bubble table, pp=4, m in {4,8,16,32}, v=2
//   adgt-schedule --pp 8 --m 8,16 --v 4             another table
//   adgt-schedule --print zb-h1 --pp 4 --m 8        the timeline of one schedule
//   adgt-schedule --print greedy --pp 4 --m 8 --f 1,1,1,1.5 --b 1,1,1,1.5 --w 1 --comm 0.1
//
// The table simulates every schedule with F = B = W = 1 per stage and checks
// each bubble against its closed form (exit 1 on a mismatch), then compares
// 1F1B, ZB-H1 and greedy on unequal stage times (--f/--b/--w/--comm, or a
// built-in example with a heavier last stage and W = B/2); greedy must not
// lose to 1F1B.
#include <CLI/CLI.hpp>

#include "apps/cli_parse.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <exception>
#include <string>
#include <vector>

#include "apps/schedule_bench.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/print.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

using namespace adgt::pp;

namespace {

// One value for every stage, or one per stage.
std::vector<double> per_stage(const std::vector<double>& given, int stages, double fallback, const char* name) {
  if (given.empty()) return std::vector<double>(static_cast<size_t>(stages), fallback);
  if (given.size() == 1) return std::vector<double>(static_cast<size_t>(stages), given[0]);
  if (static_cast<int>(given.size()) != stages)
    throw ScheduleError(std::string("--") + name + " has " + std::to_string(given.size()) +
                        " values; give one, or one per stage (" + std::to_string(stages) + ")");
  return given;
}

std::string join(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%g", v[i]);
    s += (i ? "," : "") + std::string(buf);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-schedule: pipeline schedules simulated, checked and drawn (docs/pipeline-schedules.md)"};
  std::string print_name;
  int pp = 4;
  std::vector<int> ms;
  int v = 0;
  std::vector<double> f, b, w;
  double comm = 0;
  long long mem = 0;
  long long held = 0;
  std::string placement_s;
  app.add_option("--print", print_name,
                 "draw the timeline of one schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v, greedy");
  app.add_option("--placement", placement_s,
                 "where stages sit: looped (stage c*pp + r on rank r) or vee (stages r and 2pp-1-r; "
                 "greedy with --v 2); default vee for zb-v, else looped");
  app.add_option("--pp", pp, "pipeline ranks (default 4)");
  app.add_option("--m", ms, "micro-batches; a list for the table (default 4,8,16,32), one value for --print (default 8)")
      ->delimiter(',');
  app.add_option("--v", v, "chunks per rank for interleaved or greedy (default 2 for interleaved, else 1)");
  app.add_option("--f", f, "forward time per stage: one value or one per stage (default 1)")->delimiter(',');
  app.add_option("--b", b, "input-gradient time per stage (default 1)")->delimiter(',');
  app.add_option("--w", w, "weight-gradient time per stage (default 1)")->delimiter(',');
  app.add_option("--comm", comm, "latency of one activation or gradient message (default 0)");
  app.add_option("--mem", mem, "greedy: activations in flight per rank (default pp, as 1F1B)");
  app.add_option("--held", held,
                 "greedy: most activations a rank may hold to its last backward, summed over its chunks "
                 "(default: no limit)");
  ADGT_CLI_PARSE(app, argc, argv);

  try {
    const bool custom = !f.empty() || !b.empty() || !w.empty() || comm != 0;
    if (!print_name.empty()) {
      if (ms.size() > 1) throw ScheduleError("--print takes one --m value, got " + std::to_string(ms.size()));
      const int m = ms.empty() ? 8 : ms[0];
      const int vv = v > 0 ? v : (print_name == "interleaved" || print_name == "zb-v" ? 2 : 1);
      const std::string pname = placement_s.empty() ? (print_name == "zb-v" ? "vee" : "looped") : placement_s;
      const auto place = adgt::parse_stage_placement(pname);
      if (!place) throw ScheduleError("--placement " + pname + ": use looped or vee");
      check_schedule_args(print_name, pp, vv, m, *place);
      const int stages = pp * vv;
      // Given times are per stage of the whole model split pp ways; a chunk does 1/v of it.
      StageCosts c;
      c.f = per_stage(f, stages, 1.0 / vv, "f");
      c.b = per_stage(b, stages, 1.0 / vv, "b");
      c.w = per_stage(w, stages, 1.0 / vv, "w");
      c.comm = comm;
      const Schedule s = make_schedule(print_name, pp, m, vv, c, mem,
                                       held > 0 ? held : std::numeric_limits<std::int64_t>::max(), *place);
      validate(s);
      const Timeline r = time_schedule(s, c);
      std::fputs(timeline(s, r).c_str(), stdout);
      std::printf("stage times: f %s; b %s; w %s; comm %g\n", join(c.f).c_str(), join(c.b).c_str(),
                  join(c.w).c_str(), c.comm);
      std::string peaks, sends;
      const auto pk = peak_inflight(s);
      for (int i = 0; i < pp; ++i) {
        peaks += (i ? " " : "") + std::to_string(pk[static_cast<size_t>(i)]);
        sends += (i ? " " : "") + std::to_string(r.max_outstanding_sends[static_cast<size_t>(i)]);
      }
      std::printf("peak activations in flight per rank%s: %s; most sends outstanding per rank: %s\n",
                  vv > 1 ? " (in chunks)" : "", peaks.c_str(), sends.c_str());
      std::printf("most activations held to the last backward, summed over a rank's chunks: %lld%s\n",
                  static_cast<long long>(max_held_activations(s)), s.detail.empty() ? "" : ("; " + s.detail).c_str());
      return 0;
    }

    if (ms.empty()) ms = {4, 8, 16, 32};
    const int vv = v > 0 ? v : 2;
    int status = 0;
    std::printf("Equal stage times (F = B = W = 1 per stage, 1/v per chunk; 1F1B, GPipe and interleaved fuse B+W), "
                "comm 0:\n\n");
    const auto rows = bubble_table(pp, ms, vv);
    std::fputs(format_table(rows, true).c_str(), stdout);
    const auto bad = mismatches(rows);
    if (bad.empty()) {
      size_t n = 0;
      for (const BenchRow& r : rows) n += std::isfinite(r.theory_ratio) ? 1 : 0;
      std::printf("\ncheck: all %zu closed forms match the simulation (|diff| <= 1e-9)\n", n);
    } else {
      status = 1;
      for (const BenchRow& r : bad)
        std::printf("check FAILED: %s pp=%d m=%d v=%d: simulated %.6f, theory %.6f\n", r.schedule.c_str(), r.pp,
                    r.m, r.v, r.bubble_ratio, r.theory_ratio);
    }

    StageCosts c;
    if (custom) {
      c.f = per_stage(f, pp, 1, "f");
      c.b = per_stage(b, pp, 1, "b");
      c.w = per_stage(w, pp, 1, "w");
      c.comm = comm;
    } else {
      // The last stage also carries the final norm, the head and the loss; the
      // weight gradient is cheaper than the input gradient (attention's
      // backward has no weights).
      c = StageCosts::uniform(pp, 1, 1, 0.5, 0.05);
      c.f.back() = 1.3, c.b.back() = 1.3, c.w.back() = 0.6;
    }
    std::printf("\nUnequal stage times: f %s; b %s; w %s; comm %g; greedy memory limit %d:\n\n",
                join(c.f).c_str(), join(c.b).c_str(), join(c.w).c_str(), c.comm, pp);
    const auto crows = cost_table(pp, ms, c);
    std::fputs(format_table(crows, false).c_str(), stdout);
    for (const BenchRow& r : crows)
      if (r.schedule == "greedy" && (r.vs_1f1b > 1 + 1e-12 || r.peak_inflight > pp)) {
        status = 1;
        std::printf("check FAILED: greedy m=%d: makespan %.4g x 1F1B, peak in-flight %lld (limit %d)\n", r.m,
                    r.vs_1f1b, static_cast<long long>(r.peak_inflight), pp);
      }
    if (status == 0) std::printf("\ncheck: greedy <= 1F1B makespan within the memory limit for every m\n");
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
