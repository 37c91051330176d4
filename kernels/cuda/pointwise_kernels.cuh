// CUDA elementwise kernels and the ops that launch them: add, scale, cast,
// SwiGLU (gate and up separate, or packed in the rows of the fused gate/up
// projection's output) and the rotary embedding (in place, or splitting and
// merging the fused q/k/v projection's output). Semantics: kernels/cpu/cpu_backend.cpp
// (add, scale, cast), kernels/cpu/swiglu.cpp, kernels/cpu/rope.cpp, with the
// per-element math of kernels/common/elementwise_math.hpp.
//
// f32/f64: one thread per element (rotary: per rotated pair) in a grid-stride
// loop. bf16 (the mixed-precision paths): fp32 math and one rounding per
// output, through launch_map (cuda_common.cuh), 16-byte accesses when every
// tensor the op touches is aligned; rotary keeps fp32 cos/sin tables and
// takes 8 pairs per thread when half % 8 == 0 and x and the tables are aligned.
//
// cuda_backend.cu (the CUDA backend's methods) and the host emulation's test
// (tests/kernel_sim/pointwise_sim_test.cpp) include this header.
#pragma once
#include <type_traits>

#include "kernels/common/bf16.hpp"
#include "kernels/common/elementwise_math.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_checks.hpp"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void add_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, T s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

// Element i of an operand whose F-element rows lie ld elements apart: ld == F
// contiguous, ld == 2F a half of the packed gate/up rows.
__device__ __forceinline__ int64_t strided(int64_t i, int64_t F, int64_t ld) {
  return ld == F ? i : i / F * ld + i % F;
}

// SwiGLU over n elements of h (rows of F); gate and up (and dgate, dup) have
// rows ld apart.
template <class T>
__global__ void swiglu_fwd_kernel(T* __restrict__ h, const T* __restrict__ g,
                                  const T* __restrict__ u, int64_t n, int64_t F, int64_t ld) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = strided(i, F, ld);
    const T gi = g[j];
    h[i] = math::swiglu(gi, u[j], T(1) / (T(1) + dexp(-gi)));
  }
}

template <class T>
__global__ void swiglu_bwd_kernel(T* __restrict__ dg, T* __restrict__ du, const T* __restrict__ dh,
                                  const T* __restrict__ g, const T* __restrict__ u, int64_t n,
                                  int64_t F, int64_t ld) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = strided(i, F, ld);
    const T gi = g[j];
    T a, b;
    math::swiglu_grad(gi, u[j], dh[i], T(1) / (T(1) + dexp(-gi)), a, b);
    dg[j] = a;
    du[j] = b;
  }
}

// One thread per rotated pair (row r, head h, i < half); x is (rows, H, 2*half).
template <class T, bool kBack>
__global__ void rope_kernel(T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn,
                            int64_t rows, int64_t H, int64_t half, int64_t Tn) {
  const int64_t n = rows * H * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, rh = e / half, r = rh / H;
    const int64_t t = r % Tn;
    T* a = x + rh * 2 * half + i;
    T* b = a + half;
    T av = *a, bv = *b;
    if constexpr (kBack)
      math::rope_rotate_back(av, bv, cs[t * half + i], sn[t * half + i]);
    else
      math::rope_rotate(av, bv, cs[t * half + i], sn[t * half + i]);
    *a = av;
    *b = bv;
  }
}

// Loads and stores of W elements as M (float for bf16 and f32, double for f64).
template <int W, class T, class M>
__device__ __forceinline__ void ld_as(const T* p, M* f) {
  if constexpr (std::is_same_v<T, double>) {
#pragma unroll
    for (int k = 0; k < W; ++k) f[k] = p[k];
  } else {
    ldv<W>(p, f);
  }
}
template <int W, class T, class M>
__device__ __forceinline__ void st_as(T* p, const M* f) {
  if constexpr (std::is_same_v<T, double>) {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = f[k];
  } else {
    stv<W>(p, f);
  }
}

