// CUDA backend: fp32 and fp64 on one GPU (GEMMs through cuBLAS, every other op
// a straightforward handwritten kernel with the CPU backend's semantics,
// kernels/cpu/), and the bf16 mixed-precision contract of kernels/backend.hpp
// (GEMMs through cuBLASLt, vectorised memory-bound kernels with fp32 math).
// See docs/cuda.md.
//
// This header needs no CUDA headers (the stream and cuBLAS handle are
// forward-declared), so host-only C++ (backend.cpp, tests) can include it.
#pragma once
#include <mutex>
#include <cstddef>
#include <string>
#include <initializer_list>
#include <memory>
#include <set>
#include <unordered_map>

#include "kernels/backend.hpp"

struct CUstream_st;
struct CUevent_st;     // cudaEvent_t = CUevent_st*    // cudaStream_t = CUstream_st*
struct cublasContext;  // cublasHandle_t = cublasContext*

namespace adgt {

class CudaBackend final : public Backend {
 public:
  // Uses CUDA device `device` (cudaSetDevice), or the current one when
  // device < 0. Throws, naming the call, when no device is usable.
  explicit CudaBackend(int device = -1);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;  // "cuda (NVIDIA H200, sm_90)"
  // NVTX ranges (the CUDA toolkit's header-only nvtx3: no library to link;
  // without a profiler attached each call returns at once).
  bool has_ranges() const override { return true; }
  void range_push(const char* name) override;
  void range_pop() override;
  bool is_host() const override { return false; }
  bool is_device_pointer(const void* p) const override;  // cudaPointerGetAttributes
  int64_t peak_allocated_bytes() const override { return int64_t(peak_bytes_); }
  int64_t memory_capacity_bytes() const override;  // cudaMemGetInfo's total

  // ---- CUDA-specific ----
  CUstream_st* stream() const { return stream_; }  // every op runs on this stream
  int device() const { return device_; }
  // fp32 GEMMs on the tensor cores in TF32 (off by default: full fp32, the
  // CPU backend's numbers to within rounding). peak_tflops() follows the mode.
  void set_tf32(bool on);
  bool tf32() const { return tf32_; }
  // Times an n^3 GEMM in the current math mode and dtype (best of `reps`), in TFLOP/s.
  double measure_gemm_tflops(int64_t n, DType dt = DType::F32, int reps = 10);
  // The rated dense figure from the device's attributes (see peak_tflops), 0 if
  // unknown: F32 (fp32 lanes, or TF32 tensor cores when set_tf32(true)) and
  // BF16 (dense bf16 tensor cores, fp32 accumulation).
  double rated_tflops(DType dt) const;

  // ---- attention kernels (train.attention; attention.cu, kernels/attention_choice.hpp) ----
  // bf16 attention's kernel: auto | flash | cudnn | exact (f32/f64 have the
  // exact kernel only). Unset: flash. ADGT_ATTENTION, when set, overrides it
  // (read on every call). Throws for an unknown value, and for cudnn in a
  // build without cuDNN attention, naming the fix.
  void set_attention(const std::string& setting);
  // The kernel bf16 attention runs for s ("flash", "cudnn", "exact"); under
  // auto, the decision taken for s ("" while undecided), kept apart for
  // document-masked s (s.doc_start non-null; never cudnn).
  std::string attention_kernel(const AttentionShape& s);

  // Grow-only device scratch, one per purpose; contents are only valid within
  // one op (all ops run in order on stream()). The kernel headers' ops get it
  // through their OpCtx (cuda_common.cuh).
  enum Scratch { kScratchIndex = 0, kScratchAttention, kScratchReduce, kScratchFlash, kScratchGemm, kScratchCudnn, kNumScratch };
  void* scratch(Scratch which, size_t bytes);
  // Device address of the error words ops write device-found errors to (see err_).
  int64_t* device_error_words() const { return err_dev_; }

