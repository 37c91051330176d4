// adgt-data prepare's journal (journal.hpp).
#include "core/data/prepare/journal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace adgt::data {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("journal '" + path + "': " + what);
}

void write_all_sync(int fd, const std::string& s, const std::string& path) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail(path, std::string("write failed: ") + std::strerror(errno));
    p += put, n -= size_t(put);
  }
  if (::fsync(fd) != 0) fail(path, std::string("fsync failed: ") + std::strerror(errno));
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

std::optional<Journal> read_journal(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t complete = all.rfind('\n') == std::string::npos ? 0 : all.rfind('\n') + 1;
  if (complete < all.size()) std::filesystem::resize_file(path, complete);  // a torn last line
  Journal j;
  size_t at = 0;
  for (int64_t line = 1; at < complete; ++line) {
    const size_t nl = all.find('\n', at);
    nlohmann::json v = nlohmann::json::parse(all.begin() + long(at), all.begin() + long(nl), nullptr, false);
    at = nl + 1;
    if (!v.is_object()) fail(path, "line " + std::to_string(line) + " is not a JSON object; start over with --force");
    if (line == 1) {
      if (!v.contains("journal")) fail(path, "line 1 is not a prepare journal header; start over with --force");
      j.header = std::move(v);
    } else if (v.value("done", false)) {
      j.done = true;
    } else {
      j.files.push_back(std::move(v));
    }
  }
  if (j.header.is_null()) return std::nullopt;  // empty: nothing was recorded
  return j;
}

void start_journal(const std::string& path, const nlohmann::json& header) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, std::string("cannot create: ") + std::strerror(errno));
  try {
    write_all_sync(fd, header.dump() + "\n", tmp);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(path, "cannot rename " + tmp + " into place: " + ec.message());
  // The rename itself durable: fsync the directory.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) ::fsync(dfd), ::close(dfd);
}

void append_journal(const std::string& path, const nlohmann::json& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  try {
    write_all_sync(fd, line.dump() + "\n", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

nlohmann::json file_record(const PrepareState& s, int64_t index, const std::string& path, size_t bad_from) {
  nlohmann::json bad = nlohmann::json::array();
  for (size_t i = bad_from; i < s.bad.size(); ++i) bad.push_back({s.bad[i].line, s.bad[i].why});
  const auto side = [](const PrepareState::Side& d) {
    return nlohmann::json{{"tokens", d.tokens}, {"documents", d.documents}, {"text_bytes", d.text_bytes}};
  };
  return {{"file", index},         {"path", path},           {"documents", s.documents},
          {"empty", s.empty}, {"last_doc_bytes", s.last_doc_bytes},      {"doc_hash", hex64(s.doc_hash)}, {"lossless", s.lossless},
          {"train", side(s.side[0])}, {"val", side(s.side[1])}, {"bad", bad}};
}

void apply_file_record(PrepareState& s, const nlohmann::json& rec, const std::string& journal_path) {
  try {
    const std::string file = rec.at("path").get<std::string>();
    s.files_done = rec.at("file").get<int64_t>() + 1;
    s.documents = rec.at("documents").get<int64_t>();
    s.empty = rec.at("empty").get<int64_t>();
    s.last_doc_bytes = rec.at("last_doc_bytes").get<int64_t>();
    s.doc_hash = std::stoull(rec.at("doc_hash").get<std::string>(), nullptr, 16);
    s.lossless = rec.at("lossless").get<int>();
    const char* names[2] = {"train", "val"};
    for (int i = 0; i < 2; ++i) {
      const auto& d = rec.at(names[i]);
      s.side[i] = {d.at("tokens").get<int64_t>(), d.at("documents").get<int64_t>(),
                   d.at("text_bytes").get<int64_t>()};
    }
    for (const auto& b : rec.at("bad")) s.bad.push_back({file, b.at(0).get<int64_t>(), b.at(1).get<std::string>()});
  } catch (const nlohmann::json::exception& e) {
    fail(journal_path, "a file line is incomplete (" + std::string(e.what()) + "); start over with --force");
  }
}

}  // namespace adgt::data
