#include "parallel/pipeline/timeline.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace adgt::pp {
namespace {

size_t U(int i) { return static_cast<size_t>(i); }

double duration(const StageCosts& c, int st, Op op) {
  switch (op) {
    case Op::Forward: return c.f[U(st)];
    case Op::BackwardInput: return c.b[U(st)];
    case Op::BackwardWeight: return c.w[U(st)];
    case Op::Backward: return c.b[U(st)] + c.w[U(st)];
    default: return 0;
  }
}

}  // namespace

Timeline time_schedule(const Schedule& s, const StageCosts& costs) { return time_schedule(s, costs, {}); }

double expected_makespan(const Schedule& s, const StageCosts& costs, std::uint64_t seed) {
  const int samples = costs.jitter_samples;
  if (costs.jitter.empty() || samples < 1) return time_schedule(s, costs).makespan;
  // splitmix64: a small, seedable generator whose draws do not depend on
  // the standard library's implementation.
  std::uint64_t state = seed;
  const auto next = [&state] {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const size_t n = costs.jitter.size();
  double sum = 0;
  for (int k = 0; k < samples; ++k)
    sum += time_schedule(s, costs, [&](int, int) { return costs.jitter[size_t(next() % n)]; }).makespan;
  return sum / samples;
}

Timeline time_schedule(const Schedule& s, const StageCosts& costs,
                   const std::function<double(int rank, int index)>& scale) {
  check_costs(costs, s.num_stages(), "simulate " + s.name);
  if (static_cast<int>(s.ranks.size()) != s.pp)
    throw ScheduleError("simulate " + s.name + ": " + std::to_string(s.ranks.size()) + " rank lists for pp=" +
                        std::to_string(s.pp));
  constexpr double kUnsent = -1;
  const size_t n = 2 * U(s.num_stages()) * U(s.microbatches);
  std::vector<double> arrival(n, kUnsent);  // when each message is there
  std::vector<int> sender(n, -1);
  std::vector<double> sent_at(n, 0);
  // Per sending rank, (time sent, time received) of each message.
  std::vector<std::vector<std::pair<double, double>>> in_transit(U(s.pp));

  Timeline res;
  res.timeline.resize(U(s.pp));
  std::vector<double> clock(U(s.pp), 0.0);
  std::vector<int> pc(U(s.pp), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& list = s.ranks[U(r)];
      for (int& i = pc[U(r)]; i < static_cast<int>(list.size()); ++i) {
        const Instr& in = list[U(i)];
        if (is_recv(in.op)) {
          const size_t k = message_slot(s, message_of(s, r, in));
          if (arrival[k] == kUnsent) break;
          clock[U(r)] = std::max(clock[U(r)], arrival[k]);
          if (sender[k] >= 0) in_transit[U(sender[k])].push_back({sent_at[k], clock[U(r)]});
        } else if (is_send(in.op)) {
          const size_t k = message_slot(s, message_of(s, r, in));
          arrival[k] = clock[U(r)] + costs.message(r, in.peer, s.pp);
          sender[k] = r;
          sent_at[k] = clock[U(r)];
        } else if (is_compute(in.op)) {
          const double d = duration(costs, s.stage(r, in.chunk), in.op) * (scale ? scale(r, i) : 1.0);
          res.timeline[U(r)].push_back({i, in, clock[U(r)], clock[U(r)] + d});
          clock[U(r)] += d;
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.pp; ++r)
    if (pc[U(r)] < static_cast<int>(s.ranks[U(r)].size()))
      throw ScheduleError("simulate " + s.name + ": rank " + std::to_string(r) + " cannot get past #" +
                          std::to_string(pc[U(r)]) + " " + to_string(s.ranks[U(r)][U(pc[U(r)])]) +
                          "; validate() names the cause");

  res.makespan = 0;
  for (double c : clock) res.makespan = std::max(res.makespan, c);
  double idle = 0, busy = 0;
  for (int r = 0; r < s.pp; ++r) {
    double b = 0;
    for (const Interval& iv : res.timeline[U(r)]) b += iv.end - iv.start;
    res.busy.push_back(b);
    res.idle.push_back(res.makespan - b);
    busy += b;
    idle += res.makespan - b;
  }
  res.bubble_fraction = res.makespan > 0 ? idle / (s.pp * res.makespan) : 0;
  res.bubble_ratio = busy > 0 ? idle / busy : 0;
  // Outstanding sends: a sweep over (send, +1) and (receive, -1) events.
  for (int r = 0; r < s.pp; ++r) {
    std::vector<std::pair<double, int>> ev;
    for (auto [a, b] : in_transit[U(r)]) {
      ev.push_back({a, +1});
      ev.push_back({b, -1});
    }
    std::sort(ev.begin(), ev.end());  // at equal times the receive (-1) first
    int now = 0, peak = 0;
    for (auto [t, d] : ev) peak = std::max(peak, now += d);
    res.max_outstanding_sends.push_back(peak);
  }
  return res;
}

}  // namespace adgt::pp
