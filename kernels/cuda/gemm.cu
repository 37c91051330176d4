// bf16 GEMMs on cuBLASLt: A and B bf16, fp32 accumulation (CUBLAS_COMPUTE_32F)
// and fp32 alpha/beta, C = D in bf16 or f32 (both supported cuBLASLt
// combinations). Row-major products go through the column-major library by the
// transpose identity, as linear.cu does: row-major C(M,N) = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T.
//
// A plan (operation and layout descriptors plus the heuristic's best algorithm)
// is made once per (shape, transposes, leading dimensions, C dtype, beta != 0,
// pointer alignments) and cached: the heuristic query costs tens of
// microseconds, the lookup nothing. The workspace is the backend's kScratchGemm
// scratch, a fixed 32 MiB (what cuBLAS recommends for Hopper), allocated once.
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct LtKey {
  int64_t m, n, k, lda, ldb, ldc;
  int opa, opb, ctype, beta_nonzero;
  unsigned align_a, align_b, align_c;
  int atype = -1, btype = -1;  // the library's A and B types: -1 bf16, else FP8 (gemm_lt_fp8)
  auto tie() const {
    return std::tie(m, n, k, lda, ldb, ldc, opa, opb, ctype, beta_nonzero, align_a, align_b,
                    align_c, atype, btype);
  }
  bool operator<(const LtKey& o) const { return tie() < o.tie(); }
};

struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

void destroy(LtPlan& p) {
  if (p.a) (void)ADGT_CUBLAS(cublasLtMatrixLayoutDestroy)(p.a);
  if (p.b) (void)ADGT_CUBLAS(cublasLtMatrixLayoutDestroy)(p.b);
  if (p.c) (void)ADGT_CUBLAS(cublasLtMatrixLayoutDestroy)(p.c);
  if (p.op) (void)ADGT_CUBLAS(cublasLtMatmulDescDestroy)(p.op);
  p = LtPlan{};
}

// ADGT_LT_ANY_REDUCTION=1: let cuBLASLt pick any split-K reduction for bf16
// outputs (see gemm_lt); read once.
bool any_reduction() {
  static const bool on = [] {
    const char* v = std::getenv("ADGT_LT_ANY_REDUCTION");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// The largest power of two (at most 256) dividing the address.
unsigned alignment_of(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = u & (~u + 1);
  return low == 0 || low > 256 ? 256u : unsigned(low);
}

// The operation descriptor of a plan: fp32 compute and scale, the transposes.
void make_desc(LtPlan& p, cublasOperation_t opa, cublasOperation_t opb, const char* op) {
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescCreate)(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), op);
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescSetAttribute)(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                             &opa, sizeof opa),
                 op);
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescSetAttribute)(p.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                             &opb, sizeof opb),
                 op);
}

// "" when cublasLtMatmul returned success (and, under ADGT_CUDA_SYNC=1, the
// GEMM's own device errors are none), else what went wrong.
std::string matmul_error(cublasStatus_t st) {
  if (st != CUBLAS_STATUS_SUCCESS) return ADGT_CUBLAS(cublasGetStatusString)(st);
  if (sync_debug()) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  }
  return "";
}

}  // namespace

struct CudaBackend::LtState {
  cublasLtHandle_t handle = nullptr;
  std::map<LtKey, LtPlan> plans;
  void make_room() {  // many shapes (a sweep): start over
    if (plans.size() < 4096) return;
    for (auto& kv : plans) destroy(kv.second);
    plans.clear();
  }
  static LtState* make(const char* op) {
    auto* st = new LtState;
    const cublasStatus_t e = ADGT_CUBLAS(cublasLtCreate)(&st->handle);
    if (e != CUBLAS_STATUS_SUCCESS) {
      delete st;
      call_failed("cublasLtCreate(&handle)", op, ADGT_CUBLAS(cublasGetStatusString)(e), __FILE__,
                  __LINE__);
    }
    return st;
  }
  ~LtState() {
    for (auto& kv : plans) destroy(kv.second);
    if (handle) (void)ADGT_CUBLAS(cublasLtDestroy)(handle);
  }
};

void CudaBackend::lt_release() {
  delete lt_;
  lt_ = nullptr;
}

