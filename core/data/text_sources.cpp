// The documents of a corpus on disk (text_sources.hpp).
#include "core/data/text_sources.hpp"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/data/byte_stream.hpp"
#include "core/data/json_text_line.hpp"
#include "core/data/parquet_source.hpp"

namespace adgt::data {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The name without a .gz or .zst suffix.
std::string uncompressed_name(const std::string& path) {
  if (ends_with(path, ".gz")) return path.substr(0, path.size() - 3);
  if (ends_with(path, ".zst")) return path.substr(0, path.size() - 4);
  return path;
}

bool hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> split_dots(const std::string& field) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(field);
  while (std::getline(in, part, '.')) out.push_back(part);
  if (out.empty() || std::any_of(out.begin(), out.end(), [](const std::string& p) { return p.empty(); }))
    throw std::runtime_error("--text-field '" + field + "': a field name, or names joined by '.' for nested objects");
  return out;
}

// Reads `path` line by line (the last line may lack its newline); calls
// fn(line number, text without the newline).
template <class Fn>
void for_each_line(ByteStream& in, Fn fn) {
  std::string buf(size_t(1) << 16, '\0'), line;
  int64_t n = 0;
  for (;;) {
    const size_t got = in.read(buf.data(), buf.size());
    if (got == 0) break;
    size_t start = 0;
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') continue;
      line.append(buf, start, i - start);
      fn(++n, std::string_view(line));
      line.clear();
      start = i + 1;
    }
    line.append(buf, start, got - start);
  }
  if (!line.empty()) fn(++n, std::string_view(line));
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

bool known_format(const std::string& path) {
  const std::string n = uncompressed_name(path);
  return ends_with(n, ".txt") || ends_with(n, ".jsonl") || ends_with(n, ".json") || ends_with(path, ".parquet");
}

TextFormat text_format_of(const std::string& path) {
  const std::string n = uncompressed_name(path);
  if (ends_with(n, ".jsonl") || ends_with(n, ".json")) return TextFormat::JsonLines;
  if (ends_with(n, ".parquet")) {
    if (n != path) throw std::runtime_error(path + ": a compressed Parquet file; Parquet compresses inside, decompress it");
    require_parquet(path);  // (a build without Arrow: refused, naming the fix)
    return TextFormat::Parquet;
  }
  return TextFormat::Text;
}

Inputs expand_inputs(const std::vector<std::string>& args) {
  Inputs out;
  std::set<std::string> seen;
  bool matched = false;  // the argument in hand named some file (perhaps one named before)
  const auto add = [&](const std::string& f) {
    matched = true;
    std::error_code ec;
    const fs::path canon = fs::weakly_canonical(f, ec);
    if (seen.insert(ec ? f : canon.string()).second) out.files.push_back(f);
  };
  const auto add_dir = [&](const std::string& dir) {
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      const std::string p = it->path().string();
      (known_format(p) ? found : out.passed).push_back(p);
    }
    std::sort(found.begin(), found.end());
    for (const std::string& f : found) add(f);
  };
  for (const std::string& a : args) {
    matched = false;
    // (a file named itself, or matched by a glob, is read as text unless its
    // name says JSON lines: inside a directory only the known names count)
    std::vector<std::string> named;
    if (fs::exists(a)) {
      named.push_back(a);
    } else if (has_glob_chars(a)) {
      glob_t g{};
      if (glob(a.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) named.push_back(g.gl_pathv[i]);
      globfree(&g);
    }
    for (const std::string& p : named) {
      if (fs::is_directory(p)) {
        add_dir(p);
      } else {
        text_format_of(p);  // a file named or matched is text unless JSON lines or Parquet
        add(p);
      }
    }
    if (!matched)
      throw std::runtime_error("--input '" + a + "': " +
                               (named.empty() ? std::string("no such file, directory or match")
                                              : std::string("no .txt, .jsonl or .json file (optionally .gz or .zst) or .parquet file in it")));
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return false;  // a continuation byte first, an overlong C0/C1, or F5..FF
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + size_t(k)] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += size_t(len);
  }
  return true;
}

DocumentSource::DocumentSource(SourceOptions o) : o_(std::move(o)), field_path_(split_dots(o_.text_field)) {}

