// Run-time backend choice, and the deferred-failure path of Backend.
#include "kernels/backend.hpp"

#include <dlfcn.h>
#include <omp.h>
#include <time.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "kernels/check.hpp"
#include "kernels/clock.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/emulated_backend.hpp"
#ifdef ADGT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace adgt {

#ifndef ADGT_HAVE_CUDA
DeviceQuery cuda_device_query() { return {}; }
std::string cuda_device_uuid(int device) {
  ADGT_CHECK(false, "cuda_device_uuid(" << device << "): this binary was built without CUDA");
}
#endif

int cuda_device_count() { return cuda_device_query().count; }

bool nvidia_driver_present() {
  std::error_code ec;
  if (std::filesystem::exists("/dev/nvidiactl", ec)) return true;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) return false;
  dlclose(h);
  return true;
}

bool cuda_backend_built() {
#ifdef ADGT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void Backend::defer_error(const char* op, const char* what) noexcept {
  try {
    if (deferred_error_.empty())
      deferred_error_ = std::string(op) + ": " + what;
    else
      ++deferred_more_;
  } catch (...) {  // out of memory for the message: keep what there is
  }
}

void Backend::sum_squares_ranges(Tensor out, const Tensor& x, const std::vector<int64_t>& bounds) {
  const size_t k = bounds.size() / 2;
  ADGT_CHECK(out.dtype == DType::F64 && size_t(out.numel()) >= k && bounds.size() % 2 == 0,
             "sum_squares_ranges: out " << out.shape_str() << " " << dtype_name(out.dtype)
                                        << " for " << k << " ranges (F64, one per range)");
  std::vector<double> s(k);
  const size_t es = dtype_size(x.dtype);
  for (size_t i = 0; i < k; ++i)
    s[i] = sum_squares(Tensor(static_cast<char*>(x.data) + size_t(bounds[2 * i]) * es, x.dtype,
                              {bounds[2 * i + 1] - bounds[2 * i]}));
  if (k) to_device(out.data, s.data(), k * sizeof(double));
}

// The blockwise attention ops (ring attention) where a backend has none.
void Backend::attention_block_forward(Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&,
                                      const AttentionBlock&) {
  ADGT_CHECK(false, "attention_block_forward: not implemented on this backend (" << name()
                        << "); context parallelism (ring attention) runs on the cpu and "
                           "emulated devices for now");
}
void Backend::attention_merge(Tensor, Tensor, const Tensor&, const Tensor&) {
  ADGT_CHECK(false, "attention_merge: not implemented on this backend ("
                        << name() << "); context parallelism (ring attention) runs on the cpu "
                                     "and emulated devices for now");
}
void Backend::attention_block_backward(Tensor, Tensor, Tensor, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const AttentionBlock&, bool) {
  ADGT_CHECK(false, "attention_block_backward: not implemented on this backend ("
                        << name() << "); context parallelism (ring attention) runs on the cpu "
                                     "and emulated devices for now");
}

int Backend::mark() {
  marks_.push_back(std::chrono::steady_clock::now());
  return int(marks_.size()) - 1;
}

std::vector<double> Backend::take_marks() {
  std::vector<double> s(marks_.size());
  for (size_t i = 0; i < marks_.size(); ++i)
    s[i] = std::chrono::duration<double>(marks_[i] - marks_[0]).count();
  marks_.clear();
  return s;
}

int Backend::span_begin() {
  // The kernels' other threads are not this one's CPU clock.
  if (!span_clock_ && omp_get_max_threads() != 1) return -1;
  if (spans_.size() / 2 >= size_t(kMaxSpans)) return -1;
  spans_.push_back(span_clock_ ? span_clock_() : thread_cpu_seconds());
  spans_.push_back(-1);
  return int(spans_.size() / 2) - 1;
}

void Backend::span_end(int id) {
  if (id < 0) return;
  ADGT_CHECK(size_t(id) < spans_.size() / 2 && spans_[2 * size_t(id) + 1] < 0,
             name() << ": span_end(" << id << "): no such open span (" << spans_.size() / 2
                    << " spans since clear_spans)");
  spans_[2 * size_t(id) + 1] = span_clock_ ? span_clock_() : thread_cpu_seconds();
}

double Backend::span_seconds(int id) {
  if (id < 0) return -1;
  ADGT_CHECK(size_t(id) < spans_.size() / 2 && spans_[2 * size_t(id) + 1] >= 0,
             name() << ": span_seconds(" << id << "): no such closed span (" << spans_.size() / 2
                    << " spans since clear_spans)");
  return spans_[2 * size_t(id) + 1] - spans_[2 * size_t(id)];
}

void Backend::clear_spans() { spans_.clear(); }

void Backend::throw_deferred_error() {
  if (deferred_error_.empty()) return;
  std::string msg = name() + ": " + deferred_error_;
  if (deferred_more_ > 0) msg += " (and " + std::to_string(deferred_more_) + " later failures)";
  msg += "; reported here because it happened where nothing may throw (a buffer being freed)";
  deferred_error_.clear();
  deferred_more_ = 0;
  throw std::runtime_error(msg);
}