void CudaBackend::gemm_lt(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
                          int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                          DType c_dtype, int64_t ldc, const char* op) {
  if (M == 0 || N == 0) return;
  ADGT_CHECK(c_dtype == DType::BF16 || c_dtype == DType::F32,
             op << ": bf16 GEMM output must be bf16 or f32, got " << dtype_name(c_dtype));
  if (K == 0) {  // C = beta C: nothing to add
    if (beta == 0.0f) {
      ADGT_CHECK(ldc == N, op << ": empty GEMM with a strided output");
      ADGT_CUDA_OP(cudaMemsetAsync(C, 0, size_t(M * N) * dtype_size(c_dtype), stream_), op);
    } else {
      ADGT_CHECK(beta == 1.0f, op << ": empty GEMM with beta " << beta);
    }
    return;
  }
  ADGT_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX,
             op << ": GEMM dimensions " << M << "x" << N << "x" << K << " exceed 32-bit sizes");
  if (!lt_) lt_ = LtState::make(op);
  void* ws = scratch(kScratchGemm, kWorkspaceBytes);

  // Column-major: D(m = N, n = M) = opA(B) opB(A), k = K.
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t m = N, n = M, k = K;
  const cudaDataType_t ct = c_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const LtKey key{m,
                  n,
                  k,
                  ldb,
                  lda,
                  ldc,
                  int(opa),
                  int(opb),
                  int(ct),
                  beta != 0.0f ? 1 : 0,
                  alignment_of(B),
                  alignment_of(A),
                  alignment_of(C)};
  auto it = lt_->plans.find(key);
  if (it == lt_->plans.end()) {
    lt_->make_room();
    LtPlan p;
    try {
      make_desc(p, opa, opb, op);
      // Stored shapes (column-major rows x cols) of the library's A (= our B) and B (= our A).
      const uint64_t ar = opa == CUBLAS_OP_N ? m : k, ac = opa == CUBLAS_OP_N ? k : m;
      const uint64_t br = opb == CUBLAS_OP_N ? k : n, bc = opb == CUBLAS_OP_N ? n : k;
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.a, CUDA_R_16BF, ar, ac, ldb), op);
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.b, CUDA_R_16BF, br, bc, lda), op);
      ADGT_CUBLAS_OP(
          ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.c, ct, uint64_t(m), uint64_t(n), ldc), op);

      cublasLtMatmulPreference_t pref = nullptr;
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulPreferenceCreate)(&pref), op);
      const uint64_t wsb = kWorkspaceBytes;
      const uint32_t al[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
      cublasStatus_t st = ADGT_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
      const cublasLtMatmulPreferenceAttributes_t which[4] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
        st =
            ADGT_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(pref, which[i], &al[i], sizeof al[i]);
      // bf16 output: each element rounded once. A split-K algorithm must not
      // add its partial sums in the output type (INPLACE, OUTPUT_TYPE): only
      // none or fp32 partials (COMPUTE_TYPE), as PyTorch does when reduced-
      // precision reductions are disallowed. ADGT_LT_ANY_REDUCTION=1 lifts
      // the restriction, for the GPU check's speed comparison only.
      const uint32_t scheme = c_dtype == DType::BF16 && !any_reduction()
                                  ? uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                  : uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = ADGT_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(
            pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      if (st == CUBLAS_STATUS_SUCCESS)
        st = ADGT_CUBLAS(cublasLtMatmulAlgoGetHeuristic)(lt_->handle, p.op, p.a, p.b, p.c, p.c,
                                                         pref, 1, &res, &found);
      (void)ADGT_CUBLAS(cublasLtMatmulPreferenceDestroy)(pref);
      ADGT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 op << ": cuBLASLt has no bf16 algorithm for row-major " << M << "x" << N << "x"
                    << K << " (lda " << lda << ", ldb " << ldb << ", ldc " << ldc << ", C "
                    << dtype_name(c_dtype) << ", alignments " << key.align_b << "/" << key.align_a
                    << "/" << key.align_c << " bytes, reduction schemes " << scheme
                    << "): " << ADGT_CUBLAS(cublasGetStatusString)(st));
      p.algo = res.algo;
    } catch (...) {
      destroy(p);
      throw;
    }
    it = lt_->plans.emplace(key, p).first;
  }
  const LtPlan& p = it->second;
  const float alpha = 1.0f;
  const cublasStatus_t st =
      ADGT_CUBLAS(cublasLtMatmul)(lt_->handle, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c,
                                  &p.algo, ws, kWorkspaceBytes, stream_);
  const std::string err = matmul_error(st);
  if (!err.empty()) {
    std::ostringstream os;
    os << "cublasLtMatmul, row-major " << M << "x" << N << "x" << K << (ta ? " A^T" : "")
       << (tb ? " B^T" : "") << " lda " << lda << " ldb " << ldb << " ldc " << ldc << " beta "
       << beta << ", C " << dtype_name(c_dtype);
    call_failed(os.str().c_str(), op, err, __FILE__, __LINE__);
  }
}

