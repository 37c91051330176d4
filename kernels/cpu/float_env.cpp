// Flush-to-zero of the CPU backend's threads (float_env.hpp).
#include "kernels/cpu/float_env.hpp"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace adgt::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bit 15 (FTZ) and bit 6 (DAZ)
bool get_mode() { return (_mm_getcsr() & kFtzDaz) == kFtzDaz; }
void set_mode(bool on) {
  const unsigned c = _mm_getcsr();
  _mm_setcsr(on ? (c | kFtzDaz) : (c & ~kFtzDaz));
}
#elif defined(__aarch64__)
constexpr uint64_t kFz = uint64_t(1) << 24;  // FPCR.FZ
uint64_t get_fpcr() {
  uint64_t v;
  asm volatile("mrs %0, fpcr" : "=r"(v));
  return v;
}
bool get_mode() { return (get_fpcr() & kFz) != 0; }
void set_mode(bool on) {
  const uint64_t v = on ? (get_fpcr() | kFz) : (get_fpcr() & ~kFz);
  asm volatile("msr fpcr, %0" : : "r"(v));
}
#else
bool get_mode() { return false; }
void set_mode(bool) {}
#endif

// This thread and every OpenMP worker (a parallel region of the pool's full
// size reaches each of them once per thread number).
void set_everywhere(bool on) {
  set_mode(on);
#pragma omp parallel
  set_mode(on);
}

}  // namespace

bool flush_denormals_supported() {
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

bool flushing_denormals() { return get_mode(); }

FlushDenormals::FlushDenormals(bool on) {
  if (!on || !flush_denormals_supported()) return;
  was_on_ = get_mode();
  active_ = true;
  set_everywhere(true);
}

FlushDenormals::~FlushDenormals() {
  if (active_ && !was_on_) set_everywhere(false);
}

}  // namespace adgt::cpu
