// Host emulation of the CUDA execution model, enough to run the flash
// attention kernels (kernels/cuda/flash_attention_kernels.cuh) unmodified on
// the CPU: the keywords and built-ins they use (threadIdx, blockIdx,
// __syncthreads, __syncwarp, __shfl_xor_sync, ...), and a launcher that runs
// a grid one CTA at a time.
//
// Every CUDA thread of a CTA is a fiber (Boost.Context's fcontext: a switch
// is a few instructions, where ucontext's swapcontext made a sigprocmask
// system call each time, 30% of a family's run on a VM) on the calling OS thread,
// so a run is deterministic. A fiber runs until it reaches a warp collective
// (__syncwarp, a shuffle, and the emulated ldmatrix / mma of sim_ptx.hpp,
// which exchange registers between lanes) or __syncthreads, and then hands
// over to the next fiber that can run. The order is chosen to expose missing
// barriers: the lanes of one warp take turns, and a warp runs on alone until
// it blocks in __syncthreads (or ends) before the next warp starts; one launch
// goes through the warps in ascending order, another in descending order. A
// warp that reads shared memory another warp has not written yet (or writes
// what another still has to read) without a __syncthreads in between then
// reads stale or poisoned data and the results are wrong. A barrier that not
// every thread reaches (divergent __syncthreads, a collective with lanes
// missing or lanes in different collectives) is reported as a deadlock or a
// mismatch, and the program aborts.
//
// Errors abort with a "cuda-sim:" message: they are bugs in the kernel (or
// in this emulation), not conditions to recover from.
//
// Not modelled: memory ordering between threads beyond what the schedule
// above gives, bank conflicts, timing, register limits (ptxas checks those),
// and threads that exit before a __syncthreads others wait in (reported as a
// deadlock here; the kernels never do that).
#pragma once
#include <math.h>  // INFINITY, fmaf, fmaxf, log2f in the global namespace, as in CUDA
#include <boost/context/detail/fcontext.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

// ---- CUDA keywords ---------------------------------------------------------
// __restrict__ is already a GCC/Clang keyword.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A static __shared__ array is one object for the whole CTA: a function-local
// static (one per kernel instantiation; one CTA runs at a time). It is not
// poisoned between CTAs. Dynamic shared memory is declared with
// ADGT_DYNAMIC_SMEM (kernels/cuda/device_common.cuh), here the array below.
#define __shared__ static
#define ADGT_DYNAMIC_SMEM(name) unsigned char* const name = ::adgt::cuda::smem_raw
#define __align__(n) __attribute__((aligned(n)))  // as CUDA defines it for GCC

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// Set by the scheduler before it resumes a fiber (threadIdx) or starts a CTA
// (blockIdx); the kernels read them like the CUDA built-ins.
inline uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace adgt::cuda_sim {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda-sim: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y,
               blockIdx.z, threadIdx.x);
  std::fflush(stderr);
  std::abort();
}

// Largest dynamic shared memory a CTA may ask for (sm_90: 227 KiB).
constexpr size_t kMaxSmem = 227 * 1024;

enum class WarpOrder { Ascending, Descending };

// One cp.async copy, issued and not yet complete.
struct Copy {
  uint32_t dst;     // shared offset
  const void* src;  // global source; unread when n == 0
  uint32_t size;    // bytes
  uint32_t n;       // bytes copied from src; the rest (size - n) zero-filled
};

// What a lane hands to the other lanes of its warp in one collective.
enum class Op : uint32_t { None, Sync, Shfl, Ldsm, LdsmT, Mma };
struct Slot {
  Op op;
  uint32_t w[6];  // shuffle value / ldmatrix row address / mma a0..a3, b0, b1
};

enum class State { Ready, WaitWarp, WaitCta, Done };

namespace fctx = boost::context::detail;

struct Fiber {
  fctx::fcontext_t ctx = nullptr;  // where it resumes
  std::unique_ptr<char[]> stack;
  unsigned tid = 0;
  State state = State::Ready;
  uint64_t wait_gen = 0;                // generation of the barrier it waits in
  std::vector<Copy> open;               // cp.async issued since the last commit
  std::deque<std::vector<Copy>> groups;  // committed groups, oldest first
};

struct Warp {
  unsigned arrived = 0;
  uint64_t gen = 0;       // collectives completed
  Slot slots[2][32];      // double-buffered by gen parity (see collective())
};

