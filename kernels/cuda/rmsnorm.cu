// CUDA RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. One block per row with
// block reductions; the weight gradient is one thread per column summing the
// rows in order (deterministic, no atomics). Semantics: kernels/cpu/rmsnorm.cpp.
#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void rmsnorm_fwd_kernel(T* __restrict__ out, T* __restrict__ rstd,
                                   const T* __restrict__ x, const T* __restrict__ w, int64_t C,
                                   T eps) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  const T* xr = x + i * C;
  T ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, red);
  const T r = T(1) / dsqrt(ss / T(C) + eps);
  if (threadIdx.x == 0) rstd[i] = r;
  T* o = out + i * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (xr[c] * r) * w[c];
}

// dx(row) += g*w*r - x*k, k = sum_c(g*w*x) r^3 / C.
template <class T>
__global__ void rmsnorm_bwd_dx_kernel(T* __restrict__ dx, const T* __restrict__ g,
                                      const T* __restrict__ x, const T* __restrict__ w,
                                      const T* __restrict__ rstd, int64_t C) {
  __shared__ T red[32];
  const int64_t i = blockIdx.x;
  const T* xr = x + i * C;
  const T* gr = g + i * C;
  const T r = rstd[i];
  T dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += gr[c] * w[c] * xr[c];
  dot = block_sum(dot, red);
  const T k = dot * r * r * r / T(C);
  T* d = dx + i * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += gr[c] * w[c] * r - xr[c] * k;
}

// dw(c) += sum over rows i, in order, of g*x*r.
template <class T>
__global__ void rmsnorm_bwd_dw_kernel(T* __restrict__ dw, const T* __restrict__ g,
                                      const T* __restrict__ x, const T* __restrict__ rstd,
                                      int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  T acc = dw[c];
  for (int64_t i = 0; i < N; ++i) acc += g[i * C + c] * x[i * C + c] * rstd[i];
  dw[c] = acc;
}

}  // namespace

void CudaBackend::rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                  double eps) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(C > 0 && x.numel() == N * C && out.numel() == x.numel() && rstd.numel() == N,
             "rmsnorm_forward: x" << x.shape_str() << " w" << w.shape_str() << " rstd"
                                  << rstd.shape_str());
  ADGT_CHECK(x.dtype == w.dtype && out.dtype == x.dtype && rstd.dtype == x.dtype,
             "rmsnorm_forward: dtype mismatch");
  if (!N) return;
  dispatch(x.dtype, "rmsnorm_forward", [&](auto z) {
    using T = decltype(z);
    rmsnorm_fwd_kernel<T><<<rows_grid(N, "rmsnorm_forward"), kThreads, 0, stream_>>>(
        out.ptr<T>(), rstd.ptr<T>(), x.ptr<T>(), w.ptr<T>(), C, T(eps));
  });
  ADGT_LAUNCH_CHECK("rmsnorm_forward");
}

void CudaBackend::rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                   const Tensor& w, const Tensor& rstd) {
  const int64_t C = w.numel(), N = C ? x.numel() / C : 0;
  ADGT_CHECK(C > 0 && dx.numel() == N * C && dout.numel() == N * C && dw.numel() == C &&
                 rstd.numel() == N,
             "rmsnorm_backward: shapes dx" << dx.shape_str() << " dout" << dout.shape_str());
  if (!N) return;
  dispatch(x.dtype, "rmsnorm_backward", [&](auto z) {
    using T = decltype(z);
    rmsnorm_bwd_dx_kernel<T><<<rows_grid(N, "rmsnorm_backward"), kThreads, 0, stream_>>>(
        dx.ptr<T>(), dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<T>(), C);
    ADGT_LAUNCH_CHECK("rmsnorm_backward (dx)");
    const int threads = 128;
    rmsnorm_bwd_dw_kernel<T><<<unsigned((C + threads - 1) / threads), threads, 0, stream_>>>(
        dw.ptr<T>(), dout.ptr<T>(), x.ptr<T>(), rstd.ptr<T>(), N, C);
  });
  ADGT_LAUNCH_CHECK("rmsnorm_backward (dw)");
}

}  // namespace adgt