// The fused q/k/v projection's rotary: qkv (rows, Hq + 2 KV, 2*half), q (rows,
// Hq, 2*half), k and v (rows, KV, 2*half). One thread per W consecutive pairs
// of one (row, head of qkv): a q or k head is rotated from qkv into q or k
// (kBack: rotated back from dq or dk into dqkv), a v head copied. S: the
// tables' type (fp32 for bf16); W = 8 needs half % 8 == 0 and every pointer
// aligned.
template <class T, class S, bool kBack, int W>
__global__ void __launch_bounds__(256)
    qkv_rope_kernel(T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k,
                    T* __restrict__ v, const S* __restrict__ cs, const S* __restrict__ sn,
                    int64_t rows, int64_t Hq, int64_t KV, int64_t half, int64_t Tn) {
  using M = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t Ht = Hq + 2 * KV, G = half / W, n = rows * Ht * G, hd = 2 * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = (e % G) * W, rh = e / G, head = rh % Ht, row = rh / Ht;
    const bool is_v = head >= Hq + KV;
    T* fused = qkv + rh * hd + p;
    T* sep = head < Hq  ? q + (row * Hq + head) * hd + p
             : !is_v    ? k + (row * KV + head - Hq) * hd + p
                        : v + (row * KV + head - Hq - KV) * hd + p;
    const T* from = kBack ? sep : fused;
    T* to = kBack ? fused : sep;
    M x0[W], x1[W];
    ld_as<W>(from, x0);
    ld_as<W>(from + half, x1);
    if (!is_v) {
      const int64_t tab = (row % Tn) * half + p;
      M cv[W], sv[W];
      ld_as<W>(cs + tab, cv);
      ld_as<W>(sn + tab, sv);
#pragma unroll
      for (int m = 0; m < W; ++m) {
        if constexpr (kBack)
          math::rope_rotate_back(x0[m], x1[m], cv[m], sv[m]);
        else
          math::rope_rotate(x0[m], x1[m], cv[m], sv[m]);
      }
    }
    st_as<W>(to, x0);
    st_as<W>(to + half, x1);
  }
}

// f64 -> bf16 rounded once, to nearest even (the CPU backend's cast): round
// to f32 toward odd first (an inexact result gets its last bit set), which
// keeps enough of d for the f32 -> bf16 rounding to equal a direct one. A
// plain float(d) rounds twice and can land on the wrong side of a bf16 tie.
__device__ __forceinline__ bf16_bits f64_to_bf16(double d) {
  const float f = float(d);
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) != 0x7f800000u && double(f) != d) {
    if (fabs(double(f)) > fabs(d)) --u;  // one step toward zero: the truncation of d
    u |= 1u;
  }
  return float_to_bf16(__uint_as_float(u));
}

template <class D, class S>
__global__ void cast_kernel(D* d, const S* s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<S, bf16_bits>) {
      d[i] = D(bf16_to_float(s[i]));
    } else if constexpr (std::is_same_v<D, bf16_bits> && std::is_same_v<S, double>) {
      d[i] = f64_to_bf16(s[i]);
    } else if constexpr (std::is_same_v<D, bf16_bits>) {
      d[i] = float_to_bf16(float(s[i]));
    } else {
      d[i] = D(s[i]);
    }
  }
}

// ---- bf16 (fp32 math, one rounding per output): ops for launch_map ----
struct AddBf16 {
  bf16_bits* y;
  const bf16_bits* x;
  template <int W>
  __device__ void run(int64_t i) const {
    float a[W], b[W];
    ldv<W>(y + i, a);
    ldv<W>(x + i, b);
#pragma unroll
    for (int k = 0; k < W; ++k) a[k] += b[k];
    stv<W>(y + i, a);
  }
};
struct ScaleBf16 {
  bf16_bits* x;
  float s;
  template <int W>
  __device__ void run(int64_t i) const {
    float a[W];
    ldv<W>(x + i, a);
#pragma unroll
    for (int k = 0; k < W; ++k) a[k] *= s;
    stv<W>(x + i, a);
  }
};
// f32 <-> bf16 (D, S in {float, bf16_bits}).
template <class D, class S>
struct CastOp {
  D* d;
  const S* s;
  template <int W>
  __device__ void run(int64_t i) const {
    float a[W];
    ldv<W>(s + i, a);
    stv<W>(d + i, a);
  }
};
// Gate and up rows ld apart (see strided()); W = 8 needs F % 8 == 0 when ld != F.
struct SwigluFwdBf16 {
  bf16_bits* h;
  const bf16_bits *g, *u;
  int64_t F, ld;
  template <int W>
  __device__ void run(int64_t i) const {
    const int64_t j = strided(i, F, ld);
    float a[W], b[W];
    ldv<W>(g + j, a);
    ldv<W>(u + j, b);
#pragma unroll
    for (int k = 0; k < W; ++k) a[k] = math::swiglu(a[k], b[k], 1.f / (1.f + expf(-a[k])));
    stv<W>(h + i, a);
  }
};
struct SwigluBwdBf16 {
  bf16_bits *dg, *du;
  const bf16_bits *dh, *g, *u;
  int64_t F, ld;
  template <int W>
  __device__ void run(int64_t i) const {
    const int64_t j = strided(i, F, ld);
    float a[W], b[W], d[W];
    ldv<W>(g + j, a);
    ldv<W>(u + j, b);
    ldv<W>(dh + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float x, y;
      math::swiglu_grad(a[k], b[k], d[k], 1.f / (1.f + expf(-a[k])), x, y);
      a[k] = x;
      b[k] = y;
    }
    stv<W>(dg + j, a);
    stv<W>(du + j, b);
  }
};

