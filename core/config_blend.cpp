// data.train / data.val as a YAML list of {path, weight} (config_blend.hpp).
#include "core/config_blend.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <stdexcept>

namespace adgt {
namespace {

std::string kind_of(const YAML::Node& n) {
  if (n.IsScalar()) return "\"" + n.Scalar() + "\"";
  if (n.IsSequence()) return "a sequence";
  if (n.IsMap()) return "a mapping";
  return "nothing (null)";
}

// A finite decimal number > 0, the whole scalar; nullopt otherwise.
std::optional<double> positive_weight(const std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789+-.eE") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(x) || !(x > 0)) return std::nullopt;
  return x;
}

struct Entry {
  std::string path;
  std::optional<double> weight;
};

// One {path, weight} map of the list; the error names `at` ("data.train[1]").
std::optional<std::string> read_entry(const YAML::Node& e, const std::string& at, Entry* out, YAML::Mark* mark) {
  if (!e.IsMap())
    return at + ": expected a mapping {path: FILE, weight: W}, got " + kind_of(e);
  std::set<std::string> seen;
  for (auto it = e.begin(); it != e.end(); ++it) {
    const YAML::Node k = it->first, v = it->second;
    if (mark && !k.Mark().is_null()) *mark = k.Mark();
    const std::string name = k.IsScalar() ? k.Scalar() : kind_of(k);
    if (name != "path" && name != "weight")
      return at + "." + name + ": unknown key; an entry has path (a token file or directory) and weight";
    if (!seen.insert(name).second) return at + "." + name + ": appears twice; keep one";
    if (!v.IsScalar()) return at + "." + name + ": expected " + (name == "path" ? "a file name" : "a number > 0") +
                              ", got " + kind_of(v);
    if (name == "path") {
      out->path = v.Scalar();
      if (out->path.empty()) return at + ".path: expected a file name, got an empty string";
      if (out->path.find_first_of(" \t\r\n") != std::string::npos)
        return at + ".path: \"" + out->path + "\" holds white space, which a blend's file names cannot "
                                              "(the blend is kept as \"WEIGHT PATH ...\"); rename or link the file";
      continue;
    }
    if (v.Tag() == "!")
      return at + ".weight: expected a number > 0, got \"" + v.Scalar() + "\" (a quoted string; remove the quotes)";
    out->weight = positive_weight(v.Scalar());
    if (!out->weight) return at + ".weight: expected a number > 0, got " + v.Scalar();
  }
  if (!seen.count("path")) {
    if (mark && !e.Mark().is_null()) *mark = e.Mark();
    return at + ".path: missing; give the token file (or a directory: its train.bin or val.bin)";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> blend_list_text(const YAML::Node& list, const std::string& key,
                                           std::string* text, YAML::Mark* mark) {
  if (list.size() == 0) return key + ": an empty list; give one or more entries {path: FILE, weight: W}";
  std::vector<Entry> entries;
  std::set<std::string> paths;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node e = list[i];
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (mark && !e.Mark().is_null()) *mark = e.Mark();
    Entry en;
    if (auto err = read_entry(e, at, &en, mark)) return err;
    if (!paths.insert(en.path).second)
      return at + ".path: " + en.path + " is named twice; give each source once, with one weight";
    entries.push_back(en);
  }
  // All weights or none: a missing one next to given ones is more likely a
  // slip than a wish for weight 1.
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].weight.has_value() != entries[0].weight.has_value()) {
      const size_t missing = entries[i].weight ? 0 : i, given = entries[i].weight ? i : 0;
      if (mark && !list[missing].Mark().is_null()) *mark = list[missing].Mark();
      return key + "[" + std::to_string(missing) + "].weight: missing, but " + key + "[" +
             std::to_string(given) + "] has one; give every source a weight, or none (equal weights)";
    }
  std::vector<BlendSource> sources;
  for (const Entry& e : entries) sources.push_back({e.path, e.weight.value_or(1.0)});
  *text = blend_text(sources);
  return std::nullopt;
}

std::optional<std::vector<BlendSource>> blend_list_of(const std::string& value) {
  try {
    std::vector<BlendSource> s = parse_blend_as_written(value, "");
    if (s.size() >= 2) return s;
  } catch (const std::runtime_error&) {
  }
  return std::nullopt;
}

}  // namespace adgt