void DocumentSource::bad(const std::string& file, int64_t line, const std::string& why) {
  if (o_.fail_on_bad)
    throw std::runtime_error(file + ":" + std::to_string(line) + ": " + why + " (--on-bad-record fail)");
  bad_.push_back({file, line, why});
}

void DocumentSource::emit(const std::string& file, int64_t line, std::string_view text, const DocumentFn& doc) {
  if (!valid_utf8(text)) return bad(file, line, "not valid UTF-8");
  if (text.empty()) {
    ++empty_;
    return;
  }
  ++documents_;
  text_bytes_ += int64_t(text.size());
  doc(text);
}

void DocumentSource::json_line(const std::string& file, int64_t line, std::string_view text,
                               const DocumentFn& doc) {
  if (blank(text)) return;  // an empty line is no record
  if (field_path_.size() == 1 && json_text_line(text, field_path_[0], line_text_))
    return emit(file, line, line_text_, doc);  // {"text": "..."}, the common line
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // nlohmann rejects ill-formed UTF-8 in strings as a parse error: say which.
    return bad(file, line, valid_utf8(text) ? "not a JSON value" : "not valid UTF-8");
  }
  const nlohmann::json* v = &j;
  std::string at;
  for (const std::string& k : field_path_) {
    at += (at.empty() ? "" : ".") + k;
    if (!v->is_object()) return bad(file, line, "'" + at + "': the record is not an object there");
    const auto it = v->find(k);
    if (it == v->end()) return bad(file, line, "no field '" + at + "'");
    v = &*it;
  }
  if (!v->is_string()) return bad(file, line, "field '" + o_.text_field + "' is " + v->type_name() + ", not a string");
  emit(file, line, v->get_ref<const std::string&>(), doc);
}

void DocumentSource::read(const std::string& path, const DocumentFn& doc) {
  const TextFormat format = text_format_of(path);
  if (format == TextFormat::Parquet) {
    return read_parquet(path, field_path_,
                        {[&](int64_t row, std::string_view t) { emit(path, row, t, doc); },
                         [&](int64_t row, const std::string& why) { bad(path, row, why); }});
  }
  ByteStream in(path);
  stream_ = &in;
  struct Unset {
    const ByteStream*& p;
    ~Unset() { p = nullptr; }
  } unset{stream_};
  int64_t last = 0;
  try {
    if (format == TextFormat::JsonLines) {
      for_each_line(in, [&](int64_t n, std::string_view l) {
        last = n;
        json_line(path, n, l, doc);
      });
    } else if (o_.split_on_blank_lines) {
      std::string cur;
      int64_t first = 0;
      for_each_line(in, [&](int64_t n, std::string_view l) {
        last = n;
        if (blank(l)) {
          if (!cur.empty()) emit(path, first, cur, doc);
          cur.clear();
          return;
        }
        if (cur.empty()) first = n;
        else cur += '\n';
        cur.append(l);
      });
      if (!cur.empty()) emit(path, first, cur, doc);
    } else {
      std::string all, buf(size_t(1) << 16, '\0');
      for (size_t got; (got = in.read(buf.data(), buf.size())) > 0;) all.append(buf, 0, got);
      last = 1;
      emit(path, 1, all, doc);
    }
  } catch (const std::runtime_error& e) {
    // A damaged or truncated compressed stream: what came before it stands;
    // the rest of the file is one bad record, named.
    if (o_.fail_on_bad || std::string(e.what()).rfind(path, 0) != 0) throw;
    bad_.push_back({path, last + 1, std::string(e.what()).substr(path.size() + 2) + "; the rest of the file is lost"});
  }
}

int64_t DocumentSource::file_bytes_read() const { return stream_ ? stream_->file_bytes() : 0; }

std::string bad_summary(const std::vector<BadRecord>& bad) {
  if (bad.empty()) return "";
  std::map<std::string, int64_t> per_file;
  for (const BadRecord& b : bad) ++per_file[b.file];
  std::ostringstream os;
  os << bad.size() << " bad record" << (bad.size() == 1 ? "" : "s") << " skipped (";
  int shown = 0;
  for (const auto& [f, n] : per_file) {
    if (shown++ == 5) {
      os << ", ...";
      break;
    }
    os << (shown > 1 ? ", " : "") << n << " in " << f;
  }
  os << "; the first: " << bad[0].file << ":" << bad[0].line << ": " << bad[0].why << ")";
  return os.str();
}

}  // namespace adgt::data