struct Runtime {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  unsigned cta_arrived = 0;
  uint64_t cta_gen = 0;
  Fiber* cur = nullptr;
  fctx::fcontext_t launcher = nullptr;
  WarpOrder order = WarpOrder::Ascending;
  const std::function<void()>* body = nullptr;
  size_t smem_bytes = 0;  // this launch's dynamic shared memory
  // Global buffers the kernels may read with cp.async: [begin, end).
  std::vector<std::pair<const unsigned char*, const unsigned char*>> globals;
  uint64_t switches = 0;
};
inline Runtime rt;

constexpr size_t kStackBytes = 256 * 1024;

// Suspends the running context into `self` and resumes `to`. Each jump
// carries the address of the suspended context's slot, and whoever resumes
// first stores the context it came from there.
inline void jump(fctx::fcontext_t& self, fctx::fcontext_t to) {
  const fctx::transfer_t t = fctx::jump_fcontext(to, &self);
  *static_cast<fctx::fcontext_t*>(t.data) = t.fctx;
}

inline bool runnable(const Fiber& f) {
  switch (f.state) {
    case State::Ready:
      return true;
    case State::WaitWarp:
      return rt.warps[f.tid / 32].gen != f.wait_gen;
    case State::WaitCta:
      return rt.cta_gen != f.wait_gen;
    case State::Done:
      return false;
  }
  return false;
}

[[noreturn]] inline void deadlock() {
  std::fprintf(stderr, "cuda-sim: deadlock in block %u,%u,%u; thread states:", blockIdx.x,
               blockIdx.y, blockIdx.z);
  const char* names[] = {"ready", "warp-collective", "syncthreads", "done"};
  for (const Fiber& f : rt.fibers)
    std::fprintf(stderr, "%s%u:%s", f.tid % 8 ? " " : "\n  ", f.tid, names[int(f.state)]);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}

// The current fiber cannot go on: resume the next one that can, preferring
// the later lanes of its own warp, then the other warps in rt.order; back to
// the launcher when every thread is done. Returns when the caller may go on.
inline void schedule() {
  Fiber* self = rt.cur;
  const unsigned nw = unsigned(rt.warps.size());
  const unsigned w0 = self->tid / 32, l0 = self->tid % 32;
  Fiber* next = nullptr;
  for (unsigned i = 1; i <= 32 && !next; ++i) {
    Fiber& f = rt.fibers[w0 * 32 + (l0 + i) % 32];
    if (runnable(f)) next = &f;
  }
  for (unsigned i = 1; i < nw && !next; ++i) {
    const unsigned w = rt.order == WarpOrder::Ascending ? (w0 + i) % nw : (w0 + nw - i) % nw;
    for (unsigned l = 0; l < 32 && !next; ++l)
      if (runnable(rt.fibers[w * 32 + l])) next = &rt.fibers[w * 32 + l];
  }
  if (!next) {
    for (const Fiber& f : rt.fibers)
      if (f.state != State::Done) deadlock();
    jump(self->ctx, rt.launcher);  // the CTA is finished; never resumed
    fail("finished thread resumed");
  }
  if (next == self) {
    self->state = State::Ready;
    return;
  }
  rt.cur = next;
  threadIdx = {next->tid, 0, 0};
  ++rt.switches;
  jump(self->ctx, next->ctx);
  // resumed: restore this fiber's view
  rt.cur = self;
  threadIdx = {self->tid, 0, 0};
  self->state = State::Ready;
}

// Warp collective: every lane deposits `in`, waits for the whole warp, and
// gets the slots of all 32 lanes. The last lane to arrive does not wait; it
// may run ahead into the next collective while the others still read this
// one's slots, hence two slot buffers by generation parity (it cannot get two
// ahead: that needs the others to arrive at the next one first).
inline const Slot* collective(const Slot& in) {
  Fiber& f = *rt.cur;
  Warp& w = rt.warps[f.tid / 32];
  const uint64_t gen = w.gen;
  Slot* slots = w.slots[gen & 1];
  slots[f.tid % 32] = in;
  if (++w.arrived == 32) {
    for (int l = 0; l < 32; ++l)
      if (slots[l].op != in.op) fail("lanes of a warp in different collectives");
    w.arrived = 0;
    ++w.gen;
  } else {
    f.state = State::WaitWarp;
    f.wait_gen = gen;
    schedule();
  }
  return slots;
}

