// CPU reference backend: fp32 (and fp64, for finite-difference tests and for
// measuring summation-order error) with OpenBLAS GEMMs and OpenMP loops. bf16
// (backend.hpp's mixed-precision rules) runs the fp32 code on fp32 copies and
// rounds each bf16 output once (kernels/cpu/mixed.hpp): the bit-exact
// reference for the CUDA backend's bf16 kernels.
#pragma once
#include "kernels/backend.hpp"
#include "kernels/check.hpp"

namespace adgt {

class CpuBackend : public Backend {
 public:
  CpuBackend();

 private:
  double peak_tflops_ = 0;

 public:
  std::string name() const override;  // "cpu (OpenBLAS <core>)"
  bool is_host() const override { return true; }

  void* alloc(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void zero(Tensor t) override;
  double peak_tflops() override;  // best of a few 1024^3 sgemm timings, cached
  double remeasure_peak_tflops() override;

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
                                const Tensor& w, double eps) override;  // fused
  void rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T) override;
  void rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T) override;
  void qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv, const Tensor& cos,
                      const Tensor& sin, int64_t T) override;
  void qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& cos, const Tensor& sin, int64_t T) override;
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
  void swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                       const Tensor& up) override;
  void swiglu_packed_forward(Tensor h, const Tensor& gu) override;
  void swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) override;
  void add_inplace(Tensor y, const Tensor& x) override;
  void copy(Tensor dst, const Tensor& src) override;
  void scale_inplace(Tensor x, double s) override;
  void cast(Tensor dst, const Tensor& src) override;
  void fp8_amax(Tensor amax, const Tensor& x, bool accumulate) override;
  void fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) override;
  void fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) override;
  void fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) override;
  void combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                    bool accumulate) override;  // in embedding.cpp (indexed rows)
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
  void adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWHyper& h) override;
  void adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                  const AdamWHyper& h) override;  // fused: one pass
};

// Calls f(T{}) with T = float or double according to `dt` (bf16 ops convert
// to f32 before they dispatch); op bodies are
// generic lambdas (`[&](auto z) { using T = decltype(z); ... }`), so OpenMP
// pragmas inside them work (they would not inside a macro argument).
template <class F>
void cpu_dispatch(DType dt, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::F64:
      f(double{});
      break;
    default:
      ADGT_CHECK(false, "cpu backend: unsupported dtype " << dtype_name(dt));
  }
}


}  // namespace adgt
