// CPU causal grouped-query attention. Per (batch, head) and block of query
// rows: S = scale Q K^T and O = P V as OpenBLAS GEMMs on strided views of the
// (B,T,H,hd) activations; the probabilities P (B,H,T,T) are saved for the backward
// (in fp32 when the activations are bf16). With document masking
// (AttentionShape::doc_start) a row's keys start at its document's first
// position, and a block's GEMMs start at its first row's (the smallest).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {
namespace {

// Query rows are processed in blocks of kQBlock: a block of queries ending at
// row r only needs keys [0, r), which skips most of the masked upper triangle.
constexpr int64_t kQBlock = 64;

template <class T>
void forward(T* out, T* P, const T* q, const T* k, const T* v, const AttentionShape& s) {
  const int64_t B = s.B, Tn = s.T, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / group;
      const T* Q = q + b * Tn * ldq + h * hd;
      const T* K = k + b * Tn * ldk + kh * hd;
      const T* V = v + b * Tn * ldk + kh * hd;
      T* S = P + (b * H + h) * Tn * Tn;
      T* O = out + b * Tn * ldq + h * hd;
      const int32_t* ds = s.doc_start ? s.doc_start + b * Tn : nullptr;
      for (int64_t r0 = 0; r0 < Tn; r0 += kQBlock) {
        const int64_t rows = std::min(kQBlock, Tn - r0), kend = r0 + rows;
        const int64_t k0 = ds ? ds[r0] : 0;  // the block's first key
        T* Sb = S + r0 * Tn;
        cpu::gemm(false, true, rows, kend - k0, hd, scale, Q + r0 * ldq, ldq, K + k0 * ldk, ldk,
                  T(0), Sb + k0, Tn);
        for (int64_t i = r0; i < kend; ++i) {
          T* row = S + i * Tn;
          const int64_t lo = ds ? ds[i] : 0;
          T mx = row[lo];
#pragma omp simd reduction(max : mx)
          for (int64_t j = lo + 1; j <= i; ++j) mx = row[j] > mx ? row[j] : mx;
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = lo; j <= i; ++j) {
            row[j] = cpu::vexp(row[j] - mx);
            sum += row[j];
          }
          const T inv = T(1) / sum;
#pragma omp simd
          for (int64_t j = lo; j <= i; ++j) row[j] *= inv;
          std::fill(row, row + lo, T(0));
          std::fill(row + i + 1, row + Tn, T(0));
        }
        cpu::gemm(false, false, rows, hd, kend - k0, T(1), Sb + k0, Tn, V + k0 * ldk, ldk, T(0),
                  O + r0 * ldq, ldq);
      }
    }
  }
}

template <class T>
void backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* P,
              const AttentionShape& s) {
  const int64_t B = s.B, Tn = s.T, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  const int64_t group = H / KV, ldq = H * hd, ldk = KV * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  // One (b, kv-head) per iteration so the heads of a group accumulate into
  // dK/dV in a fixed order without races.
#pragma omp parallel
  {
    std::vector<T> dS(size_t(kQBlock * Tn));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t kh = 0; kh < KV; ++kh) {
        const T* K = k + b * Tn * ldk + kh * hd;
        const T* V = v + b * Tn * ldk + kh * hd;
        T* dK = dk + b * Tn * ldk + kh * hd;
        T* dV = dv + b * Tn * ldk + kh * hd;
        for (int64_t t = 0; t < Tn; ++t) {
          std::fill(dK + t * ldk, dK + t * ldk + hd, T(0));
          std::fill(dV + t * ldk, dV + t * ldk + hd, T(0));
        }
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kh * group + g;
          const T* Q = q + b * Tn * ldq + h * hd;
          const T* dO = dout + b * Tn * ldq + h * hd;
          T* dQ = dq + b * Tn * ldq + h * hd;
          const T* Ph = P + (b * H + h) * Tn * Tn;
          const int32_t* ds = s.doc_start ? s.doc_start + b * Tn : nullptr;
          for (int64_t r0 = 0; r0 < Tn; r0 += kQBlock) {
            const int64_t rows = std::min(kQBlock, Tn - r0), kend = r0 + rows;
            const int64_t k0 = ds ? ds[r0] : 0, kn = kend - k0;  // the block's keys [k0, kend)
            const T* Pb = Ph + r0 * Tn + k0;
            const T* dOb = dO + r0 * ldq;
            T* dSb = dS.data() + k0;
            // dV[k0:kend] += P_b^T dO_b ; dP_b = dO_b V[k0:kend]^T
            cpu::gemm(true, false, kn, hd, rows, T(1), Pb, Tn, dOb, ldq, T(1), dV + k0 * ldk, ldk);
            cpu::gemm(false, true, rows, kn, hd, T(1), dOb, ldq, V + k0 * ldk, ldk, T(0), dSb, Tn);
            // dS = P * (dP - rowsum(P * dP)) on the causal triangle (of the row's document).
            for (int64_t i = r0; i < kend; ++i) {
              const T* pr = Ph + i * Tn;
              T* dr = dS.data() + (i - r0) * Tn;
              const int64_t lo = ds ? ds[i] : 0;
              T dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int64_t j = lo; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
              for (int64_t j = lo; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
              std::fill(dr + k0, dr + lo, T(0));
              std::fill(dr + i + 1, dr + kend, T(0));
            }
            // dQ_b = scale dS_b K[k0:kend] ; dK[k0:kend] += scale dS_b^T Q_b
            cpu::gemm(false, false, rows, hd, kn, scale, dSb, Tn, K + k0 * ldk, ldk, T(0),
                      dQ + r0 * ldq, ldq);
            cpu::gemm(true, false, kn, hd, rows, scale, dSb, Tn, Q + r0 * ldq, ldq, T(1),
                      dK + k0 * ldk, ldk);
          }
        }
      }
    }
  }
}

}  // namespace

