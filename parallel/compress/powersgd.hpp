// PowerSGD's linear algebra (Vogels et al. 2019), pure and deterministic: a
// fixed loop order everywhere, so every dp rank computes the same bits from
// the same inputs. Matrices are row-major fp32: M (m x k) is a 2-D gradient
// as the flat buffer holds it, P (m x r), Q (k x r).
//
// One step of rank r on a dp group (parallel/compress/bucket_reduce.cpp):
//   M = G + residual;  P = M Q;  all-reduce P;  orthonormalize(P);
//   Q' = Mᵀ P;  residual = M - P Q'ᵀ (this rank's part);  all-reduce Q';
//   G = P Q'ᵀ (the sum over ranks of P Pᵀ M_rank);  Q = Q' for the next step.
// Q starts from init_q: the same seeded normal draws on every rank.
#pragma once
#include <cstdint>
#include <string>

namespace adgt::compress {

// Q (k x r) of the tensor named `name`: standard normal draws from a
// counter-based stream of (seed, name, element index), the same on every rank.
void init_q(float* q, int64_t k, int r, uint64_t seed, const std::string& name);
// P = M Q (m x r).
void mat_mq(const float* M, int64_t m, int64_t k, const float* Q, int r, float* P);
// Q = Mᵀ P (k x r).
void mat_mtp(const float* M, int64_t m, int64_t k, const float* P, int r, float* Q);
// out = P Qᵀ (m x k); with `subtract`, out -= P Qᵀ instead.
void mat_pqt(const float* P, const float* Q, int64_t m, int64_t k, int r, float* out, bool subtract);
// Orthonormalizes the r columns of P (m x r) in place by modified
// Gram-Schmidt (dot products and norms accumulated in fp64, in row order).
// A column whose norm falls below 1e-30 (a zero gradient, or one dependent
// on the earlier columns) becomes zero instead of NaN; a non-finite one
// becomes NaN (a non-finite gradient stays non-finite).
void orthonormalize(float* P, int64_t m, int r);

}  // namespace adgt::compress