inline void cta_barrier() {
  Fiber& f = *rt.cur;
  const uint64_t gen = rt.cta_gen;
  if (++rt.cta_arrived == rt.fibers.size()) {
    rt.cta_arrived = 0;
    ++rt.cta_gen;
  } else {
    f.state = State::WaitCta;
    f.wait_gen = gen;
    schedule();
  }
}

inline void fiber_main(fctx::transfer_t from) {
  *static_cast<fctx::fcontext_t*>(from.data) = from.fctx;  // as jump() does
  Fiber& f = *rt.cur;
  (*rt.body)();
  if (!f.open.empty() || !f.groups.empty()) fail("thread exited with cp.async copies outstanding");
  f.state = State::Done;
  schedule();
  fail("finished thread resumed");
}

// Fills a CTA's dynamic shared memory with 0xff bytes: bf16 and fp32 NaNs.
inline void poison_smem();

// Runs `kernel` (a call of a __global__ function) on every block of `grid`
// with `threads` threads per block (a multiple of 32) and `smem` bytes of
// dynamic shared memory, poisoned with NaN bytes before each block.
inline void launch(uint3 grid, unsigned threads, size_t smem, WarpOrder order,
                   const std::function<void()>& kernel) {
  if (threads == 0 || threads % 32 || threads > 1024) fail("threads per block: a multiple of 32");
  if (smem > kMaxSmem) fail("dynamic shared memory over the limit");
  gridDim = grid;
  blockDim = {threads, 1, 1};
  rt.body = &kernel;
  rt.order = order;
  rt.smem_bytes = smem;
  rt.fibers.resize(threads);
  rt.warps.assign(threads / 32, Warp{});
  for (unsigned t = 0; t < threads; ++t) {
    rt.fibers[t].tid = t;
    if (!rt.fibers[t].stack) rt.fibers[t].stack.reset(new char[kStackBytes]);
  }
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        poison_smem();
        rt.cta_arrived = 0;
        rt.cta_gen = 0;
        for (Warp& w : rt.warps) w = Warp{};
        for (Fiber& f : rt.fibers) {
          f.state = State::Ready;
          f.open.clear();
          f.groups.clear();
          // fiber_main never returns (the stack grows down from its top).
          f.ctx = fctx::make_fcontext(f.stack.get() + kStackBytes, kStackBytes, fiber_main);
        }
        Fiber& first = order == WarpOrder::Ascending ? rt.fibers.front() : rt.fibers[threads - 32];
        rt.cur = &first;
        threadIdx = {first.tid, 0, 0};
        jump(rt.launcher, first.ctx);
      }
  rt.cur = nullptr;
}

// Global memory the kernels may read through cp.async (inputs); any other
// cp.async source address aborts.
inline void add_global(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  rt.globals.emplace_back(b, b + bytes);
}
inline void clear_globals() { rt.globals.clear(); }
inline void check_global(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (const auto& g : rt.globals)
    if (b >= g.first && b + bytes <= g.second) return;
  fail("cp.async reads global memory outside every input buffer");
}

}  // namespace adgt::cuda_sim

// ---- CUDA built-ins -----------------------------------------------------------

inline void __syncthreads() { adgt::cuda_sim::cta_barrier(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  using namespace adgt::cuda_sim;
  if (mask != 0xffffffffu) fail("__syncwarp: only the full mask is emulated");
  collective(Slot{Op::Sync, {}});
}

inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// var of lane (this lane ^ laneMask); every lane of the warp takes part.
inline float __shfl_xor_sync(unsigned mask, float var, int laneMask, int width = 32) {
  using namespace adgt::cuda_sim;
  if (mask != 0xffffffffu || width != 32) fail("__shfl_xor_sync: only full warps are emulated");
  const Slot* s = collective(Slot{Op::Shfl, {__float_as_uint(var)}});
  return __uint_as_float(s[(threadIdx.x % 32) ^ unsigned(laneMask & 31)].w[0]);
}

[[noreturn]] inline void __trap() { adgt::cuda_sim::fail("__trap()"); }

// The kernels' dynamic shared memory (ADGT_DYNAMIC_SMEM names it; one CTA
// runs at a time).
namespace adgt::cuda {
namespace {
alignas(16) unsigned char smem_raw[adgt::cuda_sim::kMaxSmem];
}  // namespace
}  // namespace adgt::cuda

inline void adgt::cuda_sim::poison_smem() {
  std::memset(adgt::cuda::smem_raw, 0xff, sizeof adgt::cuda::smem_raw);
}
