// CPU blockwise attention with log-sum-exp statistics (Backend::
// attention_block_forward, attention_merge, attention_block_backward): the
// numerical core of ring attention (parallel/cp/). Per (batch, head) and
// block of query rows: S = scale Q K^T over the block's keys (a causal block:
// only up to the rows' last position), a row softmax whose log-normaliser is
// kept as lse, O = P V. The backward recomputes P = exp(S - lse) from the
// final (merged) lse, so nothing T x T is kept between the passes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/mixed.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/op_checks.hpp"

namespace adgt {
namespace {

// Query rows per GEMM block (as in attention.cpp): a causal block's rows
// [r0, r0 + rows) need keys [0, r0 + rows) only.
constexpr int64_t kQBlock = 64;

// Keys of the block visible to query row i: [0, visible_keys(b, i)).
int64_t visible_keys(const AttentionBlock& b, int64_t i) {
  return b.mask == BlockMask::causal ? i + 1 : b.Tk;
}
// The first key of the block visible to query row i of sequence bi: its
// document's start (b.q_doc_start) relative to the block's first key, or 0.
// Keys [first_key, visible_keys) are the row's; none when first >= visible.
int64_t first_key(const AttentionBlock& b, int64_t bi, int64_t i) {
  if (!b.q_doc_start) return 0;
  return std::max<int64_t>(0, int64_t(b.q_doc_start[bi * b.Tq + i]) - b.k_pos);
}
// Keys the GEMMs of the query rows [r0, r0 + rows) cover.
int64_t block_keys(const AttentionBlock& b, int64_t r0, int64_t rows) {
  return b.mask == BlockMask::causal ? r0 + rows : b.Tk;
}

template <class T>
void block_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionBlock& b) {
  const int64_t H = b.n_heads, Tq = b.Tq, Tk = b.Tk, hd = b.head_dim;
  const int64_t group = H / b.n_kv_heads, ldq = H * hd, ldk = b.n_kv_heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel
  {
    std::vector<T> S(size_t(std::min(kQBlock, Tq) * Tk));
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < b.B; ++bi) {
      for (int64_t h = 0; h < H; ++h) {
        const T* Q = q + bi * Tq * ldq + h * hd;
        const T* K = k + bi * Tk * ldk + (h / group) * hd;
        const T* V = v + bi * Tk * ldk + (h / group) * hd;
        T* O = out + bi * Tq * ldq + h * hd;
        T* L = lse + (bi * H + h) * Tq;
        for (int64_t r0 = 0; r0 < Tq; r0 += kQBlock) {
          const int64_t rows = std::min(kQBlock, Tq - r0), kn = block_keys(b, r0, rows);
          cpu::gemm(false, true, rows, kn, hd, scale, Q + r0 * ldq, ldq, K, ldk, T(0), S.data(),
                    Tk);
          for (int64_t i = 0; i < rows; ++i) {
            T* row = S.data() + i * Tk;
            const int64_t ke = visible_keys(b, r0 + i), j0 = first_key(b, bi, r0 + i);
            if (j0 >= ke) {  // no key of this block in the row's document
              std::fill(row, row + kn, T(0));
              L[r0 + i] = -std::numeric_limits<T>::infinity();
              continue;
            }
            T mx = row[j0];
#pragma omp simd reduction(max : mx)
            for (int64_t j = j0 + 1; j < ke; ++j) mx = row[j] > mx ? row[j] : mx;
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = j0; j < ke; ++j) {
              row[j] = cpu::vexp(row[j] - mx);
              sum += row[j];
            }
            const T inv = T(1) / sum;
#pragma omp simd
            for (int64_t j = j0; j < ke; ++j) row[j] *= inv;
            std::fill(row, row + j0, T(0));
            std::fill(row + ke, row + kn, T(0));
            L[r0 + i] = mx + std::log(sum);
          }
          cpu::gemm(false, false, rows, hd, kn, T(1), S.data(), Tk, V, ldk, T(0), O + r0 * ldq,
                    ldq);
        }
      }
    }
  }
}

