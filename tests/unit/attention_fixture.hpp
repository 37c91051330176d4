// Shared by the blockwise-attention and ring-attention tests (unit and MPI):
// a random attention problem from a seed, the single-process reference (the
// CPU backend's attention_forward / attention_backward on the whole
// sequence, which keeps T x T probabilities and no log-sum-exp: an
// independent computation), host <-> backend copies and row slicing of
// (B, T, heads, hd) arrays.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <vector>

#include "core/rng.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace adgt::attn_test {

template <class T>
DType dtype_of();
template <>
inline DType dtype_of<float>() {
  return DType::F32;
}
template <>
inline DType dtype_of<double>() {
  return DType::F64;
}
template <>
inline DType dtype_of<int32_t>() {
  return DType::I32;
}

// q (B,T,H,hd), k and v (B,T,KV,hd), dout like q: uniform in [-1, 1).
template <class E>
struct Problem {
  int64_t B, T, H, KV, hd;
  std::vector<E> q, k, v, dout;
  Problem(int64_t B_, int64_t T_, int64_t H_, int64_t KV_, int64_t hd_, uint64_t seed)
      : B(B_), T(T_), H(H_), KV(KV_), hd(hd_) {
    Rng r(seed);
    auto fill = [&](std::vector<E>& x, int64_t n) {
      x.resize(size_t(n));
      for (E& e : x) e = E(2 * r.uniform() - 1);
    };
    fill(q, B * T * H * hd);
    fill(k, B * T * KV * hd);
    fill(v, B * T * KV * hd);
    fill(dout, B * T * H * hd);
  }
  AttentionShape shape() const { return {B, T, H, KV, hd, nullptr}; }
};

template <class T>
struct Grads {
  std::vector<T> out, dq, dk, dv;
};

// The whole sequence's causal attention and its gradients on the CPU backend.
// doc_start (B*T, optional): the whole-sequence op's document mask.
template <class T>
Grads<T> reference(const Problem<T>& p, const std::vector<int32_t>* doc_start = nullptr) {
  CpuBackend be;
  AttentionShape s = p.shape();
  if (doc_start) s.doc_start = doc_start->data();
  Grads<T> g{std::vector<T>(p.q.size()), std::vector<T>(p.q.size()), std::vector<T>(p.k.size()),
             std::vector<T>(p.k.size())};
  std::vector<T> saved(size_t(be.attention_saved_elems(s)));
  auto t = [](const std::vector<T>& x) {
    return Tensor(const_cast<T*>(x.data()), dtype_of<T>(), {int64_t(x.size())});
  };
  be.attention_forward(t(g.out), t(saved), t(p.q), t(p.k), t(p.v), s);
  be.attention_backward(t(g.dq), t(g.dk), t(g.dv), t(p.dout), t(p.q), t(p.k), t(p.v), t(g.out),
                        t(saved), s);
  return g;
}

// Rows [a, a + L) of every sequence of x (B, T, w): a (B, L, w) array.
template <class T>
std::vector<T> rows_of(const std::vector<T>& x, int64_t B, int64_t Tn, int64_t w, int64_t a,
                       int64_t L) {
  std::vector<T> r;
  r.reserve(size_t(B * L * w));
  for (int64_t b = 0; b < B; ++b)
    r.insert(r.end(), x.begin() + (b * Tn + a) * w, x.begin() + (b * Tn + a + L) * w);
  return r;
}
// Writes (B, L, w) rows back into x (B, T, w) at [a, a + L); adds them when `add`.
template <class T>
void put_rows(std::vector<T>& x, const std::vector<T>& r, int64_t B, int64_t Tn, int64_t w,
              int64_t a, int64_t L, bool add = false) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L * w; ++i) {
      T& e = x[size_t((b * Tn + a) * w + i)];
      const T y = r[size_t(b * L * w + i)];
      e = add ? e + y : y;
    }
}

template <class T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double d = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

// Host arrays in a backend's memory for the length of a test.
template <class T>
class Mem {
 public:
  explicit Mem(Backend& be) : be_(be) {}
  Tensor put(const std::vector<T>& h, std::initializer_list<int64_t> shape) {
    bufs_.emplace_back(be_, h.size() * sizeof(T));
    Tensor t(bufs_.back().data(), dtype_of<T>(), shape);
    if (!h.empty()) be_.to_device(t.data, h.data(), h.size() * sizeof(T));
    return t;
  }
  Tensor zeros(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return put(std::vector<T>(size_t(n), T(0)), shape);
  }
  std::vector<T> get(const Tensor& t) {
    std::vector<T> h(size_t(t.numel()));
    be_.to_host(h.data(), t.data, t.bytes());
    return h;
  }

 private:
  Backend& be_;
  std::deque<Buffer> bufs_;
};

}  // namespace adgt::attn_test
