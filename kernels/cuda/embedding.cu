// CUDA token embedding (vocab-parallel) and the other indexed-row ops: the
// mixture-of-experts combine and its backward. Semantics: kernels/cpu/embedding.cpp.
//
// Deterministic embedding backward: the token ids are read back to the host,
// which builds, for every vocabulary row that occurs, the list of token rows
// naming it in ascending order (a counting sort, O(N + V)). One block per such
// row then adds its gradient rows in that order, each thread owning columns:
// no atomics, the CPU backend's summation order, bitwise reproducible. The
// cost is one device-to-host copy of N int32 and a synchronisation; an on-device
// stable sort (CUB radix sort) can replace it later without changing results.
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_fwd_kernel(T* __restrict__ out, const T* __restrict__ table,
                                     const int32_t* __restrict__ tok, int64_t V, int64_t C,
                                     int64_t vocab_start) {
  const int64_t i = blockIdx.x;
  const int64_t t = int64_t(tok[i]) - vocab_start;
  T* o = out + i * C;
  if (t >= 0 && t < V) {
    const T* src = table + t * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = T(0);
  }
}

// csr = [row ids (R) | offsets (R+1) | token rows]; block b owns vocabulary row rows[b].
template <class T>
__global__ void embedding_bwd_kernel(T* __restrict__ dtable, const T* __restrict__ dout,
                                     const int32_t* __restrict__ csr, int64_t R, int64_t C) {
  const int64_t b = blockIdx.x;
  const int32_t* rows = csr;
  const int32_t* off = csr + R;
  const int32_t* idx = csr + 2 * R + 1;
  T* d = dtable + int64_t(rows[b]) * C;
  const int32_t k0 = off[b], k1 = off[b + 1];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    T acc = d[c];
    for (int32_t k = k0; k < k1; ++k) acc += dout[int64_t(idx[k]) * C + c];
    d[c] = acc;
  }
}

// bf16 forward: a row copy in words of Wd (uint4 = 8 bf16 when rows are
// 16-byte aligned, else single bf16); Cw words per row.
template <class Wd>
__global__ void __launch_bounds__(256)
    embedding_copy_kernel(Wd* __restrict__ out, const Wd* __restrict__ table,
                          const int32_t* __restrict__ tok, int64_t V, int64_t Cw,
                          int64_t vocab_start) {
  const int64_t i = blockIdx.x;
  const int64_t t = int64_t(tok[i]) - vocab_start;
  Wd* o = out + i * Cw;
  if (t >= 0 && t < V) {
    const Wd* src = table + t * Cw;
    for (int64_t c = threadIdx.x; c < Cw; c += blockDim.x) o[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < Cw; c += blockDim.x) o[c] = Wd{};
  }
}

// bf16 backward: dtable (f32) row rows[b] += its bf16 gradient rows in order,
// W columns per thread step (W = 8 needs C % 8 == 0 and aligned tensors).
template <int W>
__global__ void __launch_bounds__(256)
    embedding_bwd_bf16_kernel(float* __restrict__ dtable, const bf16_bits* __restrict__ dout,
                              const int32_t* __restrict__ csr, int64_t R, int64_t C) {
  const int64_t b = blockIdx.x;
  const int32_t* rows = csr;
  const int32_t* off = csr + R;
  const int32_t* idx = csr + 2 * R + 1;
  float* d = dtable + int64_t(rows[b]) * C;
  const int32_t k0 = off[b], k1 = off[b + 1];
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += int64_t(blockDim.x) * W) {
    float acc[W], g[W];
    ldv<W>(d + c, acc);
    for (int32_t k = k0; k < k1; ++k) {
      ldv<W>(dout + int64_t(idx[k]) * C + c, g);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += g[j];
    }
    stv<W>(d + c, acc);
  }
}

// out[t] (=|+=) sum_j w[t,j] y[pos[t,j]] over pos >= 0, j ascending.
template <class T>
__global__ void combine_kernel(T* __restrict__ out, const T* __restrict__ y,
                               const int32_t* __restrict__ pos, const T* __restrict__ w, int64_t k,
                               int64_t C, bool accumulate) {
  const int64_t t = blockIdx.x;
  T* o = out + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    T acc = accumulate ? o[c] : T(0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = pos[t * k + j];
      if (r < 0) continue;
      const T wt = w ? w[t * k + j] : T(1);
      acc += wt * y[r * C + c];
    }
    o[c] = acc;
  }
}