template <class T>
void merge(T* out, T* lse, const T* out_b, const T* lse_b, const AttentionBlock& b) {
  const int64_t H = b.n_heads, Tq = b.Tq, hd = b.head_dim;
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for collapse(2) \
    schedule(static) if (b.B * H * Tq * hd >= cpu::kParallelConvert)
  for (int64_t bi = 0; bi < b.B; ++bi) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        T& l = lse[(bi * H + h) * Tq + i];
        const T lb = lse_b[(bi * H + h) * Tq + i];
        T* o = out + ((bi * Tq + i) * H + h) * hd;
        const T* ob = out_b + ((bi * Tq + i) * H + h) * hd;
        if (lb == ninf) continue;  // the block saw no key: nothing to add
        if (l == ninf) {           // nothing yet: the block's result as it is
          std::copy(ob, ob + hd, o);
          l = lb;
          continue;
        }
        // Around the larger of the two: the other's weight is exp(-|l - lb|) <= 1.
        const T m = std::max(l, lb), wa = std::exp(l - m), wb = std::exp(lb - m);
        const T s = wa + wb, fa = wa / s, fb = wb / s;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) o[d] = fa * o[d] + fb * ob[d];
        l = m + std::log(s);
      }
    }
  }
}

// The gradients of one (batch, kv head): its group's heads in order, so dK
// and dV accumulate in a fixed order without races.
template <class T>
struct BlockGrad {
  const AttentionBlock& b;
  T *dq, *dk, *dv;
  const T *dout, *q, *k, *v, *out, *lse;
  bool accumulate_dq;

  void run(int64_t bi, int64_t kh, T* P, T* dS) const {
    const int64_t H = b.n_heads, Tq = b.Tq, Tk = b.Tk, hd = b.head_dim;
    const int64_t group = H / b.n_kv_heads, ldq = H * hd, ldk = b.n_kv_heads * hd;
    const T scale = T(1) / std::sqrt(T(hd));
    const T* K = k + bi * Tk * ldk + kh * hd;
    const T* V = v + bi * Tk * ldk + kh * hd;
    T* dK = dk + bi * Tk * ldk + kh * hd;
    T* dV = dv + bi * Tk * ldk + kh * hd;
    for (int64_t t = 0; t < Tk; ++t) {
      std::fill(dK + t * ldk, dK + t * ldk + hd, T(0));
      std::fill(dV + t * ldk, dV + t * ldk + hd, T(0));
    }
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const int64_t off = bi * Tq * ldq + h * hd;
      const T* L = lse + (bi * H + h) * Tq;
      for (int64_t r0 = 0; r0 < Tq; r0 += kQBlock) {
        const int64_t rows = std::min(kQBlock, Tq - r0), kn = block_keys(b, r0, rows);
        const T* Qb = q + off + r0 * ldq;
        const T* dOb = dout + off + r0 * ldq;
        // P = exp(scale Q K^T - lse) ; dP = dO V^T ; dV += P^T dO
        cpu::gemm(false, true, rows, kn, hd, scale, Qb, ldq, K, ldk, T(0), P, Tk);
        cpu::gemm(false, true, rows, kn, hd, T(1), dOb, ldq, V, ldk, T(0), dS, Tk);
        for (int64_t i = 0; i < rows; ++i) {
          T* pr = P + i * Tk;
          T* dr = dS + i * Tk;
          const T* o = out + off + (r0 + i) * ldq;
          const T* g = dOb + i * ldq;
          const int64_t ke = visible_keys(b, r0 + i);
          const int64_t j0 = std::min(first_key(b, bi, r0 + i), ke);
          const T li = L[r0 + i];
          T D = 0;  // rowsum(dout * out)
#pragma omp simd reduction(+ : D)
          for (int64_t d = 0; d < hd; ++d) D += g[d] * o[d];
#pragma omp simd
          for (int64_t j = j0; j < ke; ++j) {
            pr[j] = cpu::vexp(pr[j] - li);
            dr[j] = pr[j] * (dr[j] - D);  // dS
          }
          std::fill(pr, pr + j0, T(0));
          std::fill(dr, dr + j0, T(0));
          std::fill(pr + ke, pr + kn, T(0));
          std::fill(dr + ke, dr + kn, T(0));
        }
        cpu::gemm(true, false, kn, hd, rows, T(1), P, Tk, dOb, ldq, T(1), dV, ldk);
        // dQ (=|+=) scale dS K ; dK += scale dS^T Q
        cpu::gemm(false, false, rows, hd, kn, scale, dS, Tk, K, ldk, accumulate_dq ? T(1) : T(0),
                  dq + off + r0 * ldq, ldq);
        cpu::gemm(true, false, kn, hd, rows, scale, dS, Tk, Qb, ldq, T(1), dK, ldk);
      }
    }
  }
};

