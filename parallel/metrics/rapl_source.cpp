// The host's energy through Linux powercap (RAPL on Intel and AMD):
// <root>/<zone>/energy_uj is a counter in microjoules that wraps to 0 past
// max_energy_range_uj. Since Linux 5.10 energy_uj is readable by root only
// on most distributions, so on an ordinary account this source is usually
// absent.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>

#include "parallel/metrics/telemetry_sources.hpp"

namespace adgt {
namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> read_u64(const fs::path& p) {
  std::ifstream in(p);
  uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

std::string read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

struct Zone {
  fs::path energy;       // .../energy_uj
  uint64_t range = 0;    // max_energy_range_uj (0: unknown)
  uint64_t prev = 0;     // the last raw reading
  double total_uj = 0;   // increase since opening, wraps undone
};

class RaplSource final : public TelemetrySource {
 public:
  RaplSource(std::vector<Zone> zones, std::string what) : zones_(std::move(zones)), what_(std::move(what)) {}
  std::string describe() const override { return what_; }

  TelemetryReading read() override {
    TelemetryReading r;
    bool any = false;
    double uj = 0;
    for (Zone& z : zones_) {
      if (const std::optional<uint64_t> v = read_u64(z.energy)) {
        if (*v >= z.prev) z.total_uj += double(*v - z.prev);
        else if (z.range > z.prev) z.total_uj += double(z.range - z.prev) + double(*v);  // wrapped
        else z.total_uj += double(*v);  // wrapped, range unknown: at least what is past 0
        z.prev = *v;
        any = true;
      }
      uj += z.total_uj;
    }
    if (any) r.energy_j = uj / 1e6;
    return r;
  }

 private:
  std::vector<Zone> zones_;
  std::string what_;
};

}  // namespace

std::unique_ptr<TelemetrySource> open_rapl_source(const std::string& root_in, std::string* why) {
  std::string root = root_in;
  if (root.empty()) {
    const char* env = std::getenv("ADGT_POWERCAP_ROOT");
    root = env && *env ? env : "/sys/class/powercap";
  }
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    *why = "no powercap at " + root;
    return nullptr;
  }
  // Top-level zones only ("intel-rapl:0", not its sub-zone "intel-rapl:0:1"),
  // and not the MMIO interface's copy of a package ("intel-rapl-mmio:0").
  static const std::regex top(R"(^[A-Za-z0-9_-]+:[0-9]+$)");
  std::vector<std::pair<std::string, fs::path>> found;  // (zone name, directory)
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string dir = e.path().filename().string();
    if (!std::regex_match(dir, top) || dir.find("mmio") != std::string::npos) continue;
    if (!fs::exists(e.path() / "energy_uj", ec)) continue;
    found.push_back({read_line(e.path() / "name"), e.path()});
  }
  if (found.empty()) {
    *why = "no RAPL energy counters under " + root;
    return nullptr;
  }
  const bool packages = std::any_of(found.begin(), found.end(),
                                    [](const auto& f) { return f.first.rfind("package", 0) == 0; });
  std::vector<Zone> zones;
  std::string names, unreadable;
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [name, dir] : found) {
    if (packages && name.rfind("package", 0) != 0) continue;  // psys and the like
    Zone z;
    z.energy = dir / "energy_uj";
    const std::optional<uint64_t> v = read_u64(z.energy);
    if (!v) {
      unreadable += (unreadable.empty() ? "" : ", ") + z.energy.string();
      continue;
    }
    z.prev = *v;
    z.range = read_u64(dir / "max_energy_range_uj").value_or(0);
    zones.push_back(std::move(z));
    names += (names.size() ? ", " : "") + dir.filename().string() + (name.empty() ? "" : " (" + name + ")");
  }
  if (zones.empty()) {
    *why = "RAPL counters not readable (" + unreadable + "; root only since Linux 5.10)";
    return nullptr;
  }
  return std::make_unique<RaplSource>(std::move(zones), "RAPL " + names);
}

}  // namespace adgt
