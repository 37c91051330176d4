// CPU token embedding (vocab-parallel: a rank holds rows [vocab_start, vocab_start + Vl)),
// and the other indexed-row ops: the mixture-of-experts combine and its backward.
#include <cstring>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {

void CpuBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                   int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = table.dim(0), C = table.dim(1);
  ADGT_CHECK(tokens.dtype == DType::I32 && out.numel() == N * C,
             "embedding_forward: tokens" << tokens.shape_str() << " out" << out.shape_str());
  // A row copy in any float dtype: bf16 rows are copied as they are.
  ADGT_CHECK(table.dtype != DType::I32, "embedding_forward: table i32, expected a float dtype");
  expect_dtype(out, table.dtype, table.dtype, "embedding_forward", "out");
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
  ADGT_CHECK(dout.numel() == N * C && tokens.dtype == DType::I32,
             "embedding_backward: dout" << dout.shape_str() << " tokens" << tokens.shape_str());
  expect_dtype(dtable, stat_dtype(dout.dtype), dout.dtype, "embedding_backward", "dtable");
  if (dout.dtype == DType::BF16) {  // dtable fp32 += the fp32 values of dout
    cpu::F32Scratch s;
    embedding_backward(dtable, s.in(dout), tokens, vocab_start);
    return;
  }
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

namespace {
void check_combine(const Tensor& rows_nc, const Tensor& y, const Tensor& pos, const Tensor& w,
                   const char* op) {
  check_combine_shapes(rows_nc, y, pos, w, op);
  check_combine_pos(pos.ptr<int32_t>(), pos.numel(), y, op);
}
}  // namespace

void CpuBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                              bool accumulate) {
  check_combine(out, y, pos, w, "combine_rows");
  if (y.dtype == DType::BF16) {  // fp32 on copies, out rounded once
    cpu::F32Scratch s;
    const Tensor of = accumulate ? s.in(out) : s.out(out);
    combine_rows(of, s.in(y), pos, s.in(w), accumulate);
    s.store(out, of);
    return;
  }
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  const int32_t* p = pos.ptr<int32_t>();
  cpu_dispatch(y.dtype, [&](auto z_) {
    using T = decltype(z_);
    T* o = out.ptr<T>();
    const T* yp = y.ptr<T>();
    const T* wp = w.data ? w.ptr<T>() : nullptr;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      T* orow = o + t * C;
      if (!accumulate)
        for (int64_t c = 0; c < C; ++c) orow[c] = T(0);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = p[t * k + j];
        if (r < 0) continue;
        const T wt = wp ? wp[t * k + j] : T(1);
        const T* yr = yp + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) orow[c] += wt * yr[c];
      }
    }
  });
}

void CpuBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                       const Tensor& pos, const Tensor& w) {
  check_combine(dout, y, pos, w, "combine_rows_backward");
  ADGT_CHECK(!dy.data || (dy.numel() == y.numel() && dy.dtype == y.dtype),
             "combine_rows_backward: dy" << dy.shape_str() << " must match y" << y.shape_str());
  ADGT_CHECK(!dw.data || (dw.numel() == pos.numel() && dw.dtype == stat_dtype(y.dtype)),
             "combine_rows_backward: dw" << dw.shape_str() << " " << dtype_name(dw.dtype)
                                         << " must match pos" << pos.shape_str() << " in "
                                         << dtype_name(stat_dtype(y.dtype))
                                         << " (f32 with bf16 rows)");
  if (y.dtype == DType::BF16) {  // fp32 on copies; dy rounded once, dw stays fp32
    cpu::F32Scratch s;
    const Tensor dyf = s.in(dy);  // rows no pos names are left as they are
    combine_rows_backward(dyf, dw, s.in(dout), s.in(y), pos, s.in(w));
    s.store(dy, dyf);
    return;
  }
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  const int32_t* p = pos.ptr<int32_t>();
  cpu_dispatch(y.dtype, [&](auto z_) {
    using T = decltype(z_);
    const T* g = dout.ptr<T>();
    const T* yp = y.ptr<T>();
    const T* wp = w.data ? w.ptr<T>() : nullptr;
    T* dyp = dy.data ? dy.ptr<T>() : nullptr;
    T* dwp = dw.data ? dw.ptr<T>() : nullptr;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const T* grow = g + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = p[t * k + j];
        if (r < 0) {
          if (dwp) dwp[t * k + j] = T(0);
          continue;
        }
        if (dwp) {
          const T* yr = yp + r * C;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < C; ++c) s += grow[c] * yr[c];
          dwp[t * k + j] = s;
        }
        if (dyp) {
          const T wt = wp ? wp[t * k + j] : T(1);
          T* dr = dyp + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dr[c] = wt * grow[c];
        }
      }
    }
  });
}

}  // namespace adgt