// Rotary on bf16 x (rows, H, 2*half) with fp32 cos/sin (T, half): one thread per
// W consecutive pairs of one (row, head); W = 8 needs half % 8 == 0 and aligned
// x, cos, sin.
template <bool kBack, int W>
__global__ void __launch_bounds__(256)
    rope_bf16_kernel(bf16_bits* __restrict__ x, const float* __restrict__ cs,
                     const float* __restrict__ sn, int64_t rows, int64_t H, int64_t half,
                     int64_t Tn) {
  const int64_t G = half / W, n = rows * H * G;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = (e % G) * W, rh = e / G, t = (rh / H) % Tn;
    bf16_bits* a = x + rh * 2 * half + i;
    bf16_bits* b = a + half;
    float av[W], bv[W], c[W], s[W];
    ldv<W>(a, av);
    ldv<W>(b, bv);
    ldv<W>(cs + t * half + i, c);
    ldv<W>(sn + t * half + i, s);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if constexpr (kBack)
        math::rope_rotate_back(av[k], bv[k], c[k], s[k]);
      else
        math::rope_rotate(av[k], bv[k], c[k], s[k]);
    }
    stv<W>(a, av);
    stv<W>(b, bv);
  }
}

// ---- the ops ----

void add_inplace(const OpCtx& c, Tensor y, const Tensor& x) {
  expect_same(y, x, "add_inplace");
  const int64_t n = y.numel();
  if (!n) return;
  if (y.dtype == DType::BF16) {
    launch_map(AddBf16{y.ptr<bf16_bits>(), x.ptr<bf16_bits>()}, n,
               aligned16(y.data) && aligned16(x.data), c.stream, "add_inplace");
    return;
  }
  dispatch(y.dtype, "add_inplace", [&](auto z) {
    using T = decltype(z);
    launch("add_inplace", add_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream, y.ptr<T>(),
           x.ptr<T>(), n);
  });
}

void scale_inplace(const OpCtx& c, Tensor x, double s) {
  const int64_t n = x.numel();
  if (!n) return;
  if (x.dtype == DType::BF16) {
    launch_map(ScaleBf16{x.ptr<bf16_bits>(), float(s)}, n, aligned16(x.data), c.stream,
               "scale_inplace");
    return;
  }
  dispatch(x.dtype, "scale_inplace", [&](auto z) {
    using T = decltype(z);
    launch("scale_inplace", scale_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream,
           x.ptr<T>(), T(s), n);
  });
}

// Calls f(T{}) with T = float, double or bf16_bits according to `dt`.
template <class F>
void float_dispatch(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::F64:
      f(double{});
      break;
    case DType::BF16:
      f(bf16_bits{});
      break;
    default:
      ADGT_CHECK(false, op << ": unsupported dtype " << dtype_name(dt));
  }
}

void cast(const OpCtx& c, Tensor dst, const Tensor& src) {
  ADGT_CHECK(dst.numel() == src.numel(),
             "cast: size mismatch " << dst.shape_str() << " vs " << src.shape_str());
  const int64_t n = dst.numel();
  if (!n) return;
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      ADGT_CUDA_OP(
          cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, c.stream),
          "cast");
    return;
  }
  // f32 <-> bf16, the mixed-precision casts: vectorised.
  const bool vec = aligned16(dst.data) && aligned16(src.data);
  if (dst.dtype == DType::BF16 && src.dtype == DType::F32) {
    launch_map(CastOp<bf16_bits, float>{dst.ptr<bf16_bits>(), src.ptr<float>()}, n, vec, c.stream,
               "cast");
    return;
  }
  if (dst.dtype == DType::F32 && src.dtype == DType::BF16) {
    launch_map(CastOp<float, bf16_bits>{dst.ptr<float>(), src.ptr<bf16_bits>()}, n, vec, c.stream,
               "cast");
    return;
  }
  float_dispatch(dst.dtype, "cast", [&](auto d) {
    float_dispatch(src.dtype, "cast", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      if constexpr (!std::is_same_v<D, S>)
        launch("cast", cast_kernel<D, S>, grid_for(n, kThreads), kThreads, 0, c.stream,
               dst.ptr<D>(), src.ptr<S>(), n);
    });
  });
}

