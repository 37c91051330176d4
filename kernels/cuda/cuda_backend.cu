// CUDA backend: device setup, memory (copy included: a device-to-device
// copy), the rated peak, and the methods of the elementwise ops (add, scale,
// cast, SwiGLU, rotary embedding), whose kernels and launch code are in
// pointwise_kernels.cuh.
#include <algorithm>
#include <chrono>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "kernels/common/bf16.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/pointwise_kernels.cuh"

namespace adgt {
using namespace cuda;

namespace {

// FP32 lanes per SM (the non-tensor rate) and dense TF32 tensor FLOP per clock per SM.
int fp32_lanes_per_sm(int major, int minor) {
  if (major == 7) return 64;
  if (major == 8) return minor == 0 ? 64 : 128;
  if (major == 9 || major == 10 || major == 12) return 128;
  return 0;
}
int tf32_flops_per_clock_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 1024;  // A100: 156 TFLOP/s at 1.41 GHz, 108 SMs
  if (major == 9 && minor == 0) return 2048;  // H100/H200: 495 TFLOP/s at 1.83 GHz, 132 SMs
  return 0;
}
// Dense bf16 tensor-core FLOP per clock per SM (fp32 accumulation).
int bf16_flops_per_clock_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;  // A100: 312 TFLOP/s at 1.41 GHz, 108 SMs
  if (major == 9 && minor == 0) return 4096;  // H100/H200: 989 TFLOP/s at 1.83 GHz, 132 SMs
  return 0;
}

}  // namespace

CudaBackend::CudaBackend(int device) {
  const char* op = "CudaBackend()";
  int n = 0;
  ADGT_CUDA_OP(cudaGetDeviceCount(&n), op);
  ADGT_CHECK(n > 0, "cuda backend: no CUDA device visible");
  ADGT_CHECK(device < n, "cuda backend: device " << device << " asked, but " << n
                                                 << " visible (CUDA_VISIBLE_DEVICES)");
  if (device >= 0) ADGT_CUDA_OP(cudaSetDevice(device), op);
  ADGT_CUDA_OP(cudaGetDevice(&device_), op);
  cudaDeviceProp prop{};
  ADGT_CUDA_OP(cudaGetDeviceProperties(&prop, device_), op);
  device_name_ = prop.name;
  sm_major_ = prop.major;
  sm_minor_ = prop.minor;
  sm_count_ = prop.multiProcessorCount;
  ADGT_CUDA_OP(cudaDeviceGetAttribute(&clock_khz_, cudaDevAttrClockRate, device_), op);
  cudaStream_t s = nullptr;
  ADGT_CUDA_OP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), op);
  stream_ = s;
  cublasHandle_t h = nullptr;
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasCreate)(&h), op);
  cublas_ = h;
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasSetStream)(h, s), op);
  set_tf32(false);
  void* e = nullptr;
  ADGT_CUDA_OP(cudaHostAlloc(&e, 4 * sizeof(int64_t), cudaHostAllocMapped), op);
  err_ = static_cast<int64_t*>(e);
  std::memset(err_, 0, 4 * sizeof(int64_t));
  void* ed = nullptr;
  ADGT_CUDA_OP(cudaHostGetDevicePointer(&ed, e, 0), op);
  err_dev_ = static_cast<int64_t*>(ed);
}

CudaBackend::~CudaBackend() {
  // No throwing from a destructor: errors here are ignored.
  if (stream_) (void)cudaStreamSynchronize(stream_);
  lt_release();
  attention_release();
  if (err_) (void)cudaFreeHost(err_);
  for (cudaEvent_t e : stage_event_)
    if (e) (void)cudaEventDestroy(e);
  if (stage_host_) (void)cudaFreeHost(stage_host_);
  for (cudaEvent_t e : mark_events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : span_events_) (void)cudaEventDestroy(e);
  for (void*& p : scratch_)
    if (p) (void)cudaFree(p), p = nullptr;
  if (cublas_) (void)ADGT_CUBLAS(cublasDestroy)(cublas_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaBackend::range_push(const char* name) { nvtxRangePushA(name); }
void CudaBackend::range_pop() { nvtxRangePop(); }

std::string CudaBackend::name() const {
  return "cuda (" + device_name_ + ", sm_" + std::to_string(sm_major_) +
         std::to_string(sm_minor_) + (tf32_ ? ", tf32" : "") + ")";
}

void CudaBackend::set_tf32(bool on) {
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasSetMathMode)(
                     cublas_, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                 "set_tf32");
  tf32_ = on;
  peak_tflops_ = 0;
}

// ---- memory ----

bool CudaBackend::is_device_pointer(const void* p) const {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // a plain host pointer on old runtimes: not an error to keep
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

int64_t CudaBackend::memory_capacity_bytes() const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return int64_t(total_b);
}

void* CudaBackend::alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_b, &total_b);
    std::ostringstream os;
    os << "alloc(" << bytes << " bytes; " << free_b << " of " << total_b << " free on device "
       << device_ << ")";
    call_failed("cudaMalloc(&p, bytes)", os.str().c_str(), cudaGetErrorString(e), __FILE__,
                __LINE__);
  }
  alloc_bytes_[p] = bytes;
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return p;
}

