#include "parallel/switch/switch_request.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/layout.hpp"

namespace adgt {

namespace {
std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

bool switchable(const std::string& key) {
  const auto& k = layout_keys();
  return std::find(k.begin(), k.end(), key) != k.end() || key == "parallel.bucket_mb" ||
         key == "parallel.overlap" || key == "parallel.expert_replicas";
}
}  // namespace

std::vector<SwitchRequest> parse_switch_requests(const std::string& text, const std::string& path) {
  std::vector<SwitchRequest> out;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    const std::string s = trim(raw.substr(0, raw.find('#')));
    if (s.empty()) continue;
    const std::string where = path + ":" + std::to_string(line);
    SwitchRequest r;
    r.line = line;
    r.text = s;
    std::istringstream words(s);
    std::string w;
    bool first = true;
    while (words >> w) {
      if (first && w[0] == '@') {
        const std::string n = w.substr(1);
        if (n.empty() || !std::all_of(n.begin(), n.end(), ::isdigit) || n.size() > 15)
          throw ConfigError(where + ": '" + w + "' is not a step: write @N with N >= 0 steps "
                                    "completed, e.g. @100");
        r.at_step = std::stoll(n);
      } else {
        const size_t eq = w.find('=');
        const size_t dot = w.find('.');
        if (eq == std::string::npos || dot == std::string::npos || dot > eq || eq + 1 == w.size())
          throw ConfigError(where + ": '" + w + "' is not section.key=value (e.g. parallel.tp=2)");
        r.overrides.push_back(w);
      }
      first = false;
    }
    if (r.overrides.empty())
      throw ConfigError(where + ": no section.key=value to switch to (e.g. parallel.tp=1 parallel.pp=4)");
    out.push_back(std::move(r));
  }
  return out;
}

void split_due(const std::vector<SwitchRequest>& reqs, int64_t step, std::vector<SwitchRequest>& due,
               std::vector<SwitchRequest>& later) {
  due.clear();
  later.clear();
  for (const SwitchRequest& r : reqs) (r.at_step < 0 || r.at_step <= step ? due : later).push_back(r);
}

RunConfig switched_config(const RunConfig& cfg, const SwitchRequest& req, int world,
                          const std::string& path) {
  const std::string where = path + ":" + std::to_string(req.line);
  for (const std::string& o : req.overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (!switchable(key)) {
      std::string keys;
      for (const std::string& k : layout_keys()) keys += k + ", ";
      throw ConfigError(where + ": " + key + " cannot change in a running job; a switch changes "
                        "the layout keys only (" + keys +
                        "parallel.bucket_mb, parallel.overlap, parallel.expert_replicas)");
    }
  }
  RunConfig next;
  try {
    next = load_config_text(to_yaml(cfg), where, req.overrides);
    validate_world(next, world);
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    throw ConfigError(m.rfind(where, 0) == 0 ? m : where + ": " + m);
  }
  next.source = cfg.source;
  return next;
}

std::string switch_file(const std::string& log_dir) {
  return (std::filesystem::path(log_dir) / "switch").string();
}

bool switch_request_due(const std::string& log_dir, int64_t step) {
  const std::string path = switch_file(log_dir);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  try {
    std::vector<SwitchRequest> due, later;
    split_due(parse_switch_requests(text.str(), path), step, due, later);
    return !due.empty();
  } catch (const ConfigError&) {
    return true;  // refused with its message by the switch
  }
}

std::string format_switch_requests(const std::vector<SwitchRequest>& reqs) {
  std::string s;
  for (const SwitchRequest& r : reqs) s += r.text + "\n";
  return s;
}

}  // namespace adgt
