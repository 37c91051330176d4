#include "core/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/trace.hpp"

namespace adgt {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(t / 3600), long(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", long(t / 60), long(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lds", long(t));
  return buf;
}

std::string format_step_line(const StepMetrics& m) {
  char mfu[64];
  if (m.mfu >= 0)
    std::snprintf(mfu, sizeof mfu, "MFU %5.1f%% of %.3g TFLOP/s", 100.0 * m.mfu, m.peak_tflops);
  else
    std::snprintf(mfu, sizeof mfu, "MFU n/a");
  const int w = int(std::to_string(m.total_steps).size());
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %*ld/%ld | loss %.4f | lr %.3e | gnorm %.3f | %.0f tok/s | %.4f TFLOP/s | "
                "%s | elapsed %s | eta %s",
                w, long(m.step), long(m.total_steps), m.loss, m.lr, m.grad_norm, m.tokens_per_s,
                m.tflops, mfu, format_duration(m.elapsed_s).c_str(),
                format_duration(m.eta_s).c_str());
  std::string line = buf;
  if (m.world > 1) {
    char comm[128];
    std::snprintf(comm, sizeof comm, " | comm tp %.2f MB dp %.2f MB", m.tp_bytes / 1e6,
                  m.dp_bytes / 1e6);
    line += comm;
    if (m.bubble >= 0) {
      std::snprintf(comm, sizeof comm, " pp %.2f MB | bubble %.1f%%", m.pp_bytes / 1e6,
                    100.0 * m.bubble);
      line += comm;
    }
  }
  if (m.world > 1) {  // exposed communication: the compute waited this long on each group
    std::string w;
    char x[48];
    for (auto [name, s] : {std::pair<const char*, double>{"tp", m.tp_wait_s}, {"dp", m.dp_wait_s},
                           {"pp", m.pp_wait_s}, {"ep", m.ep_wait_s}, {"cp", m.cp_wait_s}})
      if (s >= 0) {
        std::snprintf(x, sizeof x, " %s %.1f ms", name, 1e3 * s);
        w += x;
      }
    if (!w.empty()) line += " | wait" + w;
  }
  if (!m.grad_compression.empty()) {
    char gc[160];
    std::snprintf(gc, sizeof gc, " | gc %s dp %.2f MB of fp32 %.2f MB", m.grad_compression.c_str(),
                  m.gc_sent_bytes / 1e6, m.gc_fp32_bytes / 1e6);
    line += gc;
  }
  if (!m.moe.empty()) {
    double imb = 0, aux = 0;
    int64_t dropped = 0, bytes = 0;
    for (const auto& x : m.moe) {
      imb = std::max(imb, x.imbalance());
      aux += x.aux / double(m.moe.size());
      dropped += x.dropped;
      bytes += x.a2a_bytes;
    }
    char moe[160];
    std::snprintf(moe, sizeof moe, " | moe imbalance %.2f aux %.3f dropped %ld a2a %.2f MB", imb,
                  aux, long(dropped), bytes / 1e6);
    line += moe;
  }
  {  // telemetry: the mean over the ranks and samples, where measured
    std::string hw;
    char x[48];
    for (const TelemetryStat& t : m.telemetry) {
      if (t.name == "power_w") std::snprintf(x, sizeof x, " power %.0f W", t.mean);
      else if (t.name == "sm_clock_mhz") std::snprintf(x, sizeof x, " sm %.0f MHz", t.mean);
      else continue;
      hw += x;
    }
    if (!hw.empty()) line += " |" + hw;
  }
  if (m.skipped_steps) line += " | skipped " + std::to_string(m.skipped_steps);
  return line;
}

double MoeLayerMetrics::imbalance() const {
  if (load.empty()) return 0;
  int64_t mx = 0, sum = 0;
  for (int64_t x : load) {
    mx = std::max(mx, x);
    sum += x;
  }
  return sum > 0 ? double(mx) * double(load.size()) / double(sum) : 0;
}

