// Harness of the kernel emulation tests (tests/kernel_sim/*_sim_test.cpp):
// each runs the CUDA backend's ops of one kernel family — the real kernels
// and launch code of kernels/cuda/<family>_kernels.cuh — in the host
// emulation of CUDA (tests/tools/cuda_sim/) and compares them with the CPU
// backend's op on the same inputs.
//
//   Mem: the emulated device's memory. Every tensor is its own allocation
//     with guard bytes before and after (a 0xff pattern: bf16/f32/f64 NaN);
//     a write past either end is reported, a read past them reads NaN.
//     Allocations are 256-byte aligned like cudaMalloc; `misalign` elements
//     shift a tensor off 16-byte alignment to reach the scalar paths.
//   ctx(): the OpCtx the ops take; scratch is host memory poisoned with
//     0xff at every request (contents do not outlive an op).
//   run_both(f): runs f in both warp orders (see sim_runtime.hpp); the
//     caller compares the two results bitwise (the kernels are
//     deterministic) and with the CPU's within a tolerance.
//   close(): elementwise comparison, printing the worst element.
//
// A failing check prints "FAIL <case>: ..." and the test exits non-zero;
// the emulation itself aborts with "cuda-sim: ..." (a barrier deadlock, a
// bad launch). tests/kernel_sim/CMakeLists.txt also builds every test
// against a deliberately broken copy of its kernel header (a mutant) and
// expects it to fail.
#pragma once
#include "tests/tools/cuda_sim/sim_cuda.hpp"
// (the emulated CUDA first: the kernel headers build on it)
#include "kernels/cuda/cuda_common.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt::sim_check {

inline int failures = 0;
inline int checks = 0;

// With ADGT_SIM_FAIL_FAST=1 (tests/kernel_sim/expect_failure.cmake sets it for
// the mutants) the first failed check ends the test: its verdict is known, and
// the remaining cases would only cost time.
inline void fail(const std::string& what) {
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
  std::fflush(stdout);
  if (const char* e = std::getenv("ADGT_SIM_FAIL_FAST"); e != nullptr && e[0] == '1') std::_Exit(1);
}

inline CpuBackend& cpu() {
  static CpuBackend be;
  return be;
}

class Mem {
 public:
  static constexpr size_t kGuard = 256;
  // A tensor of `shape` in `dt`, `misalign` elements past a 256-byte boundary.
  Tensor make(DType dt, std::initializer_list<int64_t> shape, int misalign = 0) {
    Tensor t(nullptr, dt, shape);
    const size_t off = size_t(misalign) * dtype_size(dt);
    auto b = std::make_unique<Block>();
    b->n = t.bytes();
    b->off = kGuard + off;
    b->mem.reset(static_cast<unsigned char*>(std::aligned_alloc(256, round_up(b->off + b->n + kGuard))));
    std::memset(b->mem.get(), 0xff, round_up(b->off + b->n + kGuard));
    t.data = b->mem.get() + b->off;
    blocks_.push_back(std::move(b));
    return t;
  }
  // Every guard intact; names the first tensor whose guard was written.
  bool guards_ok(const std::string& where) {
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = *blocks_[i];
      for (size_t k = 0; k < b.off; ++k)
        if (b.mem.get()[k] != 0xff) return fail(where + ": write before tensor #" + std::to_string(i)), false;
      for (size_t k = 0; k < kGuard; ++k)
        if (b.mem.get()[b.off + b.n + k] != 0xff)
          return fail(where + ": write past the end of tensor #" + std::to_string(i)), false;
    }
    return true;
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  struct Block {
    std::unique_ptr<unsigned char, Free> mem;
    size_t off = 0, n = 0;
  };
  static size_t round_up(size_t n) { return (n + 255) / 256 * 256; }
  std::vector<std::unique_ptr<Block>> blocks_;
};

