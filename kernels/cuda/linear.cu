// CUDA linear layers: f32/f64 on cuBLAS, bf16 on cuBLASLt (gemm.cu; fp32
// accumulation, dw in f32). Row-major products go through column-major
// cuBLAS by the usual transpose identity: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, i.e. gemm(tb, ta, N, M, K, B, A).
#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

void check_dims(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                const char* op) {
  ADGT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             op << ": GEMM dimensions " << M << "x" << N << "x" << K
                << " exceed cuBLAS's 32-bit sizes");
}

// Row-major C(M,N) = alpha op(A) op(B) + beta C, as cpu::gemm in kernels/cpu/blas.hpp.
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
             int64_t ldc, const char* op) {
  if (M == 0 || N == 0) return;
  check_dims(M, N, K, lda, ldb, ldc, op);
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasSgemm)(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K),
                                          &alpha, B, int(ldb), A, int(lda), &beta, C, int(ldc)),
                 op);
}
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
             const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
             int64_t ldc, const char* op) {
  if (M == 0 || N == 0) return;
  check_dims(M, N, K, lda, ldb, ldc, op);
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasDgemm)(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K),
                                          &alpha, B, int(ldb), A, int(lda), &beta, C, int(ldc)),
                 op);
}

}  // namespace

void CudaBackend::linear_forward(Tensor y, const Tensor& x, const Tensor& w) {
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  ADGT_CHECK(
      x.ndim == 2 && w.ndim == 2 && w.dim(1) == I && y.numel() == N * O,
      "linear_forward: x" << x.shape_str() << " w" << w.shape_str() << " y" << y.shape_str());
  if (x.dtype == DType::BF16) {
    // bf16 x, w; y bf16 (or f32, e.g. logits kept in f32).
    ADGT_CHECK(w.dtype == DType::BF16 && (y.dtype == DType::BF16 || y.dtype == DType::F32),
               "linear_forward: bf16 x needs bf16 w and a bf16 or f32 y, got w "
                   << dtype_name(w.dtype) << ", y " << dtype_name(y.dtype));
    gemm_lt(false, true, N, O, I, x.data, I, w.data, I, 0.0f, y.data, y.dtype, O,
            "linear_forward");
    return;
  }
  ADGT_CHECK(x.dtype == w.dtype && y.dtype == w.dtype, "linear_forward: dtype mismatch");
  dispatch(x.dtype, "linear_forward", [&](auto z) {
    using T = decltype(z);
    gemm_rm(cublas_, false, true, N, O, I, T(1), x.ptr<T>(), I, w.ptr<T>(), I, T(0), y.ptr<T>(), O,
            "linear_forward");
  });
}

void CudaBackend::linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                                  const Tensor& w, bool accumulate_dx) {
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  ADGT_CHECK(
      dy.numel() == N * O && (!dw.data || dw.numel() == O * I),
      "linear_backward: dy" << dy.shape_str() << " x" << x.shape_str() << " dw" << dw.shape_str());
  if (x.dtype == DType::BF16) {
    // dx bf16 (overwritten or accumulated: read, added in fp32, rounded once); dw f32 +=.
    ADGT_CHECK(w.dtype == DType::BF16 && dy.dtype == DType::BF16,
               "linear_backward: bf16 x needs bf16 w and dy, got w " << dtype_name(w.dtype)
                                                                    << ", dy "
                                                                    << dtype_name(dy.dtype));
    if (dx.data) {
      ADGT_CHECK(dx.numel() == N * I && dx.dtype == DType::BF16,
                 "linear_backward: dx" << dx.shape_str() << " " << dtype_name(dx.dtype)
                                       << " (bf16 (N,I) expected)");
      gemm_lt(false, false, N, I, O, dy.data, O, w.data, I, accumulate_dx ? 1.0f : 0.0f, dx.data,
              DType::BF16, I, "linear_backward (dx)");
    }
    if (dw.data) {
      ADGT_CHECK(dw.dtype == DType::F32,
                 "linear_backward: dw is " << dtype_name(dw.dtype)
                                           << "; bf16 layers take f32 weight gradients");
      gemm_lt(true, false, O, I, N, dy.data, O, x.data, I, 1.0f, dw.data, DType::F32, I,
              "linear_backward (dw)");
    }
    return;
  }
  dispatch(x.dtype, "linear_backward", [&](auto z) {
    using T = decltype(z);
    if (dx.data) {
      ADGT_CHECK(dx.numel() == N * I, "linear_backward: dx" << dx.shape_str());
      gemm_rm(cublas_, false, false, N, I, O, T(1), dy.ptr<T>(), O, w.ptr<T>(), I,
              T(accumulate_dx ? 1 : 0), dx.ptr<T>(), I, "linear_backward (dx)");
    }
    if (dw.data)
      gemm_rm(cublas_, true, false, O, I, N, T(1), dy.ptr<T>(), O, x.ptr<T>(), I, T(1),
              dw.ptr<T>(), I, "linear_backward (dw)");
  });
}

}  // namespace adgt