MetricsLog::MetricsLog(const std::string& dir, bool append) {
  std::filesystem::create_directories(dir);
  path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
  out_.open(path_, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot open " + path_ + " for writing (log.dir)");
}

void MetricsLog::log_step(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},         {"loss", m.loss},
                      {"lr", m.lr},             {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s}, {"tflops", m.tflops},
                      {"elapsed_s", m.elapsed_s}, {"eta_s", m.eta_s},
                      {"skipped_steps", m.skipped_steps}};
  j["mfu"] = m.mfu >= 0 ? nlohmann::json(m.mfu) : nlohmann::json(nullptr);
  j["peak_tflops"] = m.peak_tflops;
  j["world"] = m.world;
  j["comm_bytes"] = {{"tp", m.tp_bytes}, {"dp", m.dp_bytes}, {"pp", m.pp_bytes}};
  if (m.cp_bytes >= 0) j["comm_bytes"]["cp"] = m.cp_bytes;
  if (m.bubble >= 0) j["bubble"] = m.bubble;
  if (m.bubble_idle >= 0) j["bubble_idle"] = m.bubble_idle;
  if (m.held >= 0) j["held"] = m.held;
  if (m.dp_wait_s >= 0) j["dp_wait_s"] = m.dp_wait_s;
  if (m.dp_wait_max_s >= 0) j["dp_wait_max_s"] = m.dp_wait_max_s;
  {
    nlohmann::json w = nlohmann::json::object();
    if (m.tp_wait_s >= 0) w["tp"] = m.tp_wait_s;
    if (m.dp_wait_s >= 0) w["dp"] = m.dp_wait_s;
    if (m.pp_wait_s >= 0) w["pp"] = m.pp_wait_s;
    if (m.ep_wait_s >= 0) w["ep"] = m.ep_wait_s;
    if (m.cp_wait_s >= 0) w["cp"] = m.cp_wait_s;
    if (!w.empty()) j["comm_wait_s"] = w;
  }
  if (m.host_reads >= 0) j["host_reads"] = m.host_reads;
  if (m.zero_level >= 2)
    j["zero"] = {{"level", m.zero_level},
                 {"gathers", m.zero_gathers},
                 {"gather_bytes", m.zero_gather_bytes},
                 {"reduce_scatters", m.zero_reduces},
                 {"gather_wait_s", m.zero_gather_wait_s},
                 {"reduce_wait_s", m.zero_reduce_wait_s}};
  if (!m.grad_compression.empty()) {
    j["grad_compression"] = {{"levels", m.grad_compression}, {"sent_bytes", m.gc_sent_bytes},
                             {"fp32_bytes", m.gc_fp32_bytes}};
    if (m.gc_seconds >= 0) j["grad_compression"]["seconds"] = m.gc_seconds;
  }
  if (!m.moe.empty()) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& x : m.moe)
      layers.push_back({{"layer", x.layer}, {"load", x.load}, {"tokens", x.tokens},
                        {"dropped", x.dropped}, {"imbalance", x.imbalance()}, {"aux", x.aux},
                        {"a2a_bytes", x.a2a_bytes}, {"a2a_s", x.a2a_seconds}});
    j["moe"] = layers;
  }
  if (!m.source_tokens.empty()) j["source_tokens"] = m.source_tokens;
  if (!m.telemetry.empty()) {
    nlohmann::json& t = j["telemetry"];
    for (const TelemetryStat& x : m.telemetry) {
      nlohmann::json f = {{"min", x.min}, {"mean", x.mean}, {"max", x.max}};
      f[x.per_rank ? "ranks" : "samples"] = x.count;
      if (x.total >= 0) f["total"] = x.total;
      t[x.name] = f;
    }
  }
  out_ << j.dump() << "\n";
  out_.flush();
}

void MetricsLog::log_record(const nlohmann::json& record) {
  // A decision or event (checkpoint, plan, switch, a controller's choice) is
  // also an instant on world rank 0's timeline while log.trace records.
  if (trace::recorder().on() && record.is_object() && record.contains("event") &&
      record["event"].is_string())
    trace::recorder().instant(record["event"].get<std::string>(), "control", record.dump());
  out_ << record.dump() << "\n";
  out_.flush();
}

void MetricsLog::log_eval(int64_t step, double val_loss,
                          const std::vector<std::pair<std::string, double>>& by_source) {
  nlohmann::json j = {{"step", step}, {"val_loss", val_loss}};
  for (const auto& [name, loss] : by_source) j["val_loss_by_source"][name] = loss;
  out_ << j.dump() << "\n";
  out_.flush();
}

std::string format_val_loss(double val_loss, const std::vector<std::pair<std::string, double>>& by_source) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "val loss %.4f", val_loss);
  std::string out = buf;
  for (size_t i = 0; i < by_source.size(); ++i) {
    std::snprintf(buf, sizeof buf, " %.4f", by_source[i].second);
    out += (i ? ", " : " (") + by_source[i].first + buf;
  }
  return by_source.empty() ? out : out + ")";
}

}  // namespace adgt