// The OpCtx of the emulated device: host scratch, poisoned at each request.
class Ctx {
 public:
  Ctx() {
    ctx_.scratch = [this](CudaBackend::Scratch w, size_t n) -> void* {
      auto& s = scratch_[int(w)];
      if (s.size() < n) s.resize(n + 256);
      std::memset(s.data(), 0xff, s.size());
      return s.data();
    };
    ctx_.err_dev = err_;
    ctx_.to_host = [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); };
  }
  const cuda::OpCtx& get() const { return ctx_; }
  int64_t* err() { return err_; }

 private:
  cuda::OpCtx ctx_;
  std::vector<unsigned char> scratch_[CudaBackend::kNumScratch];
  int64_t err_[4] = {};
};

// Values uniform in [lo, hi), stored in t's dtype (f32, f64 or bf16).
inline void fill(const Tensor& t, std::mt19937& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = u(rng);
    switch (t.dtype) {
      case DType::F32: t.ptr<float>()[i] = float(v); break;
      case DType::F64: t.ptr<double>()[i] = v; break;
      case DType::BF16: t.ptr<bf16_bits>()[i] = float_to_bf16(float(v)); break;
      default: throw std::runtime_error("sim_check::fill: dtype");
    }
  }
}
inline double at(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<float>()[i];
    case DType::F64: return t.ptr<double>()[i];
    case DType::BF16: return bf16_to_float(t.ptr<bf16_bits>()[i]);
    case DType::I32: return t.ptr<int32_t>()[i];
    default: throw std::runtime_error("sim_check::at: dtype");
  }
}
inline void copy(const Tensor& dst, const Tensor& src) {
  if (dst.bytes() != src.bytes()) throw std::runtime_error("sim_check::copy: sizes");
  std::memcpy(dst.data, src.data, src.bytes());
}
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

// |got - want| <= atol + rtol |want| everywhere (NaN fails); prints the worst.
inline bool close(const std::string& what, const Tensor& got, const Tensor& want, double rtol,
                  double atol) {
  ++checks;
  if (got.numel() != want.numel()) return fail(what + ": sizes differ"), false;
  double worst = 0;
  int64_t wi = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (!(excess <= 0) && (wi < 0 || !(excess <= worst))) {
      worst = excess;
      wi = i;
      if (std::isnan(excess)) break;
    }
  }
  if (wi >= 0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, ": element %lld of %lld: got %.9g, want %.9g (rtol %g atol %g)",
                  (long long)wi, (long long)got.numel(), at(got, wi), at(want, wi), rtol, atol);
    fail(what + buf);
    return false;
  }
  return true;
}

// f must throw, and before any launch: an op refuses bad input up front.
inline void expect_throw(const std::string& what, const std::function<void()>& f) {
  ++checks;
  const size_t before = cuda_sim::launches.size();
  try {
    f();
  } catch (const std::exception&) {
    if (cuda_sim::launches.size() != before) fail(what + ": launched, then refused");
    return;
  }
  fail(what + ": accepted");
}

// Tolerances against the CPU backend: the kernels sum in another order
// (block reductions), so f32/f64 outputs agree to rounding and a bf16 output
// may round to the neighbouring value.
inline double rtol_of(DType dt) {
  return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-5 : 1.0 / 128;
}

// f(order) in both warp orders; returns after both.
inline void run_both(const std::function<void()>& f) {
  for (auto o : {cuda_sim::WarpOrder::Ascending, cuda_sim::WarpOrder::Descending}) {
    cuda_sim::launch_order = o;
    f();
  }
  cuda_sim::launch_order = cuda_sim::WarpOrder::Ascending;
}

inline std::string dtname(DType dt) { return dtype_name(dt); }

// The summary line and exit code of a test's main().
inline int finish(const char* family) {
  std::printf("%s: %d checks, %d failures, %zu launches emulated\n", family, checks, failures,
              cuda_sim::launches.size());
  return failures ? 1 : 0;
}

}  // namespace adgt::sim_check