  // ---- memory ----
  void* alloc(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void zero(Tensor t) override;
  void synchronize() override;
  // The device's rated dense fp32 figure: SMs x fp32 lanes per SM x 2 x max SM
  // clock (the TF32 tensor-core figure when set_tf32(true)); a cuBLAS timing
  // where the architecture is not in the table.
  double peak_tflops() override;
  // bf16: the rated dense bf16 tensor-core figure (989 TFLOP/s on H100/H200
  // SXM), a timed bf16 GEMM where the architecture is not in the table.
  double peak_tflops_for(DType dt) override;

  void linear_forward(Tensor y, const Tensor& x, const Tensor& w) override;
  void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       bool accumulate_dx) override;
  void embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                         int64_t vocab_start) override;
  void embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                          int64_t vocab_start) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                       double eps) override;
  void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                        const Tensor& rstd) override;
  // bf16: one kernel (x += y rounded to bf16, then the norm of the rounded x);
  // f32/f64: add_inplace then rmsnorm_forward.
  void residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                const Tensor& w, double eps) override;
  void rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T) override;
  void rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T) override;
  // saved = the row log-sum-exp (B, H, T); the backward recomputes the probabilities.
  int64_t attention_saved_elems(const AttentionShape& s) const override;
  void attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                         const Tensor& v, const AttentionShape& s) override;
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& saved,
                          const AttentionShape& s) override;
  // Blockwise attention with log-sum-exp (ring attention): the exact kernels
  // on a block's dims (attention_block_kernels.cuh); f32, f64, bf16 through
  // fp32 copies. Not the flash or cuDNN kernels.
  void attention_block_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                               const Tensor& v, const AttentionBlock& b) override;
  void attention_merge(Tensor out, Tensor lse, const Tensor& out_b, const Tensor& lse_b) override;
  void attention_block_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const AttentionBlock& b,
                                bool accumulate_dq) override;
  void qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv, const Tensor& cos,
                      const Tensor& sin, int64_t T) override;
  void qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& cos, const Tensor& sin, int64_t T) override;
  void swiglu_packed_forward(Tensor h, const Tensor& gu) override;
  void swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) override;
  void swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                       const Tensor& up) override;
  void add_inplace(Tensor y, const Tensor& x) override;
  void copy(Tensor dst, const Tensor& src) override;
  void scale_inplace(Tensor x, double s) override;
  void cast(Tensor dst, const Tensor& src) override;
  void combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                    bool accumulate) override;
  void combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                             const Tensor& pos, const Tensor& w) override;
  void moe_route(const MoeRouting& r, const Tensor& logits, const Tensor& bias) override;
  void moe_dispatch_plan(Tensor pos, Tensor send_tok, Tensor stats, const Tensor& choice,
                         const Tensor& probs, const Tensor& slot,
                         const MoeCapacity& cap) override;
  void moe_router_backward(Tensor dlogits, const MoeRouting& r, const Tensor& dw,
                           const Tensor& aux_dp, double a) override;
  void cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                     double grad_scale) override;
  void ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_start, int64_t valid) override;
  void ce_combine(Tensor combined, const Tensor& gathered) override;
  void ce_finish(Tensor logits, Tensor losses, const Tensor& combined, const Tensor& targets,
                 int64_t vocab_start, int64_t valid, double grad_scale) override;
  double sum_squares(const Tensor& x) override;
  void sum_squares_ranges(Tensor out, const Tensor& x, const std::vector<int64_t>& bounds) override;
  int64_t host_reads() const override { return host_reads_; }
  int mark() override;                        // an event recorded on the stream
  std::vector<double> take_marks() override;  // one wait, then cudaEventElapsedTime
  int span_begin() override;                  // an event pair from a pool; the begin recorded
  void span_end(int id) override;             // the end recorded on the stream
  double span_seconds(int id) override;       // waits for the end event, then cudaEventElapsedTime
  void clear_spans() override;
  // ---- FP8 (fp8.cu; kernels/cuda/fp8_kernels.cuh; GEMMs on cuBLASLt, sm_89+) ----
  void fp8_amax(Tensor amax, const Tensor& x, bool accumulate) override;
  void fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) override;
  void fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) override;
  void fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) override;
  bool fp8_needs_transpose() const override { return true; }
  int64_t fp8_row_multiple() const override { return 16; }
  std::string fp8_unsupported() const override;
  void linear_forward_fp8(Tensor y, const Fp8Operand& x, const Fp8Operand& w) override;
  void linear_backward_fp8(Tensor dx, Tensor dw, const Fp8Operand& dy, const Fp8Operand& x,
                           const Fp8Operand& w, bool accumulate_dx) override;
  void adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) override;
  // f32 master/grad/m/v with a bf16 copy: one kernel; other dtypes: adamw then cast.
  void adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                  const AdamWHyper& h) override;

 private:

  // Row-major C(M,N) = op(A) op(B) + beta C on cuBLASLt: A, B bf16, fp32
  // accumulation and scale, C bf16 or f32 (gemm.cu).
  void gemm_lt(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
               const void* B, int64_t ldb, float beta, void* C, DType c_dtype, int64_t ldc,
               const char* op);
  // Row-major C(M,N) = A(M,K) B(N,K)^T on FP8 operands (values: codes times
  // a_inv[0] / b_inv[0], device pointers), fp32 accumulation, C bf16 or f32
  // (gemm.cu).
  void gemm_lt_fp8(int64_t M, int64_t N, int64_t K, const void* A, DType a_dtype,
                   const float* a_inv, const void* B, DType b_dtype, const float* b_inv, float beta,
                   void* C, DType c_dtype, const char* op);
  struct LtState;           // cuBLASLt handle and plan cache (gemm.cu), made on first use
  LtState* lt_ = nullptr;
  void lt_release();        // gemm.cu

  // Errors found on the device are written to pinned, mapped host words and
  // thrown at the next host synchronisation (synchronize, to_host, a
  // synchronous to_device): [0] the kind (1: cross_entropy's target range,
  // 2: moe_dispatch_plan's choice or slot, 3: combine_rows' row index), [1..3]
  // what check_device_errors names.
  int64_t* err_ = nullptr;      // host address
  int64_t* err_dev_ = nullptr;  // the device's address of the same words
  void check_device_errors(const char* where);

  // Asynchronous host-to-device copies (to_device): copies of up to
  // kStageSlotBytes go through a ring of pinned host slots: the source is
  // copied into a slot, the copy is queued on the stream, and an event marks
  // when the slot is free again; to_device returns without waiting for the
  // device. Larger copies (checkpoint loads) wait as before.
  static constexpr int kStageSlots = 16;
  static constexpr size_t kStageSlotBytes = size_t(1) << 20;
  void* stage_host_ = nullptr;                // kStageSlots x kStageSlotBytes, pinned
  CUevent_st* stage_event_[kStageSlots] = {};  // the last copy out of each slot
  bool stage_busy_[kStageSlots] = {};
  int stage_next_ = 0;
  std::mutex stage_mu_;

  int device_ = 0;
  int sm_major_ = 0, sm_minor_ = 0, sm_count_ = 0, clock_khz_ = 0;
  std::string device_name_;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  bool tf32_ = false;
  double peak_tflops_ = 0;  // cached for the current math mode
  void* scratch_[kNumScratch] = {};
  size_t scratch_bytes_[kNumScratch] = {};
  std::unordered_map<void*, size_t> alloc_bytes_;  // live alloc() buffers
  size_t live_bytes_ = 0, peak_bytes_ = 0;
  int64_t host_reads_ = 0;  // to_host, synchronize and take_marks calls
  std::set<std::string> attention_fallbacks_;  // reasons already logged (attention.cu)
  // The attention setting, auto's decisions per shape and cuDNN's graphs
  // (attention.cu); released before the stream (attention_release).
  struct AttentionState;
  std::shared_ptr<AttentionState> attn_;
  void attention_release() noexcept;
  enum class AttnKernel { Flash, Cudnn, Exact };
  // The kernel a bf16 call takes (deciding under auto; q, k, v: the call's
  // inputs, the probe's data); `tensors`: every tensor of the call (alignment).
  AttnKernel attention_kernel_for(const AttentionShape& s, const Tensor& q, const Tensor& k,
                                  const Tensor& v, std::initializer_list<const void*> tensors);
  void run_attention_forward(AttnKernel kind, Tensor out, Tensor saved, const Tensor& q,
                             const Tensor& k, const Tensor& v, const AttentionShape& s);
  void run_attention_backward(AttnKernel kind, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& saved, const AttentionShape& s);
  AttnKernel decide_attention(const AttentionShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, bool flash_ok);
  // Whether bf16 attention takes the flash kernels for s with these tensors
  // (cuda_attention_path); logs the first fallback of each reason.
  bool flash_path(const AttentionShape& s, std::initializer_list<const void*> tensors);
  // Whether a ring block (bf16) runs the flash kernels: a full block or a
  // square causal one, and flash_path's rule on its shape (fallbacks logged
  // once per reason).
  bool block_flash(const AttentionBlock& b, const Tensor& q,
                   std::initializer_list<const void*> tensors);
  std::vector<CUevent_st*> mark_events_;  // the pool mark() records into (cudaEvent_t)
  int marks_used_ = 0;
  std::vector<CUevent_st*> span_events_;  // per span id: begin, end (cudaEvent_t), reused after clear_spans
  std::vector<char> span_open_;           // per span id in use: 1 until span_end
};

}  // namespace adgt