void CudaBackend::release(void* p) noexcept {
  if (!p) return;
  // Work still queued may use p: finish it first. Nothing here may throw
  // (destructors, unwinding): a failure — after a sticky fault, the fault of
  // an earlier op on the stream — is deferred to the next synchronize,
  // to_host or to_device, which throw it; ADGT_CUDA_SYNC=1 names the op that
  // caused it.
  cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    defer_error("release: cudaStreamSynchronize (the fault of an earlier op on the stream)",
                cudaGetErrorName(e));
  }
  e = cudaFree(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    defer_error("release: cudaFree", cudaGetErrorName(e));
  }
  if (auto it = alloc_bytes_.find(p); it != alloc_bytes_.end()) {
    live_bytes_ -= it->second;
    alloc_bytes_.erase(it);
  }
}

void CudaBackend::to_device(void* dst, const void* src, size_t bytes) {
  throw_deferred_error();
  if (!bytes) return;
  if (bytes <= kStageSlotBytes) {
    // Through a pinned slot, without waiting for the device: the host copy
    // into the slot is what makes src free again when this returns. A slot is
    // reused only after the event of its previous copy (16 slots: that copy
    // is normally long done).
    std::lock_guard<std::mutex> lock(stage_mu_);
    if (!stage_host_) {
      ADGT_CUDA_OP(cudaHostAlloc(&stage_host_, kStageSlots * kStageSlotBytes, cudaHostAllocDefault),
                   "to_device (pinned staging)");
      for (cudaEvent_t& e : stage_event_)
        ADGT_CUDA_OP(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "to_device");
    }
    const int i = stage_next_;
    stage_next_ = (i + 1) % kStageSlots;
    if (stage_busy_[i]) ADGT_CUDA_OP(cudaEventSynchronize(stage_event_[i]), "to_device");
    void* slot = static_cast<char*>(stage_host_) + size_t(i) * kStageSlotBytes;
    std::memcpy(slot, src, bytes);
    ADGT_CUDA_OP(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream_), "to_device");
    ADGT_CUDA_OP(cudaEventRecord(stage_event_[i], stream_), "to_device");
    stage_busy_[i] = true;
    return;
  }
  ADGT_CUDA_OP(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "to_device");
  ADGT_CUDA_OP(cudaStreamSynchronize(stream_), "to_device");
  check_device_errors("to_device");
}

void CudaBackend::to_host(void* dst, const void* src, size_t bytes) {
  ++host_reads_;
  throw_deferred_error();
  if (!bytes) return;
  ADGT_CUDA_OP(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "to_host");
  ADGT_CUDA_OP(cudaStreamSynchronize(stream_), "to_host");
  check_device_errors("to_host");
}

void CudaBackend::zero(Tensor t) {
  if (t.bytes()) ADGT_CUDA_OP(cudaMemsetAsync(t.data, 0, t.bytes(), stream_), "zero");
}

int CudaBackend::mark() {
  if (marks_used_ == int(mark_events_.size())) {
    cudaEvent_t e = nullptr;
    ADGT_CUDA_OP(cudaEventCreate(&e), "mark");
    mark_events_.push_back(e);
  }
  ADGT_CUDA_OP(cudaEventRecord(mark_events_[size_t(marks_used_)], stream_), "mark");
  return marks_used_++;
}

std::vector<double> CudaBackend::take_marks() {
  ++host_reads_;
  std::vector<double> s(size_t(marks_used_), 0.0);
  if (marks_used_ > 0) {
    ADGT_CUDA_OP(cudaEventSynchronize(mark_events_[size_t(marks_used_ - 1)]), "take_marks");
    for (int i = 1; i < marks_used_; ++i) {
      float ms = 0;
      ADGT_CUDA_OP(cudaEventElapsedTime(&ms, mark_events_[0], mark_events_[size_t(i)]), "take_marks");
      s[size_t(i)] = double(ms) * 1e-3;
    }
  }
  marks_used_ = 0;
  return s;
}

int CudaBackend::span_begin() {
  const size_t id = span_open_.size();
  if (id >= size_t(kMaxSpans)) return -1;
  while (span_events_.size() < 2 * (id + 1)) {
    cudaEvent_t e = nullptr;
    ADGT_CUDA_OP(cudaEventCreate(&e), "span_begin");
    span_events_.push_back(e);
  }
  ADGT_CUDA_OP(cudaEventRecord(span_events_[2 * id], stream_), "span_begin");
  span_open_.push_back(1);
  return int(id);
}