void swiglu_forward(const OpCtx& c, Tensor h, const Tensor& gate, const Tensor& up) {
  expect_same(h, gate, "swiglu_forward");
  expect_same(h, up, "swiglu_forward");
  const int64_t n = h.numel();
  if (!n) return;
  if (h.dtype == DType::BF16) {
    launch_map(SwigluFwdBf16{h.ptr<bf16_bits>(), gate.ptr<bf16_bits>(), up.ptr<bf16_bits>(), n, n}, n,
               aligned16(h.data) && aligned16(gate.data) && aligned16(up.data), c.stream,
               "swiglu_forward");
    return;
  }
  dispatch(h.dtype, "swiglu_forward", [&](auto z) {
    using T = decltype(z);
    launch("swiglu_forward", swiglu_fwd_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream,
           h.ptr<T>(), gate.ptr<T>(), up.ptr<T>(), n, n, n);
  });
}

void swiglu_backward(const OpCtx& c, Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up) {
  expect_same(dh, gate, "swiglu_backward");
  expect_same(dgate, gate, "swiglu_backward");
  expect_same(dup, up, "swiglu_backward");
  expect_same(up, gate, "swiglu_backward");
  const int64_t n = dh.numel();
  if (!n) return;
  if (dh.dtype == DType::BF16) {
    launch_map(SwigluBwdBf16{dgate.ptr<bf16_bits>(), dup.ptr<bf16_bits>(), dh.ptr<bf16_bits>(),
                             gate.ptr<bf16_bits>(), up.ptr<bf16_bits>(), n, n},
               n,
               aligned16(dgate.data) && aligned16(dup.data) && aligned16(dh.data) &&
                   aligned16(gate.data) && aligned16(up.data),
               c.stream, "swiglu_backward");
    return;
  }
  dispatch(dh.dtype, "swiglu_backward", [&](auto z) {
    using T = decltype(z);
    launch("swiglu_backward", swiglu_bwd_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream,
           dgate.ptr<T>(), dup.ptr<T>(), dh.ptr<T>(), gate.ptr<T>(), up.ptr<T>(), n, n, n);
  });
}

// gu (N, 2F): each row's gate, then its up.
void swiglu_packed_forward(const OpCtx& c, Tensor h, const Tensor& gu) {
  const char* op = "swiglu_packed_forward";
  const int64_t F = check_swiglu_packed(h, gu, op), n = h.numel();
  if (!n) return;
  if (h.dtype == DType::BF16) {
    const bf16_bits* g = gu.ptr<bf16_bits>();
    launch_map(SwigluFwdBf16{h.ptr<bf16_bits>(), g, g + F, F, 2 * F}, n,
               F % 8 == 0 && aligned16(h.data) && aligned16(gu.data), c.stream, op);
    return;
  }
  dispatch(h.dtype, op, [&](auto z) {
    using T = decltype(z);
    const T* g = gu.ptr<T>();
    launch(op, swiglu_fwd_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream, h.ptr<T>(), g,
           g + F, n, F, 2 * F);
  });
}

void swiglu_packed_backward(const OpCtx& c, Tensor dgu, const Tensor& dh, const Tensor& gu) {
  const char* op = "swiglu_packed_backward";
  const int64_t F = check_swiglu_packed(dh, gu, op), n = dh.numel();
  expect_same(dgu, gu, op);
  if (!n) return;
  if (dh.dtype == DType::BF16) {
    const bf16_bits* g = gu.ptr<bf16_bits>();
    bf16_bits* d = dgu.ptr<bf16_bits>();
    launch_map(SwigluBwdBf16{d, d + F, dh.ptr<bf16_bits>(), g, g + F, F, 2 * F}, n,
               F % 8 == 0 && aligned16(dgu.data) && aligned16(dh.data) && aligned16(gu.data),
               c.stream, op);
    return;
  }
  dispatch(dh.dtype, op, [&](auto z) {
    using T = decltype(z);
    const T* g = gu.ptr<T>();
    T* d = dgu.ptr<T>();
    launch(op, swiglu_bwd_kernel<T>, grid_for(n, kThreads), kThreads, 0, c.stream, d, d + F,
           dh.ptr<T>(), g, g + F, n, F, 2 * F);
  });
}

