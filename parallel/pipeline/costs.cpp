#include "parallel/pipeline/costs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "parallel/pipeline/instruction.hpp"

namespace adgt::pp {

StageCosts StageCosts::uniform(int stages, double f, double b, double w, double comm) {
  StageCosts c;
  c.f.assign(static_cast<size_t>(stages), f);
  c.b.assign(static_cast<size_t>(stages), b);
  c.w.assign(static_cast<size_t>(stages), w);
  c.comm = comm;
  return c;
}

double StageCosts::message(int from, int to, int pp) const {
  if (from == to && from >= 0) return 0.0;  // vee's turn on rank pp-1: handed over in memory
  if (link.empty() || pp < 2 || from < 0 || to < 0) return comm;
  int k = std::min(from, to);
  if (std::abs(from - to) != 1) k = pp - 1;  // the wrap link (pp - 1 <-> 0)
  return k >= 0 && k < static_cast<int>(link.size()) ? link[static_cast<size_t>(k)] : comm;
}

void check_costs(const StageCosts& c, int stages, const std::string& what) {
  const std::string n = std::to_string(stages);
  auto sized = [&](const std::vector<double>& v, const char* name) {
    if (static_cast<int>(v.size()) != stages)
      throw ScheduleError(what + ": stage costs " + name + " has " + std::to_string(v.size()) +
                          " entries; the schedule has " + n + " stages (pp x virtual_stages)");
  };
  sized(c.f, "f");
  sized(c.b, "b");
  sized(c.w, "w");
  for (int s = 0; s < stages; ++s) {
    const size_t i = static_cast<size_t>(s);
    auto bad = [&](const char* name, double v, const char* rule) {
      throw ScheduleError(what + ": stage costs " + name + "[" + std::to_string(s) + "]=" + std::to_string(v) +
                          ": must be " + rule);
    };
    if (!std::isfinite(c.f[i]) || c.f[i] <= 0) bad("f", c.f[i], "> 0");
    if (!std::isfinite(c.b[i]) || c.b[i] <= 0) bad("b", c.b[i], "> 0");
    if (!std::isfinite(c.w[i]) || c.w[i] < 0) bad("w", c.w[i], ">= 0");
  }
  if (!std::isfinite(c.comm) || c.comm < 0)
    throw ScheduleError(what + ": stage costs comm=" + std::to_string(c.comm) + ": must be >= 0");
  for (size_t k = 0; k < c.link.size(); ++k)
    if (!std::isfinite(c.link[k]) || c.link[k] < 0)
      throw ScheduleError(what + ": stage costs link[" + std::to_string(k) + "]=" +
                          std::to_string(c.link[k]) + ": must be >= 0");
  for (size_t k = 0; k < c.jitter.size(); ++k)
    if (!std::isfinite(c.jitter[k]) || c.jitter[k] <= 0)
      throw ScheduleError(what + ": stage costs jitter[" + std::to_string(k) + "]=" +
                          std::to_string(c.jitter[k]) + ": must be > 0");
}

}  // namespace adgt::pp
