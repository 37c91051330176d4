#include "parallel/metrics/tei_meter.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/cost/flops.hpp"

namespace adgt {

namespace {
const auto g_loaded = std::chrono::steady_clock::now();  // the fallback process start

using json = nlohmann::json;

json counters_json(const TeiCounters& c) {
  return {{"steps", c.steps},           {"skipped_steps", c.skipped_steps},
          {"wall_s", c.wall_s},         {"startup_s", c.startup_s},
          {"step_s", c.step_s},         {"comm_s", c.comm_s},
          {"bubble_s", c.bubble_s},     {"optimizer_s", c.optimizer_s},
          {"checkpoint_s", c.checkpoint_s}, {"eval_s", c.eval_s},
          {"skipped_s", c.skipped_s},   {"model_flops", c.model_flops},
          {"recompute_flops", c.recompute_flops}};
}

TeiCounters counters_of(const json& j) {
  TeiCounters c;
  c.steps = j.at("steps").get<int64_t>();
  c.skipped_steps = j.at("skipped_steps").get<int64_t>();
  c.wall_s = j.at("wall_s").get<double>();
  c.startup_s = j.at("startup_s").get<double>();
  c.step_s = j.at("step_s").get<double>();
  c.comm_s = j.at("comm_s").get<double>();
  c.bubble_s = j.at("bubble_s").get<double>();
  c.optimizer_s = j.at("optimizer_s").get<double>();
  c.checkpoint_s = j.at("checkpoint_s").get<double>();
  c.eval_s = j.at("eval_s").get<double>();
  c.skipped_s = j.at("skipped_s").get<double>();
  c.model_flops = j.at("model_flops").get<double>();
  c.recompute_flops = j.at("recompute_flops").get<double>();
  return c;
}

json breakdown_json(const TeiBreakdown& b) {
  return {{"useful", b.useful},         {"below_peak", b.below_peak}, {"recompute", b.recompute},
          {"comm", b.comm},             {"bubble", b.bubble},         {"optimizer", b.optimizer},
          {"checkpoint", b.checkpoint}, {"eval", b.eval},             {"startup", b.startup},
          {"lost", b.lost},             {"other", b.other}};
}

// Only the checkpoint snapshots and the last one matter to the accounting.
void add_snapshot(TeiRun& r, const TeiSnapshot& s) {
  if (!r.snapshots.empty() && !r.snapshots.back().checkpoint) r.snapshots.pop_back();
  r.snapshots.push_back(s);
}

const char* at_name(TeiMeter::At at) {
  switch (at) {
    case TeiMeter::At::Interval: return "interval";
    case TeiMeter::At::Checkpoint: return "checkpoint";
    case TeiMeter::At::End: return "end";
  }
  return "?";
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

double process_age_seconds() {
  const double loaded =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - g_loaded).count();
  // Field 22 of /proc/self/stat is the start time in clock ticks after boot;
  // the fields after the command name (which may hold spaces) start at 3.
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string line;
  double uptime = -1;
  if (!std::getline(stat, line) || !(up >> uptime)) return loaded;
  const size_t p = line.rfind(')');
  const long hz = sysconf(_SC_CLK_TCK);
  if (p == std::string::npos || hz <= 0) return loaded;
  std::istringstream in(line.substr(p + 1));
  std::string tok;
  for (int field = 3; field <= 22; ++field)
    if (!(in >> tok)) return loaded;
  const double age = uptime - std::stod(tok) / double(hz);
  // A clock that disagrees (a time namespace): the static initialisation's.
  return age >= loaded - 0.05 && age < loaded + 3600 ? std::max(age, loaded) : loaded;
}

std::vector<TeiRun> read_tei_runs(const std::string& metrics_path) {
  std::vector<TeiRun> runs;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\"") == std::string::npos) continue;
    try {
      const json j = json::parse(line);
      const std::string ev = j.value("event", "");
      if (ev == "run_start") {
        TeiRun r;
        r.id = j.at("run").get<int>();
        r.resumed_from = j.at("resumed_from").get<int64_t>();
        r.start_unix = j.at("start_unix").get<double>();
        r.devices = j.at("devices").get<int>();
        r.peak_flops = j.at("peak_tflops").get<double>() * 1e12;
        runs.push_back(std::move(r));
      } else if (ev == "tei" && !runs.empty()) {
        TeiSnapshot s;
        s.step = j.at("step").get<int64_t>();
        s.checkpoint = j.at("at").get<std::string>() == "checkpoint";
        s.c = counters_of(j.at("counters"));
        TeiRun& r = runs.back();
        r.peak_flops = j.at("peak_tflops").get<double>() * 1e12;
        add_snapshot(r, s);
      }
    } catch (const json::exception&) {
      // a torn line of a killed run, or a record of another kind
    }
  }
  return runs;
}

