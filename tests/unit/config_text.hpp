// Run-file text for the config tests: loaded as "x.yaml" with --set
// overrides, and the ConfigError message it gives ("(no error)" if none).
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt::test {

inline RunConfig load(const std::string& y, const std::vector<std::string>& ov = {}) {
  return load_config_text(y, "x.yaml", ov);
}

inline std::string error_of(const std::string& y, const std::vector<std::string>& ov = {}) {
  try {
    load(y, ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace adgt::test