void CudaBackend::span_end(int id) {
  if (id < 0) return;
  ADGT_CHECK(size_t(id) < span_open_.size() && span_open_[size_t(id)],
             name() << ": span_end(" << id << "): no such open span (" << span_open_.size()
                    << " spans since clear_spans)");
  ADGT_CUDA_OP(cudaEventRecord(span_events_[2 * size_t(id) + 1], stream_), "span_end");
  span_open_[size_t(id)] = 0;
}

double CudaBackend::span_seconds(int id) {
  if (id < 0) return -1;
  ADGT_CHECK(size_t(id) < span_open_.size() && !span_open_[size_t(id)],
             name() << ": span_seconds(" << id << "): no such closed span (" << span_open_.size()
                    << " spans since clear_spans)");
  ADGT_CUDA_OP(cudaEventSynchronize(span_events_[2 * size_t(id) + 1]), "span_seconds");
  float ms = 0;
  ADGT_CUDA_OP(cudaEventElapsedTime(&ms, span_events_[2 * size_t(id)], span_events_[2 * size_t(id) + 1]),
               "span_seconds");
  return double(ms) * 1e-3;
}

void CudaBackend::clear_spans() { span_open_.clear(); }

void CudaBackend::synchronize() {
  ++host_reads_;
  throw_deferred_error();
  ADGT_CUDA_OP(cudaStreamSynchronize(stream_), "synchronize");
  check_device_errors("synchronize");
}

// Called after a stream synchronisation: the kernels that could set the words
// have finished and their writes to mapped host memory are visible.
void CudaBackend::check_device_errors(const char* where) {
  volatile int64_t* e = err_;
  if (!e || !e[0]) return;
  const int64_t kind = e[0], w1 = e[1], w2 = e[2], w3 = e[3];
  e[0] = 0;
  if (kind == 2) {  // moe_routing_kernels.cuh: a choice or slot out of range
    const int64_t which = w1 >> 32, i = w1 & 0xffffffff;
    ADGT_CHECK(false, "moe_dispatch_plan: " << (which ? "slot[" : "choice[") << i << "] = " << w2
                                            << " outside 0.." << w3 - 1
                                            << " (found on the device, reported at " << where
                                            << ")");
  }
  if (kind == 3) {  // combine_kernels.cuh: a row index past y
    ADGT_CHECK(false, "combine_rows: pos[" << w1 << "] = " << w2 << " outside y (" << w3
                                           << " rows) (found on the device, reported at "
                                           << where << ")");
  }
  const int32_t row = int32_t(w1 >> 32), target = int32_t(uint32_t(w1 & 0xffffffff));
  ADGT_CHECK(false, "cross_entropy: target " << target << " at row " << row
                                             << " outside the vocabulary [0," << w2
                                             << ") (found on the device, reported at " << where
                                             << ")");
}

void* CudaBackend::scratch(Scratch which, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (scratch_bytes_[which] < bytes) {
    if (scratch_[which]) {
      ADGT_CUDA_OP(cudaStreamSynchronize(stream_), "scratch");
      ADGT_CUDA_OP(cudaFree(scratch_[which]), "scratch");
      scratch_[which] = nullptr;
      scratch_bytes_[which] = 0;
    }
    const size_t grown = bytes + bytes / 4;
    ADGT_CUDA_OP(cudaMalloc(&scratch_[which], grown), "scratch");
    scratch_bytes_[which] = grown;
  }
  return scratch_[which];
}

// ---- peak ----

double CudaBackend::rated_tflops(DType dt) const {
  const double clk = double(clock_khz_) * 1e3, sms = double(sm_count_);
  if (dt == DType::F32 && tf32_)
    return sms * tf32_flops_per_clock_per_sm(sm_major_, sm_minor_) * clk / 1e12;
  if (dt == DType::F32) return sms * fp32_lanes_per_sm(sm_major_, sm_minor_) * 2.0 * clk / 1e12;
  if (dt == DType::BF16) {
    // NVIDIA's dense bf16 figures are quoted at the tensor-core boost clock,
    // 1.83 GHz on Hopper SXM (132 SMs x 4096 x 1.83 GHz = 989 TFLOP/s, the
    // figure MFU is measured against, docs/cuda.md), below the 1.98 GHz max SM clock
    // the device reports; 1.41 GHz on A100 (108 x 2048 x 1.41 = 312).
    const double quoted = sm_major_ == 9 ? 1.83e9 : sm_major_ == 8 && sm_minor_ == 0 ? 1.41e9 : clk;
    return sms * bf16_flops_per_clock_per_sm(sm_major_, sm_minor_) * std::min(clk, quoted) / 1e12;
  }
  return 0;  // fp64 rates differ too much between parts (H100 SXM vs PCIe, consumer cards)
}

