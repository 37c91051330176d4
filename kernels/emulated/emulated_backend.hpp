// train.device: emulated — the CPU reference backend behind the device
// boundary, so the CPU runs the code paths the CUDA backend takes:
//   - is_host() is false: the trainer, checkpoints, HF export, metrics, the
//     reducers, the pipeline executor and MoE take their device branches, and
//     collectives on its memory go through host staging (parallel/comm/device_comm.hpp);
//   - its memory (kernels/emulated/device_arena.hpp) is PROT_NONE outside its
//     own calls (a call opens the pages of its own tensors only): host code
//     that reads or writes it faults with a report of where (the address,
//     the buffer, a backtrace);
//   - every op checks that its tensors are device memory, and to_host /
//     to_device that the host side is not: a host pointer handed to a device
//     op (a crash on CUDA) is an error naming the op and the argument.
// The numbers are the CPU backend's, bit for bit.
#pragma once
#include <memory>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/device_arena.hpp"

namespace adgt {

class EmulatedBackend final : public Backend {
 public:
  // Reserves ADGT_EMULATED_MEMORY_GB (default 64) GiB of address space.
  EmulatedBackend();
  explicit EmulatedBackend(size_t reserve_bytes);

  std::string name() const override;  // "emulated device (cpu (OpenBLAS ...))"
  bool is_host() const override { return false; }
  // As a CUDA device's FP8 GEMMs (cuBLASLt): rows padded to 16 (Fp8Linears).
  int64_t fp8_row_multiple() const override { return 16; }
  bool is_device_pointer(const void* p) const override { return arena_.in_range(p); }
  const DeviceArena& arena() const { return arena_; }

  void* alloc(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void zero(Tensor t) override;
  int64_t peak_allocated_bytes() const override { return int64_t(arena_.peak()); }
  // The arena's reservation (ADGT_EMULATED_MEMORY_GB, default 64 GiB): what
  // alloc can hand out, as a GPU's memory.
  int64_t memory_capacity_bytes() const override { return int64_t(arena_.reserved()); }
  void synchronize() override;
  double peak_tflops() override { return cpu_.peak_tflops(); }
  bool peak_is_measured() const override { return true; }
  double remeasure_peak_tflops() override { return cpu_.remeasure_peak_tflops(); }

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
  void residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                const Tensor& w, double eps) override;
  void rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T) override;
  void rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T) override;
  int64_t attention_saved_elems(const AttentionShape& s) const override;
  void attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                         const Tensor& v, const AttentionShape& s) override;
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& saved,
                          const AttentionShape& s) override;
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
  void fp8_amax(Tensor amax, const Tensor& x, bool accumulate) override;
  void fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) override;
  void fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) override;
  void fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) override;
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
  // The clock's marks (the CPU's ops are done when they return); taking them
  // counts as the wait it is on CUDA.
  std::vector<double> take_marks() override {
    ++host_reads_;
    return Backend::take_marks();
  }
  void adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) override;
  void adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                  const AdamWHyper& h) override;

 private:
  // The device ranges one call opens.
  struct Ranges {
    DeviceArena::Range r[DeviceArena::kMaxRanges];
    int n = 0;
  };
  // Throws unless t is empty (data == nullptr) or lies in one live device
  // buffer; adds its range to r.
  void dev(const Tensor& t, const char* op, const char* arg, Ranges& r) const;

  DeviceArena arena_;
  CpuBackend cpu_;
  int64_t host_reads_ = 0;  // what a CUDA run would synchronise on: to_host, sum_squares, synchronize
};

}  // namespace adgt
