// The CUDA backend's FP8 ops (train.dtype: fp8, docs/fp8.md): the casts of
// kernels/cuda/fp8_kernels.cuh and the FP8 GEMMs on cuBLASLt (gemm.cu's
// gemm_lt_fp8), with the transposed codes the backward's products read:
//   y  (N,O)  = x (N,I)  . w (O,I)^T      A = x.q,   B = w.q
//   dx (N,I)  = dy (N,O) . wT (I,O)^T     A = dy.q,  B = w.qt
//   dw (O,I) += dyT (O,N) . xT (I,N)^T    A = dy.qt, B = x.qt
// A shape cuBLASLt's FP8 kernels do not take (a dimension not a multiple of
// 16, a misaligned pointer, codes without their transpose) runs the exact
// emulation instead (Backend's default: dequantize, fp32 GEMM), the same
// numbers up to summation order.
#include <cstdio>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_kernels.cuh"

namespace adgt {
using namespace cuda;

namespace {
bool fp8_gemm_ok(int64_t M, int64_t N, int64_t K, std::initializer_list<const void*> ptrs) {
  if (M % 16 || N % 16 || K % 16 || K == 0) return false;
  for (const void* p : ptrs)
    if (!p || reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}
void note_fallback(const char* op, int64_t M, int64_t N, int64_t K) {
  static bool said = false;
  if (said) return;
  said = true;
  std::fprintf(stderr,
               "note: %s: an FP8 GEMM of %lldx%lldx%lld is not in cuBLASLt's FP8 shapes "
               "(multiples of 16, aligned); it and others like it run dequantized in fp32\n",
               op, (long long)M, (long long)N, (long long)K);
}
}  // namespace

void CudaBackend::fp8_amax(Tensor amax, const Tensor& x, bool accumulate) {
  cuda::fp8_amax(op_ctx(*this), amax, x, accumulate);
}
void CudaBackend::fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) {
  cuda::fp8_scale(op_ctx(*this), scale, amax, kind, margin);
}
void CudaBackend::fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) {
  cuda::fp8_quantize(op_ctx(*this), q, qt, x, scale);
}
void CudaBackend::fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) {
  cuda::fp8_dequantize(op_ctx(*this), out, q, scale);
}

std::string CudaBackend::fp8_unsupported() const {
  if (sm_major_ * 10 + sm_minor_ >= 89) return "";
  return name() + ": FP8 GEMMs need sm_89 or newer (Ada, Hopper); use train.dtype: bf16";
}

void CudaBackend::linear_forward_fp8(Tensor y, const Fp8Operand& x, const Fp8Operand& w) {
  const char* op = "linear_forward_fp8";
  const int64_t N = x.q.dim(0), I = x.q.numel() / std::max<int64_t>(1, N), O = w.q.dim(0);
  ADGT_CHECK(w.q.numel() == O * I && y.numel() == N * O,
             op << ": x" << x.q.shape_str() << " w" << w.q.shape_str() << " y" << y.shape_str());
  if (!fp8_gemm_ok(N, O, I, {x.q.data, w.q.data, y.data})) {
    note_fallback(op, N, O, I);
    return Backend::linear_forward_fp8(y, x, w);
  }
  float* inv = static_cast<float*>(scratch(kScratchIndex, 4 * sizeof(float)));
  fp8_inverse_pair(op_ctx(*this), inv, x.scale.ptr<float>(), w.scale.ptr<float>());
  gemm_lt_fp8(N, O, I, x.q.data, x.q.dtype, inv, w.q.data, w.q.dtype, inv + 1, 0.0f, y.data,
              y.dtype, op);
}

void CudaBackend::linear_backward_fp8(Tensor dx, Tensor dw, const Fp8Operand& dy,
                                      const Fp8Operand& x, const Fp8Operand& w,
                                      bool accumulate_dx) {
  const char* op = "linear_backward_fp8";
  const int64_t N = dy.q.dim(0), O = w.q.dim(0), I = w.q.numel() / std::max<int64_t>(1, O);
  ADGT_CHECK(dy.q.numel() == N * O && (!dx.data || dx.numel() == N * I) &&
                 (!dw.data || dw.numel() == O * I),
             op << ": dy" << dy.q.shape_str() << " w" << w.q.shape_str() << " dx" << dx.shape_str()
                << " dw" << dw.shape_str());
  const bool ok_dx = !dx.data || fp8_gemm_ok(N, I, O, {dy.q.data, w.qt.data, dx.data});
  const bool ok_dw = !dw.data || fp8_gemm_ok(O, I, N, {dy.qt.data, x.qt.data, dw.data});
  if (!ok_dx || !ok_dw) {
    note_fallback(op, N, O, I);
    return Backend::linear_backward_fp8(dx, dw, dy, x, w, accumulate_dx);
  }
  float* inv = static_cast<float*>(scratch(kScratchIndex, 4 * sizeof(float)));
  if (dx.data) {
    fp8_inverse_pair(op_ctx(*this), inv, dy.scale.ptr<float>(), w.scale.ptr<float>());
    gemm_lt_fp8(N, I, O, dy.q.data, dy.q.dtype, inv, w.qt.data, w.qt.dtype, inv + 1,
                accumulate_dx ? 1.0f : 0.0f, dx.data, dx.dtype, op);
  }
  if (dw.data) {
    fp8_inverse_pair(op_ctx(*this), inv + 2, dy.scale.ptr<float>(), x.scale.ptr<float>());
    gemm_lt_fp8(O, I, N, dy.qt.data, dy.qt.dtype, inv + 2, x.qt.data, x.qt.dtype, inv + 3, 1.0f,
                dw.data, dw.dtype, op);
  }
}

}  // namespace adgt