double CudaBackend::peak_tflops() {
  if (peak_tflops_ > 0) return peak_tflops_;
  peak_tflops_ = rated_tflops(DType::F32);
  if (peak_tflops_ <= 0) peak_tflops_ = measure_gemm_tflops(4096);
  return peak_tflops_;
}

double CudaBackend::peak_tflops_for(DType dt) {
  if (dt != DType::BF16) return peak_tflops();
  const double r = rated_tflops(DType::BF16);
  return r > 0 ? r : measure_gemm_tflops(4096, DType::BF16);
}

double CudaBackend::measure_gemm_tflops(int64_t n, DType dt, int reps) {
  const size_t es = dtype_size(dt), bytes = size_t(n * n) * es;
  Buffer a(*this, bytes), b(*this, bytes), c(*this, bytes);
  // Non-zero inputs (zeros can run faster than real data): 1 and 0.5.
  {
    std::vector<char> host(bytes);
    auto fill = [&](double v) {
      for (int64_t i = 0; i < n * n; ++i) {
        if (dt == DType::F64)
          reinterpret_cast<double*>(host.data())[i] = v;
        else if (dt == DType::BF16)
          reinterpret_cast<bf16_bits*>(host.data())[i] = float_to_bf16(float(v));
        else
          reinterpret_cast<float*>(host.data())[i] = float(v);
      }
    };
    fill(1.0);
    to_device(a.data(), host.data(), bytes);
    fill(0.5);
    to_device(b.data(), host.data(), bytes);
  }
  Tensor ta(a.data(), dt, {n, n}), tb(b.data(), dt, {n, n}), tc(c.data(), dt, {n, n});
  double best = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    linear_forward(tc, ta, tb);
    synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);  // the first call loads the kernels
  }
  double c0 = 0;
  if (dt == DType::F64) {
    to_host(&c0, c.data(), 8);
  } else if (dt == DType::BF16) {
    bf16_bits h = 0;
    to_host(&h, c.data(), 2);
    c0 = bf16_to_float(h);
  } else {
    float f = 0;
    to_host(&f, c.data(), 4);
    c0 = f;
  }
  ADGT_CHECK(c0 == 0.5 * double(n), "measure_gemm_tflops: GEMM check failed (" << c0 << ")");
  return 2.0 * double(n) * double(n) * double(n) / best / 1e12;
}

// ---- elementwise ----

void CudaBackend::add_inplace(Tensor y, const Tensor& x) {
  cuda::add_inplace(cuda::op_ctx(*this), y, x);
}

void CudaBackend::copy(Tensor dst, const Tensor& src) {
  expect_same(dst, src, "copy");
  if (dst.bytes() && dst.data != src.data)
    ADGT_CUDA_OP(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_),
                 "copy");
}

void CudaBackend::scale_inplace(Tensor x, double s) {
  cuda::scale_inplace(cuda::op_ctx(*this), x, s);
}

void CudaBackend::cast(Tensor dst, const Tensor& src) {
  cuda::cast(cuda::op_ctx(*this), dst, src);
}

void CudaBackend::swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) {
  cuda::swiglu_forward(cuda::op_ctx(*this), h, gate, up);
}

void CudaBackend::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                                  const Tensor& up) {
  cuda::swiglu_backward(cuda::op_ctx(*this), dgate, dup, dh, gate, up);
}

void CudaBackend::rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_) {
  cuda::rope_forward(cuda::op_ctx(*this), x, cos, sin, T_);
}
void CudaBackend::rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T_) {
  cuda::rope_backward(cuda::op_ctx(*this), dx, cos, sin, T_);
}
void CudaBackend::qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv,
                                 const Tensor& cos, const Tensor& sin, int64_t T_) {
  cuda::qkv_rope_split(cuda::op_ctx(*this), q, k, v, qkv, cos, sin, T_);
}
void CudaBackend::qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk,
                                          const Tensor& dv, const Tensor& cos, const Tensor& sin,
                                          int64_t T_) {
  cuda::qkv_rope_merge_backward(cuda::op_ctx(*this), dqkv, dq, dk, dv, cos, sin, T_);
}
void CudaBackend::swiglu_packed_forward(Tensor h, const Tensor& gu) {
  cuda::swiglu_packed_forward(cuda::op_ctx(*this), h, gu);
}
void CudaBackend::swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) {
  cuda::swiglu_packed_backward(cuda::op_ctx(*this), dgu, dh, gu);
}

}  // namespace adgt
