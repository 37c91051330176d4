#include "kernels/emulated/device_arena.hpp"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace adgt {

namespace {
constexpr size_t kAlign = 256;
constexpr size_t kPage = 4096;
constexpr size_t kReturnAtLeast = size_t(1) << 20;  // freed blocks this big go back to the OS

// The arenas the fault handler knows (a process has one or two).
constexpr int kMaxArenas = 16;
std::atomic<const DeviceArena*> g_arenas[kMaxArenas];
struct sigaction g_previous;
std::atomic<bool> g_installed{false};
char g_who[96] = "";  // "rank 3: " when a launcher says so

void say(const char* s) { (void)!::write(2, s, std::strlen(s)); }

void on_fault(int sig, siginfo_t* info, void* ctx) {
  const void* addr = info ? info->si_addr : nullptr;
  const DeviceArena* hit = nullptr;
  for (auto& a : g_arenas) {
    const DeviceArena* p = a.load();
    if (p && p->in_range(addr)) hit = p;
  }
  if (hit) {
    // Not async-signal-safe in every detail (describe() formats a string), but
    // the process is going down and the message is what matters.
    char buf[512];
    if (hit->is_open())
      std::snprintf(buf, sizeof buf,
                    "\nerror: %sa backend op touched emulated device memory at %p (%s) outside "
                    "the tensors it was given (an out-of-bounds access). Backtrace:\n",
                    g_who, addr, hit->describe(addr).c_str());
    else
      std::snprintf(buf, sizeof buf,
                    "\nerror: %shost code read or wrote emulated device memory at %p (%s) "
                    "outside a backend call. Device memory may only be touched through Backend "
                    "ops, to_host and to_device (on CUDA this access would crash or read "
                    "garbage). Backtrace:\n",
                    g_who, addr, hit->describe(addr).c_str());
    say(buf);
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
  }
  // Hand the fault to whoever had it before (Open MPI prints its own report
  // and the launcher stops every rank), or to the default action.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) {
      g_previous.sa_sigaction(sig, info, ctx);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_handler(bool again = false) {
  bool expected = false;
  if (!g_installed.compare_exchange_strong(expected, true) && !again) return;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (const char* r = std::getenv(v)) {
      std::snprintf(g_who, sizeof g_who, "rank %s: ", r);
      break;
    }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous);
}
}  // namespace

void DeviceArena::install_fault_handler() { install_handler(true); }

