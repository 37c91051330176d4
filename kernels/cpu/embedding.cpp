// CPU token embedding (vocab-parallel: a rank holds rows [vocab_start, vocab_start + Vl)).
#include <cstring>

#include "kernels/cpu/cpu_backend.hpp"

namespace adgt {

void CpuBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                   int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = table.dim(0), C = table.dim(1);
  ADGT_CHECK(tokens.dtype == DType::I32 && out.numel() == N * C && out.dtype == table.dtype,
             "embedding_forward: tokens" << tokens.shape_str() << " out" << out.shape_str());
  const int32_t* tok = tokens.ptr<int32_t>();
  const size_t row = size_t(C) * dtype_size(table.dtype);
  const char* src = static_cast<const char*>(table.data);
  char* dst = static_cast<char*>(out.data);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = int64_t(tok[i]) - vocab_start;
    if (t >= 0 && t < V)
      std::memcpy(dst + i * row, src + size_t(t) * row, row);
    else
      std::memset(dst + i * row, 0, row);
  }
}

void CpuBackend::embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                    int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = dtable.dim(0), C = dtable.dim(1);
  ADGT_CHECK(dout.numel() == N * C, "embedding_backward: dout" << dout.shape_str());
  const int32_t* tok = tokens.ptr<int32_t>();
  // Serial over rows in token order: deterministic, and cheap next to the GEMMs.
  cpu_dispatch(dtable.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* d = dtable.ptr<T>();
    const T* g = dout.ptr<T>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = int64_t(tok[i]) - vocab_start;
      if (t < 0 || t >= V) continue;
      T* dr = d + t * C;
      const T* gr = g + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dr[c] += gr[c];
    }
  });
}

}  // namespace adgt