// One block per token row t: dw[t,j] = <dout[t], y[pos]>, dy[pos] = w dout[t].
template <class T>
__global__ void combine_bwd_kernel(T* __restrict__ dy, T* __restrict__ dw,
                                   const T* __restrict__ dout, const T* __restrict__ y,
                                   const int32_t* __restrict__ pos, const T* __restrict__ w,
                                   int64_t k, int64_t C) {
  __shared__ T red[32];
  const int64_t t = blockIdx.x;
  const T* g = dout + t * C;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = pos[t * k + j];  // uniform over the block
    if (r < 0) {
      if (dw && threadIdx.x == 0) dw[t * k + j] = T(0);
      continue;
    }
    if (dw) {
      const T* yr = y + r * C;
      T s = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += g[c] * yr[c];
      s = block_sum(s, red);
      if (threadIdx.x == 0) dw[t * k + j] = s;
    }
    if (dy) {
      const T wt = w ? w[t * k + j] : T(1);
      T* dr = dy + r * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dr[c] = wt * g[c];
    }
  }
}

}  // namespace

void CudaBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                    int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = table.dim(0), C = table.dim(1);
  ADGT_CHECK(tokens.dtype == DType::I32 && out.numel() == N * C && out.dtype == table.dtype &&
                 table.ndim == 2,
             "embedding_forward: tokens" << tokens.shape_str() << " out" << out.shape_str()
                                         << " table" << table.shape_str());
  if (!N || !C) return;
  if (table.dtype == DType::BF16) {
    const char* op = "embedding_forward";
    if (C % 8 == 0 && aligned16(out.data) && aligned16(table.data))
      embedding_copy_kernel<uint4><<<rows_grid(N, op), kThreads, 0, stream_>>>(
          out.ptr<uint4>(), table.ptr<uint4>(), tokens.ptr<int32_t>(), V, C / 8, vocab_start);
    else
      embedding_copy_kernel<bf16_bits><<<rows_grid(N, op), kThreads, 0, stream_>>>(
          out.ptr<bf16_bits>(), table.ptr<bf16_bits>(), tokens.ptr<int32_t>(), V, C, vocab_start);
    ADGT_LAUNCH_CHECK(op);
    return;
  }
  dispatch(table.dtype, "embedding_forward", [&](auto z) {
    using T = decltype(z);
    embedding_fwd_kernel<T><<<rows_grid(N, "embedding_forward"), kThreads, 0, stream_>>>(
        out.ptr<T>(), table.ptr<T>(), tokens.ptr<int32_t>(), V, C, vocab_start);
  });
  ADGT_LAUNCH_CHECK("embedding_forward");
}

void CudaBackend::embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                     int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = dtable.dim(0), C = dtable.dim(1);
  // bf16: dout bf16, dtable f32 (the mixed-precision contract); else one dtype.
  const bool lowp = dout.dtype == DType::BF16;
  ADGT_CHECK(dout.numel() == N * C && tokens.dtype == DType::I32 &&
                 (lowp ? dtable.dtype == DType::F32 : dout.dtype == dtable.dtype),
             "embedding_backward: dout" << dout.shape_str() << " " << dtype_name(dout.dtype)
                                        << ", dtable" << dtable.shape_str() << " "
                                        << dtype_name(dtable.dtype) << " (bf16 dout takes an f32 dtable)"
                                        << ", tokens" << tokens.shape_str());
  ADGT_CHECK(N <= INT_MAX && V <= INT_MAX, "embedding_backward: sizes exceed int32 indices");
  if (!N || !C) return;
  // Host counting sort: rows named, in ascending vocabulary order; per row its
  // token rows in ascending order.
  std::vector<int32_t> tok(static_cast<size_t>(N));
  to_host(tok.data(), tokens.data, size_t(N) * 4);
  std::vector<int32_t> count(static_cast<size_t>(V), 0);
  int64_t hits = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
    if (t >= 0 && t < V) ++count[size_t(t)], ++hits;
  }
  if (!hits) return;
  std::vector<int32_t> rows, off(1, 0);
  for (int64_t t = 0; t < V; ++t)
    if (count[size_t(t)]) {
      rows.push_back(int32_t(t));
      off.push_back(off.back() + count[size_t(t)]);
    }
  const int64_t R = int64_t(rows.size());
  std::vector<int32_t> csr(size_t(2 * R + 1 + hits));
  std::copy(rows.begin(), rows.end(), csr.begin());
  std::copy(off.begin(), off.end(), csr.begin() + R);
  {
    std::vector<int32_t> cursor(static_cast<size_t>(V), -1);  // next slot per vocabulary row
    for (int64_t b = 0; b < R; ++b) cursor[size_t(rows[size_t(b)])] = off[size_t(b)];
    int32_t* idx = csr.data() + 2 * R + 1;
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
      if (t >= 0 && t < V) idx[cursor[size_t(t)]++] = int32_t(i);
    }
  }
  auto* dev = static_cast<int32_t*>(scratch(kScratchIndex, csr.size() * 4));
  to_device(dev, csr.data(), csr.size() * 4);
  if (lowp) {
    const char* op = "embedding_backward";
    if (C % 8 == 0 && aligned16(dtable.data) && aligned16(dout.data))
      embedding_bwd_bf16_kernel<8><<<rows_grid(R, op), kThreads, 0, stream_>>>(
          dtable.ptr<float>(), dout.ptr<bf16_bits>(), dev, R, C);
    else
      embedding_bwd_bf16_kernel<1><<<rows_grid(R, op), kThreads, 0, stream_>>>(
          dtable.ptr<float>(), dout.ptr<bf16_bits>(), dev, R, C);
    ADGT_LAUNCH_CHECK(op);
    return;
  }
  dispatch(dtable.dtype, "embedding_backward", [&](auto z) {
    using T = decltype(z);
    embedding_bwd_kernel<T><<<rows_grid(R, "embedding_backward"), kThreads, 0, stream_>>>(
        dtable.ptr<T>(), dout.ptr<T>(), dev, R, C);
  });
  ADGT_LAUNCH_CHECK("embedding_backward");
}

