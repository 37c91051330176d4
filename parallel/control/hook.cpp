#include "parallel/control/hook.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/metrics.hpp"
#include "kernels/check.hpp"
#include "parallel/emulate/emulation.hpp"
#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt {

std::string broadcast_text(Comm& comm, const std::string& text, int root) {
  int32_t len[1] = {comm.rank() == root ? int32_t(text.size()) : 0};
  comm.broadcast(Tensor(len, DType::I32, {1}), root);
  std::vector<int32_t> words(size_t(len[0] + 3) / 4, 0);
  if (comm.rank() == root) std::memcpy(words.data(), text.data(), text.size());
  if (!words.empty()) comm.broadcast(Tensor(words.data(), DType::I32, {int64_t(words.size())}), root);
  return std::string(reinterpret_cast<const char*>(words.data()), size_t(len[0]));
}

nlohmann::json decide_broadcast(const std::string& name, int64_t step, Comm& world,
                                const nlohmann::json& inputs,
                                const std::function<nlohmann::json(const nlohmann::json&)>& decide,
                                nlohmann::json* record) {
  std::string text;
  double decide_s = 0;  // rank 0's time in decide(): the re-plan itself
  if (world.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    text = decide(inputs).dump();
    decide_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  text = broadcast_text(world, text);
  nlohmann::json decision = nlohmann::json::parse(text);
  if (record) *record = nlohmann::json();
  if (world.rank() != 0) return decision;
  // A decision that changes the running job says so on the console, once.
  if (decision.contains("console") && decision["console"].is_string())
    std::printf("%s at step %ld: %s\n", name.c_str(), long(step),
                decision["console"].get<std::string>().c_str());
  if (record && !decision.value("quiet", false))
    *record = {{"event", "controller"}, {"controller", name}, {"step", step},
               {"inputs", inputs},      {"decision", decision}, {"decide_s", decide_s}};
  return decision;
}

std::vector<nlohmann::json> run_controllers(const std::vector<Controller*>& cs, Engine& e,
                                            const StepReport& r, Comm& world,
                                            LayoutRequest* request) {
  std::vector<nlohmann::json> records;
  for (Controller* c : cs) {
    c->record(e, r);
    if (!c->due(r)) continue;
    const nlohmann::json inputs = c->observe(e, r, world);
    nlohmann::json rec;
    const nlohmann::json decision = decide_broadcast(
        c->name(), r.step, world, inputs, [c](const nlohmann::json& in) { return c->decide(in); }, &rec);
    c->apply(e, decision);
    if (request && decision.contains("layout_request") && decision["layout_request"].is_array() &&
        !decision["layout_request"].empty())
      *request = {c->name(), decision["layout_request"].get<std::vector<std::string>>()};
    if (!rec.is_null()) records.push_back(std::move(rec));
  }
  return records;
}

LayoutRequest StepHook::after_step(Engine& e, const StepReport& r, Comm& world, MetricsLog* log) {
  for (Observer* o : observers_) o->observe(e, r, world);
  LayoutRequest request;
  for (const nlohmann::json& rec : run_controllers(controllers_, e, r, world, &request))
    if (log) log->log_record(rec);
  return request;
}

}  // namespace adgt