void end_torn_line(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() <= 0) return;
  in.seekg(-1, std::ios::end);
  char last = '\n';
  in.get(last);
  in.close();
  if (last != '\n') std::ofstream(path, std::ios::app | std::ios::binary) << '\n';
}

TeiMeter::TeiMeter(const RunConfig& cfg, int devices, MetricsLog* log, std::vector<TeiRun> earlier,
                   int64_t resumed_from, double peak_tflops)
    : log_(log), devices_(devices), runs_(std::move(earlier)) {
  const double tokens = double(cfg.train.global_batch * cfg.model.seq_len);
  flops_per_step_ = mfu_flops_per_token(cfg.model) * tokens;
  recompute_per_step_ = recompute_flops_per_token(cfg) * tokens;
  const double age = process_age_seconds();
  process_start_ = std::chrono::steady_clock::now() -
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(age));
  if (!log_) return;
  TeiRun me;
  me.id = runs_.empty() ? 1 : runs_.back().id + 1;
  me.resumed_from = resumed_from;
  me.start_unix = unix_now() - age;
  me.devices = devices;
  me.peak_flops = peak_tflops * 1e12;
  runs_.push_back(me);
  log_->log_record({{"event", "run_start"},
                    {"run", me.id},
                    {"start_unix", me.start_unix},
                    {"resumed_from", resumed_from},
                    {"devices", devices},
                    {"peak_tflops", peak_tflops},
                    {"model_flops_per_step", flops_per_step_},
                    {"recompute_flops_per_step", recompute_per_step_}});
}

void TeiMeter::start_step() {
  if (started_) return;
  started_ = true;
  c_.startup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start_).count();
}

void TeiMeter::add_step(const TeiStepTimes& t, bool applied) {
  ++c_.steps;
  if (!applied) {
    ++c_.skipped_steps;
    c_.skipped_s += t.seconds;
    return;
  }
  c_.step_s += t.seconds;
  c_.comm_s += t.comm_s;
  c_.bubble_s += t.bubble_s;
  c_.optimizer_s += t.optimizer_s;
  c_.model_flops += flops_per_step_;
  c_.recompute_flops += recompute_per_step_;
}

TeiBreakdown TeiMeter::record(Comm& world, At at, int64_t step, double peak_tflops) {
  TeiCounters c = c_;
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start_).count();
  if (!started_) c.startup_s = c.wall_s;  // no step yet: all of it was start-up
  // Device-seconds: each rank's seconds summed over the world.
  double v[9] = {c.wall_s,      c.startup_s,    c.step_s, c.comm_s,   c.bubble_s,
                 c.optimizer_s, c.checkpoint_s, c.eval_s, c.skipped_s};
  if (world.size() > 1) world.all_reduce(Tensor(v, DType::F64, {9}));
  if (!log_) return {};
  c.wall_s = v[0], c.startup_s = v[1], c.step_s = v[2], c.comm_s = v[3], c.bubble_s = v[4];
  c.optimizer_s = v[5], c.checkpoint_s = v[6], c.eval_s = v[7], c.skipped_s = v[8];
  TeiRun& me = runs_.back();
  me.peak_flops = peak_tflops * 1e12;
  add_snapshot(me, {step, at == At::Checkpoint, c});
  const TeiBreakdown b = tei_account(runs_);
  json rec = {{"event", "tei"},       {"at", at_name(at)},
              {"run", me.id},         {"step", step},
              {"peak_tflops", peak_tflops}, {"devices", devices_},
              {"counters", counters_json(c)}};
  rec["tei"] = b.valid ? json(b.tei) : json(nullptr);
  if (b.valid) rec["breakdown"] = breakdown_json(b);
  rec["job"] = {{"runs", b.runs},
                {"wall_s", b.wall_s},
                {"device_s", b.device_s},
                {"gap_s", b.gap_s},
                {"capacity_flops", b.capacity_flops},
                {"counted_flops", b.counted_flops},
                {"counted_steps", b.counted_steps},
                {"lost_steps", b.lost_steps}};
  if (at == At::End)
    if (json e = run_energy_json(energy_); !e.empty()) rec["energy"] = std::move(e);
  log_->log_record(rec);
  return b;
}

}  // namespace adgt
