#include "parallel/fault/heartbeat.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>

namespace adgt::fault {

namespace {
std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

bool split_ints(const std::string& s, std::vector<int>* out) {
  out->clear();
  std::istringstream is(s);
  std::string item;
  while (std::getline(is, item, ',')) {
    try {
      size_t n = 0;
      out->push_back(std::stoi(item, &n));
      if (n != item.size()) return false;
    } catch (...) {
      return false;
    }
  }
  return !out->empty();
}
}  // namespace

const HeartbeatGroup* Heartbeat::group(const std::string& key) const {
  for (const auto& g : groups)
    if (g.key == key) return &g;
  return nullptr;
}

std::string format_heartbeat(const Heartbeat& h) {
  std::ostringstream os;
  os << "adgt-heartbeat 1\n"
     << "token " << h.token << "\n"
     << "launcher_rank " << h.launcher_rank << "\n"
     << "rank " << h.rank << "\n"
     << "host " << h.host << "\n"
     << "pid " << h.pid << "\n"
     << "beat " << h.beat << "\n"
     << "time_ns " << h.time_ns << "\n"
     << "step " << h.step << "\n"
     << "phase " << phase_name(h.phase) << "\n"
     << "state " << h.state << "\n";
  if (h.waiting)
    os << "wait " << h.wait_group << " " << op_name(h.wait_op) << " " << h.wait_seq << " "
       << h.wait_peer << " " << h.wait_s << "\n";
  else
    os << "wait -\n";
  for (const auto& g : h.groups)
    os << "group " << g.key << " " << g.name << " " << join_ints(g.members) << " " << g.seq << " "
       << g.p2p << "\n";
  os << "end\n";  // a file without it is torn or foreign
  return os.str();
}

std::optional<Heartbeat> parse_heartbeat(const std::string& text) {
  std::istringstream is(text);
  std::string line;
  if (!std::getline(is, line) || line != "adgt-heartbeat 1") return std::nullopt;
  Heartbeat h;
  bool end = false;
  int seen = 0;  // bit per required field
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    std::string k;
    ls >> k;
    if (k == "end") {
      end = true;
      break;
    }
    bool ok = true;
    if (k == "token") ok = bool(ls >> h.token), seen |= 1;
    else if (k == "launcher_rank") ok = bool(ls >> h.launcher_rank), seen |= 2;
    else if (k == "rank") ok = bool(ls >> h.rank), seen |= 4;
    else if (k == "host") ok = bool(ls >> h.host), seen |= 8;
    else if (k == "pid") ok = bool(ls >> h.pid), seen |= 16;
    else if (k == "beat") ok = bool(ls >> h.beat);
    else if (k == "time_ns") ok = bool(ls >> h.time_ns), seen |= 32;
    else if (k == "step") ok = bool(ls >> h.step);
    else if (k == "phase") {
      std::string p;
      ok = bool(ls >> p);
      h.phase = phase_from_name(p);
    } else if (k == "state") ok = bool(ls >> h.state);
    else if (k == "wait") {
      std::string g;
      ok = bool(ls >> g);
      if (ok && g != "-") {
        std::string op;
        ok = bool(ls >> op >> h.wait_seq >> h.wait_peer >> h.wait_s);
        h.waiting = ok;
        h.wait_group = g;
        h.wait_op = op_from_name(op);
      }
    } else if (k == "group") {
      HeartbeatGroup g;
      std::string members;
      ok = bool(ls >> g.key >> g.name >> members >> g.seq >> g.p2p) &&
           split_ints(members, &g.members);
      if (ok) h.groups.push_back(std::move(g));
    }  // unknown keys: a newer writer; skipped
    if (!ok) return std::nullopt;
  }
  if (!end || seen != 63) return std::nullopt;
  return h;
}

std::string heartbeat_path(const std::string& dir, int launcher_rank) {
  return dir + "/rank" + std::to_string(launcher_rank) + ".hb";
}

std::string verdict_path(const std::string& dir, const std::string& token) {
  return dir + "/verdict." + token;
}

bool write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    off += size_t(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

std::optional<std::string> read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    s.append(buf, size_t(n));
    if (s.size() > (1 << 20)) break;  // not a heartbeat
  }
  ::close(fd);
  return s;
}

int64_t system_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace adgt::fault
