// Mixed precision (bf16) on the CPU reference backend, the simple way: an op
// called with bf16 tensors converts them to fp32 scratch, runs its fp32 code
// on the copies and rounds each bf16 output back once (a "+=" output is
// converted in first). So a bf16 op gives, bit for bit, float_to_bf16 of the
// fp32 op on the same values — the reference the CUDA kernels are tested
// against. This is not the fast path; the CUDA backend is.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "kernels/common/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt::cpu {

// Conversions are memory-bound and cheap: threads only for large tensors (a
// parallel region costs more than converting a small one, and far more when
// ranks or tests share the cores).
constexpr int64_t kParallelConvert = int64_t(1) << 16;

inline void bf16_to_f32(float* dst, const bf16_bits* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelConvert)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}
inline void f32_to_bf16(bf16_bits* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelConvert)
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

// fp32 copies of bf16 tensors for the duration of one op. The buffers are a
// per-thread, grow-only stack: an F32Scratch takes the next free ones and
// hands them back when it goes out of scope, so ops may nest.
class F32Scratch {
 public:
  F32Scratch() : base_(top()) {}
  ~F32Scratch() { top() = base_; }
  F32Scratch(const F32Scratch&) = delete;
  F32Scratch& operator=(const F32Scratch&) = delete;

  // t as an fp32 tensor: t itself unless it is bf16 (empty tensors stay
  // empty), else a scratch copy of its values.
  Tensor in(const Tensor& t) { return view(t, true); }
  // The same for an output that is overwritten: scratch with unspecified values.
  Tensor out(const Tensor& t) { return view(t, false); }
  // Rounds f (what in/out returned for t) into t when t is bf16.
  static void store(const Tensor& t, const Tensor& f) {
    if (t.dtype == DType::BF16 && t.data) f32_to_bf16(t.ptr<bf16_bits>(), f.ptr<float>(), t.numel());
  }

 private:
  Tensor view(const Tensor& t, bool load) {
    if (t.dtype != DType::BF16 || !t.data) return t;
    std::deque<std::vector<float>>& p = pool();
    if (top() == p.size()) p.emplace_back();
    std::vector<float>& buf = p[top()++];
    const int64_t n = t.numel();
    if (buf.size() < size_t(n)) buf.resize(size_t(n));
    Tensor f = t;
    f.dtype = DType::F32;
    f.data = buf.data();
    if (load) bf16_to_f32(buf.data(), t.ptr<bf16_bits>(), n);
    return f;
  }
  static size_t& top() {
    thread_local size_t used = 0;
    return used;
  }
  static std::deque<std::vector<float>>& pool() {
    thread_local std::deque<std::vector<float>> bufs;
    return bufs;
  }
  size_t base_;
};

}  // namespace adgt::cpu

namespace adgt {

// The dtype of fp32 statistics and parameter gradients (rstd, saved, losses,
// ce stats, dw, dtable) for activations in `act`: f32 for bf16, else act.
inline DType stat_dtype(DType act) { return act == DType::BF16 ? DType::F32 : act; }

// Checks that tensor `name` of `op` is in `want` when the op's activations are
// in `act` (an empty tensor passes): "linear_backward: dw bf16, expected f32
// with bf16 inputs".
inline void expect_dtype(const Tensor& t, DType want, DType act, const char* op,
                         const char* name) {
  ADGT_CHECK(!t.data || t.dtype == want, op << ": " << name << " " << dtype_name(t.dtype)
                                            << ", expected " << dtype_name(want) << " with "
                                            << dtype_name(act) << " inputs");
}

}  // namespace adgt