namespace {
// Shapes as the CPU backend checks them; pos is read back to check its range
// (the CPU backend's check; an out-of-range row would read outside y).
void check_combine(CudaBackend& be, const Tensor& rows_nc, const Tensor& y, const Tensor& pos,
                   const Tensor& w, const char* op) {
  ADGT_CHECK(y.dtype != DType::BF16,
             op << ": bf16 is not supported (the backend's mixed-precision contract leaves "
                   "combine_rows* in f32/f64; run mixture-of-experts layers in f32)");
  const int64_t N = pos.ndim == 2 ? pos.dim(0) : -1, C = y.ndim == 2 ? y.dim(1) : -1;
  ADGT_CHECK(pos.dtype == DType::I32 && pos.ndim == 2 && y.ndim == 2 &&
                 rows_nc.numel() == N * C && rows_nc.dtype == y.dtype,
             op << ": pos" << pos.shape_str() << " (int32 (N,k)), y" << y.shape_str()
                << " (M,C), rows" << rows_nc.shape_str() << " (N,C)");
  ADGT_CHECK(!w.data || (w.numel() == pos.numel() && w.dtype == y.dtype),
             op << ": weights" << w.shape_str() << " must match pos" << pos.shape_str() << " in "
                << dtype_name(y.dtype));
  std::vector<int32_t> p(static_cast<size_t>(pos.numel()));
  be.to_host(p.data(), pos.data, p.size() * 4);
  for (size_t i = 0; i < p.size(); ++i)
    ADGT_CHECK(p[i] < y.dim(0), op << ": pos[" << i << "] = " << p[i] << " outside y"
                                   << y.shape_str());
}
}  // namespace

void CudaBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                               bool accumulate) {
  check_combine(*this, out, y, pos, w, "combine_rows");
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || !C) return;
  dispatch(y.dtype, "combine_rows", [&](auto z) {
    using T = decltype(z);
    combine_kernel<T><<<rows_grid(N, "combine_rows"), kThreads, 0, stream_>>>(
        out.ptr<T>(), y.ptr<T>(), pos.ptr<int32_t>(), w.data ? w.ptr<T>() : nullptr, k, C,
        accumulate);
  });
  ADGT_LAUNCH_CHECK("combine_rows");
}

void CudaBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                        const Tensor& pos, const Tensor& w) {
  check_combine(*this, dout, y, pos, w, "combine_rows_backward");
  ADGT_CHECK(!dy.data || (dy.numel() == y.numel() && dy.dtype == y.dtype),
             "combine_rows_backward: dy" << dy.shape_str() << " must match y" << y.shape_str());
  ADGT_CHECK(!dw.data || (dw.numel() == pos.numel() && dw.dtype == y.dtype),
             "combine_rows_backward: dw" << dw.shape_str() << " must match pos"
                                         << pos.shape_str());
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || (!dy.data && !dw.data)) return;
  dispatch(y.dtype, "combine_rows_backward", [&](auto z) {
    using T = decltype(z);
    combine_bwd_kernel<T><<<rows_grid(N, "combine_rows_backward"), kThreads, 0, stream_>>>(
        dy.data ? dy.ptr<T>() : nullptr, dw.data ? dw.ptr<T>() : nullptr, dout.ptr<T>(),
        y.ptr<T>(), pos.ptr<int32_t>(), w.data ? w.ptr<T>() : nullptr, k, C);
  });
  ADGT_LAUNCH_CHECK("combine_rows_backward");
}

}  // namespace adgt
