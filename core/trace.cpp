#include "core/trace.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace adgt::trace {

void Recorder::start(std::function<double()> clock, double origin) {
  std::lock_guard<std::mutex> lock(mu_);
  clock_ = std::move(clock);
  origin_ = origin;
  on_.store(true, std::memory_order_relaxed);
}

void Recorder::stop() { on_.store(false, std::memory_order_relaxed); }

double Recorder::now() const { return on() && clock_ ? clock_() - origin_ : 0.0; }

void Recorder::span(std::string name, std::string_view cat, double t0, double t1, int track,
                    std::string args) {
  if (!on()) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({std::move(name), std::string(cat), track, t0, std::max(t0, t1), std::move(args)});
}

void Recorder::instant(std::string name, std::string_view cat, std::string args, int track) {
  if (!on()) return;
  const double t = now();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({std::move(name), std::string(cat), track, t, -1.0, std::move(args)});
}

std::vector<Event> Recorder::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(events_, {});
}

Recorder& recorder() {
  static Recorder r;
  return r;
}

Span::Span(std::string_view name, std::string_view cat, int track)
    : on_(recorder().on()), ranges_(recorder().ranges()) {
  if (!on_ && !ranges_) return;
  name_ = name;
  if (ranges_) ranges_->range_push(name_.c_str());
  if (!on_) return;
  cat_ = cat;
  track_ = track;
  t0_ = recorder().now();
}

Span::~Span() {
  if (on_) recorder().span(name_, cat_, t0_, recorder().now(), track_, std::move(args_));
  if (ranges_) ranges_->range_pop();
}

std::string rank_name(int world_rank, const Layout& lay, const RankCoords& c) {
  std::string s = "rank " + std::to_string(world_rank) + " (tp " + std::to_string(c.tp);
  if (lay.cp > 1) s += ", cp " + std::to_string(c.cp);
  s += ", pp " + std::to_string(c.pp) + ", dp " + std::to_string(c.dp);
  if (lay.ep > 1) s += ", ep " + std::to_string(c.ep);
  return s + ")";
}

namespace {
// Microseconds, the unit of Chrome trace timestamps, to the nanosecond.
double us(double s) { return std::round(s * 1e9) / 1e3; }
}  // namespace

std::string chrome_events(int pid, const std::string& process, int sort, const std::vector<Event>& events,
                          const std::vector<std::pair<int, std::string>>& track_names) {
  using nlohmann::json;
  std::string out;
  auto add = [&](const json& j) {
    if (!out.empty()) out += ",\n";
    out += j.dump();
  };
  add({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process}}}});
  add({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", sort}}}});
  for (const auto& [tid, name] : track_names)
    add({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  for (const Event& e : events) {
    json j = {{"name", e.name}, {"cat", e.cat}, {"pid", pid}, {"tid", e.track}, {"ts", us(e.start)}};
    if (e.instant()) {
      j["ph"] = "i";
      j["s"] = "p";  // an instant of the whole rank
    } else {
      j["ph"] = "X";
      j["dur"] = us(e.end) - us(e.start);
    }
    if (!e.args.empty()) j["args"] = json::parse(e.args);
    add(j);
  }
  return out;
}

std::string chrome_trace(const std::vector<std::string>& parts, const std::string& about) {
  std::string out = "{\"displayTimeUnit\": \"ms\",\n\"otherData\": " + (about.empty() ? "{}" : about) +
                    ",\n\"traceEvents\": [\n";
  bool first = true;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!first) out += ",\n";
    out += p;
    first = false;
  }
  return out + "\n]}\n";
}

}  // namespace adgt::trace