// FP8 GEMMs (train.dtype: fp8): row-major C(M,N) = A(M,K) B(N,K)^T, both
// operands K-contiguous as Hopper's FP8 tensor cores take them (the library's
// "TN", the only layout cuBLASLt offers for FP8), A and B E4M3 or E5M2 (not
// both E5M2), fp32 accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM off: the
// products are promoted to fp32 sums as the CPU's emulation sums them), each
// operand's value its codes times inv[i] (device pointers: 1/scale, powers of
// two), C bf16 or f32 with beta 0 or 1. The caller checks the shapes (every
// dimension a multiple of 16, 16-byte aligned pointers).
void CudaBackend::gemm_lt_fp8(int64_t M, int64_t N, int64_t K, const void* A, DType a_dtype,
                              const float* a_inv, const void* B, DType b_dtype, const float* b_inv,
                              float beta, void* C, DType c_dtype, const char* op) {
  if (M == 0 || N == 0) return;
  ADGT_CHECK((a_dtype == DType::E4M3 || a_dtype == DType::E5M2) &&
                 (b_dtype == DType::E4M3 || b_dtype == DType::E5M2) &&
                 !(a_dtype == DType::E5M2 && b_dtype == DType::E5M2) &&
                 (c_dtype == DType::BF16 || c_dtype == DType::F32),
             op << ": FP8 GEMM of " << dtype_name(a_dtype) << " x " << dtype_name(b_dtype) << " into "
                << dtype_name(c_dtype) << " (E4M3/E5M2, not both E5M2; bf16 or f32 out)");
  ADGT_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && K > 0,
             op << ": FP8 GEMM dimensions " << M << "x" << N << "x" << K);
  if (!lt_) lt_ = LtState::make(op);
  void* ws = scratch(kScratchGemm, kWorkspaceBytes);
  auto fp8_type = [](DType d) { return d == DType::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; };
  // Column-major: D(m = N, n = M) = B^T(op T on the stored K x N) A(K x M).
  const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  const int64_t m = N, n = M, k = K;
  const cudaDataType_t ct = c_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  LtKey key{m, n, k, K, K, N, int(opa), int(opb), int(ct), beta != 0.0f ? 1 : 0,
            alignment_of(B), alignment_of(A), alignment_of(C)};
  key.atype = int(fp8_type(b_dtype));
  key.btype = int(fp8_type(a_dtype));
  auto it = lt_->plans.find(key);
  if (it == lt_->plans.end()) {
    lt_->make_room();
    LtPlan p;
    try {
      make_desc(p, opa, opb, op);
      const int8_t fast = 0;
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescSetAttribute)(
                         p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                     op);
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.a, fp8_type(b_dtype), uint64_t(k),
                                                             uint64_t(m), K),
                     op);
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.b, fp8_type(a_dtype), uint64_t(k),
                                                             uint64_t(n), K),
                     op);
      ADGT_CUBLAS_OP(
          ADGT_CUBLAS(cublasLtMatrixLayoutCreate)(&p.c, ct, uint64_t(m), uint64_t(n), N), op);
      cublasLtMatmulPreference_t pref = nullptr;
      ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulPreferenceCreate)(&pref), op);
      const uint64_t wsb = kWorkspaceBytes;
      cublasStatus_t st = ADGT_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
      const uint32_t scheme = uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = ADGT_CUBLAS(cublasLtMatmulPreferenceSetAttribute)(
            pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      if (st == CUBLAS_STATUS_SUCCESS)
        st = ADGT_CUBLAS(cublasLtMatmulAlgoGetHeuristic)(lt_->handle, p.op, p.a, p.b, p.c, p.c,
                                                         pref, 1, &res, &found);
      (void)ADGT_CUBLAS(cublasLtMatmulPreferenceDestroy)(pref);
      ADGT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 op << ": cuBLASLt has no FP8 algorithm for row-major " << M << "x" << N << "x" << K
                    << " (" << dtype_name(a_dtype) << " x " << dtype_name(b_dtype) << " -> "
                    << dtype_name(c_dtype) << ", sm_" << sm_major_ << sm_minor_
                    << "; FP8 GEMMs need sm_89 or newer): "
                    << ADGT_CUBLAS(cublasGetStatusString)(st));
      p.algo = res.algo;
    } catch (...) {
      destroy(p);
      throw;
    }
    it = lt_->plans.emplace(key, p).first;
  }
  const LtPlan& p = it->second;
  // The operands' scales: the library's A is our B.
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescSetAttribute)(
                     p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_inv, sizeof b_inv),
                 op);
  ADGT_CUBLAS_OP(ADGT_CUBLAS(cublasLtMatmulDescSetAttribute)(
                     p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_inv, sizeof a_inv),
                 op);
  const float alpha = 1.0f;
  const cublasStatus_t st =
      ADGT_CUBLAS(cublasLtMatmul)(lt_->handle, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c,
                                  &p.algo, ws, kWorkspaceBytes, stream_);
  const std::string err = matmul_error(st);
  if (!err.empty()) {
    std::ostringstream os;
    os << "cublasLtMatmul (FP8), row-major " << M << "x" << N << "x" << K << " "
       << dtype_name(a_dtype) << " x " << dtype_name(b_dtype) << " beta " << beta << ", C "
       << dtype_name(c_dtype);
    call_failed(os.str().c_str(), op, err, __FILE__, __LINE__);
  }
}

}  // namespace adgt