template <class T>
void block_backward(const BlockGrad<T>& g) {
  const AttentionBlock& b = g.b;
#pragma omp parallel
  {
    const size_t n = size_t(std::min(kQBlock, b.Tq) * b.Tk);
    std::vector<T> P(n), dS(n);
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < b.B; ++bi)
      for (int64_t kh = 0; kh < b.n_kv_heads; ++kh) g.run(bi, kh, P.data(), dS.data());
  }
}

}  // namespace

void CpuBackend::attention_block_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const AttentionBlock& b) {
  const char* op = "attention_block_forward";
  check_attention_block(b, q, k, v, op);
  check_block_outputs(b, out, lse, q.dtype, op);
  if (q.dtype == DType::BF16) {
    cpu::F32Scratch sc;
    const Tensor of = sc.out(out);
    attention_block_forward(of, lse, sc.in(q), sc.in(k), sc.in(v), b);
    sc.store(out, of);
    return;
  }
  cpu_dispatch(q.dtype, [&](auto z_) {
    using T = decltype(z_);
    block_forward<T>(out.ptr<T>(), lse.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), b);
  });
}

void CpuBackend::attention_merge(Tensor out, Tensor lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* op = "attention_merge";
  const AttentionBlock b = check_attention_merge(out, lse, out_b, lse_b, op);
  if (out.dtype == DType::BF16) {
    cpu::F32Scratch sc;
    const Tensor of = sc.in(out);
    attention_merge(of, lse, sc.in(out_b), lse_b);
    sc.store(out, of);
    return;
  }
  cpu_dispatch(out.dtype, [&](auto z_) {
    using T = decltype(z_);
    merge<T>(out.ptr<T>(), lse.ptr<T>(), out_b.ptr<T>(), lse_b.ptr<T>(), b);
  });
}

void CpuBackend::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                          const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& lse,
                                          const AttentionBlock& b, bool accumulate_dq) {
  const char* op = "attention_block_backward";
  check_attention_block(b, q, k, v, op);
  check_block_outputs(b, out, lse, q.dtype, op);
  check_block_grads(dq, dk, dv, dout, q, k, op);
  if (q.dtype == DType::BF16) {
    cpu::F32Scratch sc;
    const Tensor dqf = accumulate_dq ? sc.in(dq) : sc.out(dq), dkf = sc.out(dk), dvf = sc.out(dv);
    attention_block_backward(dqf, dkf, dvf, sc.in(dout), sc.in(q), sc.in(k), sc.in(v), sc.in(out),
                             lse, b, accumulate_dq);
    sc.store(dq, dqf);
    sc.store(dk, dkf);
    sc.store(dv, dvf);
    return;
  }
  cpu_dispatch(q.dtype, [&](auto z_) {
    using T = decltype(z_);
    block_backward<T>({b, dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), dout.ptr<T>(), q.ptr<T>(),
                       k.ptr<T>(), v.ptr<T>(), out.ptr<T>(), lse.ptr<T>(), accumulate_dq});
  });
}

}  // namespace adgt
