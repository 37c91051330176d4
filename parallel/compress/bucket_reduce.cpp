#include "parallel/compress/bucket_reduce.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/check.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/powersgd.hpp"

namespace adgt::compress {

std::pair<int64_t, int64_t> chunk_range(int64_t n, int D, int d, bool reduce_scatter) {
  const int64_t c = reduce_scatter ? n / D : (n + D - 1) / D;
  return {std::min(n, d * c), std::min(n, (d + 1) * c)};
}

int64_t fp32_ring_bytes(int64_t n, int D, bool reduce_scatter) {
  if (D <= 1) return 0;
  const int64_t one = (D - 1) * ((n + D - 1) / D) * 4;
  return reduce_scatter ? one : 2 * one;
}

namespace {

Tensor words_tensor(std::vector<int32_t>& v, int64_t n) {
  if (v.size() < size_t(std::max<int64_t>(n, 1))) v.resize(size_t(std::max<int64_t>(n, 1)));
  return Tensor(v.data(), DType::I32, {n});
}

void reduce_quantized(Comm& comm, Level l, const BucketView& b, const std::vector<ParamSpec>& table,
                      const Settings& s, BucketCodecState& st) {
  const int D = comm.size(), me = comm.rank();
  if (b.reduce_scatter)
    ADGT_CHECK(b.n % D == 0, "compressed reduce-scatter: bucket of " << b.n << " elements over "
                                                                     << D << " ranks");
  std::vector<std::pair<int64_t, int64_t>> cr(static_cast<size_t>(D));
  std::vector<ChunkLayout> lay(static_cast<size_t>(D));
  std::vector<int64_t> words(static_cast<size_t>(D)), sd(static_cast<size_t>(D));
  int64_t total = 0;
  for (int d = 0; d < D; ++d) {
    cr[size_t(d)] = chunk_range(b.n, D, d, b.reduce_scatter);
    lay[size_t(d)] = chunk_layout(table, b.begin + cr[size_t(d)].first, b.begin + cr[size_t(d)].second,
                                  s.min_elems);
    words[size_t(d)] = chunk_words(l, lay[size_t(d)]);
    sd[size_t(d)] = total;
    total += words[size_t(d)];
  }
  // 1. Error feedback and the encoding of every chunk.
  if (int64_t(st.residual.size()) != b.n) st.residual.assign(size_t(b.n), 0.0f);
  for (int64_t i = 0; i < b.n; ++i) b.g[i] += st.residual[size_t(i)];
  std::vector<int32_t> send, recv;
  Tensor ts = words_tensor(send, total);
  for (int d = 0; d < D; ++d)
    encode_chunk(l, lay[size_t(d)], b.g + cr[size_t(d)].first,
                 reinterpret_cast<uint8_t*>(send.data() + sd[size_t(d)]), st.residual.data() + cr[size_t(d)].first);
  // 2. Chunk d of every rank to rank d.
  const int64_t mine = words[size_t(me)];
  Tensor tr = words_tensor(recv, mine * D);
  std::vector<int64_t> rc(static_cast<size_t>(D), mine), rd(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) rd[size_t(d)] = d * mine;
  comm.all_to_allv(tr, rc, rd, ts, words, sd);
  // 3. The owner's fp32 sum, in rank order.
  const auto [lo, hi] = cr[size_t(me)];
  const ChunkLayout& ml = lay[size_t(me)];
  std::vector<float> acc(size_t(hi - lo), 0.0f);
  for (int d = 0; d < D; ++d)
    decode_chunk(l, ml, reinterpret_cast<const uint8_t*>(recv.data() + d * mine), acc.data(), true);
  if (b.reduce_scatter) {
    std::copy(acc.begin(), acc.end(), b.g + lo);
    return;
  }
  // 4. The owner's second encoding, with its own error feedback.
  if (int64_t(st.owner_residual.size()) != hi - lo) st.owner_residual.assign(size_t(hi - lo), 0.0f);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += st.owner_residual[i];
  std::vector<int32_t> mine_enc;
  Tensor tm = words_tensor(mine_enc, mine);
  encode_chunk(l, ml, acc.data(), reinterpret_cast<uint8_t*>(mine_enc.data()), st.owner_residual.data());
  // 5. The all-gather: this rank's encoding to every rank (the same words each time).
  std::vector<int64_t> gc(static_cast<size_t>(D), mine), gd(static_cast<size_t>(D), 0), grd(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) grd[size_t(d)] = d == 0 ? 0 : grd[size_t(d - 1)] + words[size_t(d - 1)];
  std::vector<int32_t> all;
  Tensor ta = words_tensor(all, total);
  comm.all_to_allv(ta, words, grd, tm, gc, gd);
  for (int d = 0; d < D; ++d)
    decode_chunk(l, lay[size_t(d)], reinterpret_cast<const uint8_t*>(all.data() + grd[size_t(d)]),
                 b.g + cr[size_t(d)].first, false);
}

struct Matrix {
  const ParamSpec* p;
  int64_t at, m, k;  // at: offset in the bucket
  int r;
};

void reduce_powersgd(Comm& comm, const BucketView& b, const std::vector<ParamSpec>& table,
                     const Settings& s, BucketCodecState& st) {
  // The compressible 2-D tensors lying wholly in the bucket; everything else goes exact.
  std::vector<Matrix> mats;
  std::vector<std::pair<int64_t, int64_t>> exact;
  int64_t at = 0;
  for (const ParamSpec& p : table) {
    if (!compressible(p, s.min_elems) || p.offset < b.begin || p.offset + p.numel > b.begin + b.n) continue;
    const int64_t m = p.shape[0], k = p.shape[1];
    const int r = int(std::min<int64_t>({int64_t(s.powersgd_rank), m, k}));
    mats.push_back({&p, p.offset - b.begin, m, k, r});
  }
  std::sort(mats.begin(), mats.end(), [](const Matrix& x, const Matrix& y) { return x.at < y.at; });
  int64_t np = 0, nq = 0, ne = 0;
  for (const Matrix& x : mats) {
    if (x.at > at) exact.push_back({at, x.at});
    at = x.at + x.m * x.k;
    np += x.m * x.r;
    nq += x.k * x.r;
  }
  if (at < b.n) exact.push_back({at, b.n});
  for (const auto& [x, y] : exact) ne += y - x;
  if (int64_t(st.residual.size()) != b.n) st.residual.assign(size_t(b.n), 0.0f);
  if (int64_t(st.q.size()) != nq) {
    st.q.assign(size_t(nq), 0.0f);
    int64_t qo = 0;
    for (const Matrix& x : mats) {
      init_q(st.q.data() + qo, x.k, x.r, s.seed, x.p->name);
      qo += x.k * x.r;
    }
  }
  // P = (G + residual) Q for every matrix, then the exact elements: one all-reduce.
  std::vector<float> pbuf(size_t(np + ne));
  int64_t po = 0, qo = 0;
  for (const Matrix& x : mats) {
    float* M = b.g + x.at;
    for (int64_t i = 0; i < x.m * x.k; ++i) M[i] += st.residual[size_t(x.at + i)];
    mat_mq(M, x.m, x.k, st.q.data() + qo, x.r, pbuf.data() + po);
    po += x.m * x.r;
    qo += x.k * x.r;
  }
  for (const auto& [x, y] : exact) {
    std::copy(b.g + x, b.g + y, pbuf.begin() + po);
    po += y - x;
  }
  if (!pbuf.empty()) comm.all_reduce(Tensor(pbuf.data(), DType::F32, {int64_t(pbuf.size())}));
  po = np;
  for (const auto& [x, y] : exact) {
    std::copy(pbuf.begin() + po, pbuf.begin() + po + (y - x), b.g + x);
    po += y - x;
  }
  // Q' = Mᵀ P and this rank's residual M - P Q'ᵀ, then the all-reduce of the Q's.
  std::vector<float> qbuf(static_cast<size_t>(nq));
  po = qo = 0;
  for (const Matrix& x : mats) {
    float* P = pbuf.data() + po;
    orthonormalize(P, x.m, x.r);
    float* M = b.g + x.at;
    float* R = st.residual.data() + x.at;
    mat_mtp(M, x.m, x.k, P, x.r, qbuf.data() + qo);
    std::copy(M, M + x.m * x.k, R);
    mat_pqt(P, qbuf.data() + qo, x.m, x.k, x.r, R, true);
    for (int64_t i = 0; i < x.m * x.k; ++i)
      if (!std::isfinite(R[i])) R[i] = 0.0f;
    po += x.m * x.r;
    qo += x.k * x.r;
  }
  if (!qbuf.empty()) comm.all_reduce(Tensor(qbuf.data(), DType::F32, {nq}));
  po = qo = 0;
  bool finite = true;
  for (const Matrix& x : mats) {
    mat_pqt(pbuf.data() + po, qbuf.data() + qo, x.m, x.k, x.r, b.g + x.at, false);
    po += x.m * x.r;
    qo += x.k * x.r;
  }
  for (float v : qbuf) finite &= std::isfinite(v);
  // Warm start from the reduced Q; a non-finite one (a skipped step) starts afresh.
  if (finite)
    st.q = std::move(qbuf);
  else
    st.q.clear();
}

}  // namespace

void reduce_bucket(Comm& comm, Level l, const BucketView& b, const std::vector<ParamSpec>& table,
                   const Settings& s, BucketCodecState& st) {
  ADGT_CHECK(l != Level::None, "compress::reduce_bucket: level off is the reducer's own path");
  if (comm.size() == 1) return;  // a group of one: the sum is the gradient itself
  if (l == Level::PowerSgd)
    reduce_powersgd(comm, b, table, s, st);
  else
    reduce_quantized(comm, l, b, table, s, st);
}

}  // namespace adgt::compress