int64_t CpuBackend::attention_saved_elems(const AttentionShape& s) const {
  return s.B * s.n_heads * s.T * s.T;
}

void CpuBackend::attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const AttentionShape& s) {
  check_attention_shapes(s, q, k, v, "attention_forward");
  ADGT_CHECK(saved.numel() >= attention_saved_elems(s) && out.numel() == q.numel(),
             "attention_forward: saved" << saved.shape_str() << " out" << out.shape_str());
  const DType a = q.dtype;
  expect_dtype(k, a, a, "attention_forward", "k");
  expect_dtype(v, a, a, "attention_forward", "v");
  expect_dtype(out, a, a, "attention_forward", "out");
  expect_dtype(saved, stat_dtype(a), a, "attention_forward", "saved");
  if (a == DType::BF16) {
    cpu::F32Scratch sc;
    const Tensor of = sc.out(out);
    attention_forward(of, saved, sc.in(q), sc.in(k), sc.in(v), s);
    sc.store(out, of);
    return;
  }
  cpu_dispatch(a, [&](auto z_) {
    using T = decltype(z_);
    forward<T>(out.ptr<T>(), saved.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), s);
  });
}

void CpuBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& /*out*/, const Tensor& saved,
                                    const AttentionShape& s) {
  check_attention_shapes(s, q, k, v, "attention_backward");
  ADGT_CHECK(dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel() &&
                 dout.numel() == q.numel() && saved.numel() >= attention_saved_elems(s),
             "attention_backward: dq" << dq.shape_str() << " dk" << dk.shape_str() << " dv"
                                      << dv.shape_str() << " dout" << dout.shape_str()
                                      << " saved" << saved.shape_str());
  const DType a = q.dtype;
  expect_dtype(k, a, a, "attention_backward", "k");
  expect_dtype(v, a, a, "attention_backward", "v");
  expect_dtype(dout, a, a, "attention_backward", "dout");
  expect_dtype(dq, a, a, "attention_backward", "dq");
  expect_dtype(dk, a, a, "attention_backward", "dk");
  expect_dtype(dv, a, a, "attention_backward", "dv");
  expect_dtype(saved, stat_dtype(a), a, "attention_backward", "saved");
  if (a == DType::BF16) {  // the saved probabilities are fp32; `out` is not read
    cpu::F32Scratch sc;
    const Tensor dqf = sc.out(dq), dkf = sc.out(dk), dvf = sc.out(dv);
    attention_backward(dqf, dkf, dvf, sc.in(dout), sc.in(q), sc.in(k), sc.in(v), Tensor(), saved,
                       s);
    sc.store(dq, dqf);
    sc.store(dk, dkf);
    sc.store(dv, dvf);
    return;
  }
  cpu_dispatch(a, [&](auto z_) {
    using T = decltype(z_);
    backward<T>(dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), dout.ptr<T>(), q.ptr<T>(), k.ptr<T>(),
                v.ptr<T>(), saved.ptr<T>(), s);
  });
}

}  // namespace adgt