template <bool kBack>
void rope_launch(const OpCtx& c, Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_,
                 const char* op) {
  ADGT_CHECK(
      cos.ndim == 2 && sin.numel() == cos.numel() && x.ndim >= 1,
      op << ": cos" << cos.shape_str() << " sin" << sin.shape_str() << " x" << x.shape_str());
  const int64_t half = cos.dim(1), hd = 2 * half;
  const int64_t rows = x.dim(0);
  ADGT_CHECK(half > 0 && rows > 0 && T_ > 0,
             op << ": x" << x.shape_str() << " cos" << cos.shape_str() << " T=" << T_);
  const int64_t H = x.numel() / (rows * hd);
  ADGT_CHECK(x.numel() == rows * H * hd && cos.dim(0) >= T_ && rows % T_ == 0,
             op << ": x" << x.shape_str() << " cos" << cos.shape_str() << " T=" << T_);
  const int64_t n = rows * H * half;
  if (x.dtype == DType::BF16) {
    // bf16 activations, fp32 tables (the mixed-precision contract).
    ADGT_CHECK(cos.dtype == DType::F32 && sin.dtype == DType::F32,
               op << ": bf16 x needs f32 cos/sin tables, got " << dtype_name(cos.dtype) << "/"
                  << dtype_name(sin.dtype));
    if (!n) return;
    auto* xp = x.ptr<bf16_bits>();
    const auto *cp = cos.ptr<float>(), *sp = sin.ptr<float>();
    if (half % 8 == 0 && aligned16(xp) && aligned16(cp) && aligned16(sp))
      launch(op, rope_bf16_kernel<kBack, 8>, grid_for(n / 8, kThreads), kThreads, 0, c.stream, xp,
             cp, sp, rows, H, half, T_);
    else
      launch(op, rope_bf16_kernel<kBack, 1>, grid_for(n, kThreads), kThreads, 0, c.stream, xp, cp,
             sp, rows, H, half, T_);
    return;
  }
  ADGT_CHECK(cos.dtype == x.dtype && sin.dtype == x.dtype, op << ": dtype mismatch");
  dispatch(x.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, rope_kernel<T, kBack>, grid_for(n, kThreads), kThreads, 0, c.stream, x.ptr<T>(),
           cos.ptr<T>(), sin.ptr<T>(), rows, H, half, T_);
  });
}

void rope_forward(const OpCtx& c, Tensor x, const Tensor& cos, const Tensor& sin, int64_t T_) {
  rope_launch<false>(c, x, cos, sin, T_, "rope_forward");
}
void rope_backward(const OpCtx& c, Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T_) {
  rope_launch<true>(c, dx, cos, sin, T_, "rope_backward");
}

template <bool kBack>
void qkv_rope_launch(const OpCtx& c, const Tensor& qkv, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& cos, const Tensor& sin, int64_t T_,
                     const char* op) {
  const QkvDims d = check_qkv_shapes(qkv, q, k, v, cos, sin, T_, op);
  const int64_t n = d.rows * (d.Hq + 2 * d.KV) * d.half;
  if (qkv.dtype == DType::BF16) {
    auto* f = qkv.ptr<bf16_bits>();
    auto *qp = q.ptr<bf16_bits>(), *kp = k.ptr<bf16_bits>(), *vp = v.ptr<bf16_bits>();
    const auto *cp = cos.ptr<float>(), *sp = sin.ptr<float>();
    if (d.half % 8 == 0 && aligned16(f) && aligned16(qp) && aligned16(kp) && aligned16(vp) &&
        aligned16(cp) && aligned16(sp))
      launch(op, qkv_rope_kernel<bf16_bits, float, kBack, 8>, grid_for(n / 8, kThreads), kThreads,
             0, c.stream, f, qp, kp, vp, cp, sp, d.rows, d.Hq, d.KV, d.half, T_);
    else
      launch(op, qkv_rope_kernel<bf16_bits, float, kBack, 1>, grid_for(n, kThreads), kThreads, 0,
             c.stream, f, qp, kp, vp, cp, sp, d.rows, d.Hq, d.KV, d.half, T_);
    return;
  }
  dispatch(qkv.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, qkv_rope_kernel<T, T, kBack, 1>, grid_for(n, kThreads), kThreads, 0, c.stream,
           qkv.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), cos.ptr<T>(), sin.ptr<T>(), d.rows,
           d.Hq, d.KV, d.half, T_);
  });
}

void qkv_rope_split(const OpCtx& c, Tensor q, Tensor k, Tensor v, const Tensor& qkv,
                    const Tensor& cos, const Tensor& sin, int64_t T_) {
  qkv_rope_launch<false>(c, qkv, q, k, v, cos, sin, T_, "qkv_rope_split");
}
void qkv_rope_merge_backward(const OpCtx& c, Tensor dqkv, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& cos, const Tensor& sin, int64_t T_) {
  qkv_rope_launch<true>(c, dqkv, dq, dk, dv, cos, sin, T_, "qkv_rope_merge_backward");
}

}  // namespace
}  // namespace adgt::cuda
