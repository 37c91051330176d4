// The host's core tokens of virtual clocks (clock.hpp; docs/emulation.md).
#include "parallel/emulate/clock.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace adgt::emulate {

CoreTokens::CoreTokens(const std::string& name, int cores, bool create) : name_(name) {
  sem_ = create ? sem_open(name.c_str(), O_CREAT | O_EXCL, 0600, unsigned(std::max(1, cores)))
                : sem_open(name.c_str(), 0);
  if (sem_ == SEM_FAILED) {
    sem_ = nullptr;
    throw std::runtime_error("emulate.clock=virtual: cannot " +
                             std::string(create ? "create" : "open") + " the core tokens " + name +
                             ": " + std::strerror(errno));
  }
  linked_ = create;
}

CoreTokens::~CoreTokens() {
  unlink();
  if (sem_) sem_close(sem_);
}

void CoreTokens::unlink() {
  if (linked_) sem_unlink(name_.c_str());
  linked_ = false;
}

bool CoreTokens::acquire(double timeout_s) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const double whole = std::floor(timeout_s);
  ts.tv_sec += time_t(whole);
  ts.tv_nsec += long((timeout_s - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec += 1, ts.tv_nsec -= 1000000000L;
  while (sem_timedwait(sem_, &ts) != 0)
    if (errno != EINTR) return false;
  return true;
}

void CoreTokens::release() { sem_post(sem_); }

}  // namespace adgt::emulate