DeviceChoice choose_device(const std::string& device, const DeviceQuery& q, bool cuda_built) {
  if (device == "cpu" || device == "emulated") return {device, ""};
  if (device != "auto" && device != "cuda")
    ADGT_CHECK(false, "unknown device '" << device << "'; use auto, cpu, cuda or emulated");
  if (!cuda_built) {
    ADGT_CHECK(device == "auto",
               "train.device=cuda: this binary was built without CUDA (nvcc was not found "
               "at configure time); use train.device=cpu or auto, or rebuild with the "
               "CUDA toolkit installed");
    return {"cpu", ""};  // no CUDA backend in this build
  }
  if (q.count > 0) return {"cuda", ""};
  const std::string fix =
      q.error.find("InsufficientDriver") != std::string::npos
          ? "the NVIDIA driver is older than this CUDA runtime needs: update the driver"
          : "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES";
  if (device == "auto") {
    if (q.error.empty() || !q.driver) return {"cpu", ""};  // no GPU here: the CPU, silently
    return {"cpu", "train.device=auto: the CUDA runtime could not list devices: " + q.error + "; " +
                       fix + ". Training on the CPU."};
  }
  ADGT_CHECK(q.driver, "train.device=cuda: no NVIDIA driver is installed on this machine "
                      "(libcuda.so.1 does not load, no /dev/nvidiactl; the CUDA runtime says "
                          << q.error << "); use train.device=cpu or auto here");
  ADGT_CHECK(q.error.empty(), "train.device=cuda: the CUDA runtime could not list devices: "
                                  << q.error << "; " << fix << ", or use train.device=cpu");
  ADGT_CHECK(false, "train.device=cuda: no CUDA device is visible (check the driver and "
                    "CUDA_VISIBLE_DEVICES); use train.device=cpu or auto");
}

std::unique_ptr<Backend> make_backend(const std::string& device, int cuda_device) {
  const DeviceChoice c =
      choose_device(device, device == "cpu" || device == "emulated" ? DeviceQuery{} : cuda_device_query(),
                    cuda_backend_built());
  if (!c.warning.empty()) std::fprintf(stderr, "warning: %s\n", c.warning.c_str());
#ifdef ADGT_HAVE_CUDA
  if (c.device == "cuda") return std::make_unique<CudaBackend>(cuda_device);
#endif
  if (c.device == "emulated") return std::make_unique<EmulatedBackend>();
  return std::make_unique<CpuBackend>();
}

}  // namespace adgt

// ---- FP8 defaults (kernels/backend.hpp) ----
namespace adgt {

void Backend::fp8_amax(Tensor, const Tensor&, bool) {
  ADGT_CHECK(false, name() << ": FP8 (train.dtype: fp8) is not implemented on this backend");
}
void Backend::fp8_scale(Tensor, const Tensor&, Fp8Kind, int) {
  ADGT_CHECK(false, name() << ": FP8 (train.dtype: fp8) is not implemented on this backend");
}
void Backend::fp8_quantize(Tensor, Tensor, const Tensor&, const Tensor&) {
  ADGT_CHECK(false, name() << ": FP8 (train.dtype: fp8) is not implemented on this backend");
}
void Backend::fp8_dequantize(Tensor, const Tensor&, const Tensor&) {
  ADGT_CHECK(false, name() << ": FP8 (train.dtype: fp8) is not implemented on this backend");
}

namespace {
// An F32 copy of an FP8 operand's values (q / scale) in `buf`.
Tensor dequantized(Backend& be, Buffer& buf, const Fp8Operand& o) {
  buf = Buffer(be, size_t(o.q.numel()) * 4);
  Tensor t = o.q;
  t.data = buf.data();
  t.dtype = DType::F32;
  be.fp8_dequantize(t, o.q, o.scale);
  return t;
}
// out itself when it is F32, else F32 scratch in `buf` (holding out's values if `load`).
Tensor f32_view(Backend& be, Buffer& buf, const Tensor& out, bool load) {
  if (!out.data || out.dtype == DType::F32) return out;
  buf = Buffer(be, size_t(out.numel()) * 4);
  Tensor t = out;
  t.data = buf.data();
  t.dtype = DType::F32;
  if (load) be.cast(t, out);
  return t;
}
}  // namespace

void Backend::linear_forward_fp8(Tensor y, const Fp8Operand& x, const Fp8Operand& w) {
  Buffer bx, bw, by;
  const Tensor xf = dequantized(*this, bx, x), wf = dequantized(*this, bw, w);
  const Tensor yf = f32_view(*this, by, y, false);
  linear_forward(yf, xf, wf);
  if (yf.data != y.data) cast(y, yf);
}

void Backend::linear_backward_fp8(Tensor dx, Tensor dw, const Fp8Operand& dy, const Fp8Operand& x,
                                  const Fp8Operand& w, bool accumulate_dx) {
  Buffer bdy, bx, bw, bdx;
  const Tensor dyf = dequantized(*this, bdy, dy), wf = dequantized(*this, bw, w);
  const Tensor xf = dw.data ? dequantized(*this, bx, x) : Tensor(nullptr, DType::F32, {x.q.dim(0), x.q.dim(1)});
  const Tensor dxf = f32_view(*this, bdx, dx, accumulate_dx);
  linear_backward(dxf, dw, dyf, xf, wf, accumulate_dx);
  if (dxf.data && dxf.data != dx.data) cast(dx, dxf);
}

}  // namespace adgt