DeviceArena::DeviceArena(size_t reserve_bytes) : reserve_((reserve_bytes + kPage - 1) / kPage * kPage) {
  void* p = ::mmap(nullptr, reserve_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("emulated device: cannot reserve " + std::to_string(reserve_ >> 20) +
                             " MiB of address space (" + std::strerror(errno) +
                             "); set ADGT_EMULATED_MEMORY_GB lower");
  base_ = static_cast<char*>(p);
  install_handler();
  for (auto& a : g_arenas) {
    const DeviceArena* none = nullptr;
    if (a.compare_exchange_strong(none, this)) break;
  }
}

DeviceArena::~DeviceArena() {
  for (auto& a : g_arenas) {
    const DeviceArena* me = this;
    a.compare_exchange_strong(me, nullptr);
  }
  if (base_) ::munmap(base_, reserve_);
}

void DeviceArena::protect(size_t lo, size_t hi, bool rw) const {
  lo = lo / kPage * kPage;
  hi = (hi + kPage - 1) / kPage * kPage;
  if (hi <= lo) return;
  if (::mprotect(base_ + lo, hi - lo, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    say("error: emulated device: mprotect failed\n");
    std::abort();  // the emulation cannot keep its promise; nothing sensible to do
  }
}

DeviceArena::Open::Open(DeviceArena& a, std::initializer_list<Range> ranges)
    : Open(a, ranges.begin(), int(ranges.size())) {}

DeviceArena::Open::Open(DeviceArena& a, const Range* ranges, int n) : a_(a) {
  if (n > kMaxRanges || a_.depth_ > 0) {
    say(n > kMaxRanges ? "error: emulated device: too many ranges for one backend call\n"
                       : "error: emulated device: a backend call inside another\n");
    std::abort();  // a defect of the emulation itself, not of the code under test
  }
  ++a_.depth_;
  for (int i = 0; i < n; ++i) {
    const Range& r = ranges[i];
    if (!r.p || !r.bytes || !a_.in_range(r.p)) continue;
    const size_t off = size_t(static_cast<const char*>(r.p) - a_.base_);
    lo_[n_] = off / kPage * kPage;
    hi_[n_] = (off + r.bytes + kPage - 1) / kPage * kPage;
    a_.protect(lo_[n_], hi_[n_], true);
    ++n_;
  }
}

DeviceArena::Open::~Open() {
  for (int i = n_; i-- > 0;) a_.protect(lo_[i], hi_[i], false);
  --a_.depth_;
}

void* DeviceArena::alloc(size_t bytes) {
  const size_t n = (bytes ? bytes + kAlign - 1 : kAlign) / kAlign * kAlign;
  size_t off = 0;
  bool found = false;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    off = it->first;
    const size_t rest = it->second - n;
    free_.erase(it);
    if (rest) free_[off + n] = rest;
    found = true;
    break;
  }
  if (!found) {
    if (n > reserve_ - top_)
      throw std::runtime_error("emulated device: out of memory: " + std::to_string(n) +
                               " bytes asked, " + std::to_string(used_) + " in use of the " +
                               std::to_string(reserve_ >> 20) +
                               " MiB reserved (ADGT_EMULATED_MEMORY_GB)");
    off = top_;
    top_ += n;
  }
  live_[off] = Block{n, bytes};
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return base_ + off;
}

void DeviceArena::release(void* p) noexcept {
  if (!p) return;
  try {
    const size_t off = size_t(static_cast<char*>(p) - base_);
    auto it = live_.find(off);
    if (!in_range(p) || it == live_.end()) {
      ++bad_releases_;
      return;
    }
    size_t lo = off, n = it->second.size;
    live_.erase(it);
    used_ -= n;
    // Coalesce with the free neighbours.
    auto next = free_.lower_bound(lo);
    if (next != free_.end() && next->first == lo + n) {
      n += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == lo) {
        lo = prev->first;
        n += prev->second;
        free_.erase(prev);
      }
    }
    if (lo + n == top_) {
      top_ = lo;  // the top block shrinks the range instead
    } else {
      free_[lo] = n;
    }
    if (n >= kReturnAtLeast) {  // give whole pages back to the OS; they read as 0 later
      const size_t a = (lo + kPage - 1) / kPage * kPage, b = (lo + n) / kPage * kPage;
      if (b > a) ::madvise(base_ + a, b - a, MADV_DONTNEED);
    }
  } catch (...) {
    ++bad_releases_;
  }
}

bool DeviceArena::in_range(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + reserve_;
}

bool DeviceArena::contains(const void* p, size_t bytes) const {
  if (!in_range(p)) return false;
  const size_t off = size_t(static_cast<const char*>(p) - base_);
  auto it = live_.upper_bound(off);
  if (it == live_.begin()) return false;
  --it;
  return off + bytes <= it->first + it->second.asked;
}

std::string DeviceArena::describe(const void* p) const {
  if (!in_range(p)) return "not device memory";
  const size_t off = size_t(static_cast<const char*>(p) - base_);
  auto it = live_.upper_bound(off);
  if (it != live_.begin()) {
    --it;
    if (off < it->first + it->second.size) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "byte %zu of a %zu-byte buffer at %p%s", off - it->first,
                    it->second.asked, static_cast<const void*>(base_ + it->first),
                    off >= it->first + it->second.asked ? " (past its end, in the padding)" : "");
      return buf;
    }
  }
  return "outside every live buffer: freed memory or past an end";
}

}  // namespace adgt
